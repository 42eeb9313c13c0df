"""How swalab's SLURM launcher (``hydra_plugins.swalab_slurm``, ``hydra/launcher=slurm``) follows its jobs.

submitit follows its jobs with ``sacct``. Many small clusters run without SLURM's accounting database
(``AccountingStorageType=accounting_storage/none``): there ``sacct`` fails at every poll and each failure
prints three warnings. On such a cluster :func:`watch_jobs` has submitit follow the jobs with ``squeue``
instead (:class:`SqueueWatcher`), which needs no database; jobs that have left the queue count as
finished, and submitit then reads their results as usual. Where accounting is on, nothing changes.
Requires the optional dependency ``hydra-submitit-launcher`` (``pip install -e .[slurm]``)."""

from __future__ import annotations

import contextlib
import getpass
import subprocess

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

GONE = "FINISHED"  # the state given to a job that left the queue (squeue knows no final states past MinJobAge)


def accounting_enabled() -> bool:
    """Whether this cluster keeps job accounting (``sacct`` works): ``scontrol show config`` says so. When
    ``scontrol`` does not answer, assume it does (submitit's default behaviour)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() != "accounting_storage/none"
    return True


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's job watcher, reading ``squeue`` (this user's jobs, one array element per line) instead of
    ``sacct``. A job absent from the queue has finished (state ``FINISHED``)."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        return ["squeue", "--array", "--noheader", "--user", getpass.getuser(), "--format", "%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        found = super().read_info("JobID|State|NodeList\n" + text)
        for job in self._registered - self._finished:
            if job not in found:
                found[job] = {"JobID": job, "State": GONE, "NodeList": ""}
        return found


@contextlib.contextmanager
def watch_jobs():
    """For the duration of the block, submitit follows SLURM jobs with :class:`SqueueWatcher` when the cluster
    keeps no accounting, and with its own ``sacct`` watcher otherwise."""
    if accounting_enabled():
        yield
        return
    previous = SlurmJob.watcher
    SlurmJob.watcher = SqueueWatcher(delay_s=previous._delay_s)
    try:
        yield
    finally:
        SlurmJob.watcher = previous
