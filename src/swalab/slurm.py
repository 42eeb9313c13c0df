"""What SLURM says about the job this process runs in (docs/cluster.md).

Three questions come up inside a job, and each is answered here, from SLURM's own environment variables
and ``scontrol``, never from guesses:

* **Why did a stop signal come?** SIGTERM means ``scancel``, ``scontrol requeue``, a preemption or the
  time limit alike. :func:`stop_status` tells them apart by asking ``scontrol show job``: a restart count
  above the one this process started with means the job is requeued (``requeued``); an ending job whose
  reason is not its time limit was cancelled (``cancelled``); anything else stays the signal's own status
  (``preempted``, ``swalab.pausing.PAUSE_SIGNALS``). A signal that submitit's handler will answer with a
  requeue (its time-limit/preemption signal, USR2 or ``SUBMITIT_PREEMPT_SIGNAL``) is ``requeued`` too.
* **Which process is which?** :func:`task_env` reads an ``srun`` task's rank, task count, local rank and
  node list (``swalab.distributed.init_distributed`` joins the process group from it).
* **Where is rank 0?** :func:`first_host` expands a node list (``node[01-04]``) with ``scontrol``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from swalab.runstatus import RunStatus

SCONTROL_TIMEOUT_S = 20


def job_id(env: Mapping[str, str] = os.environ) -> str | None:
    """The SLURM job id of this process (an array element has its own), or None outside SLURM."""
    return env.get("SLURM_JOB_ID") or None


def job_record(job: str) -> dict[str, str]:
    """``scontrol show job -o <job>`` as ``{key: value}``; empty when SLURM does not answer."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    record = {}
    for token in out.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in record:
            record[key] = value
    return record


def requeued_by_launcher(signum: int) -> bool:
    """Whether the handler installed for ``signum`` is submitit's, which checkpoints the Hydra job and requeues
    it (``SignalHandler.checkpoint_and_try_requeue``; it does so from global rank 0 only)."""
    handler = signal.getsignal(signum)
    owner = getattr(handler, "__self__", None)
    return (getattr(handler, "__name__", "") == "checkpoint_and_try_requeue"
            and type(owner).__module__.startswith("submitit."))


def stop_status(signum: int | None, default: str, env: Mapping[str, str] = os.environ,
                record: Mapping[str, str] | None = None) -> str:
    """The state a run stopped by ``signum`` records: ``requeued``, ``cancelled``, or ``default``.

    ``record`` is the job's ``scontrol show job`` record (read when not given)."""
    if signum is not None and requeued_by_launcher(signum):
        return RunStatus.REQUEUED
    job = job_id(env)
    if job is None:
        return default
    record = job_record(job) if record is None else record
    if not record:
        return default
    try:
        restarts = int(record.get("Restarts", "0"))
        started_with = int(env.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return default
    if restarts > started_with:  # scontrol requeue, or a preemption with PreemptMode=REQUEUE
        return RunStatus.REQUEUED
    state, reason = record.get("JobState", ""), record.get("Reason", "")
    ending = state == "CANCELLED" or (state == "COMPLETING" and record.get("EndTime", "Unknown") != "Unknown")
    if ending and reason != "TimeLimit":
        return RunStatus.CANCELLED
    return default


@dataclass(frozen=True)
class TaskEnv:
    """One process of a data-parallel job: its rank, the number of processes, its rank on its node, and
    where rank 0 listens (``master_addr:master_port``)."""

    rank: int
    world_size: int
    local_rank: int
    nodelist: str
    master_port: int
    preset_addr: str | None = None

    @property
    def master_addr(self) -> str:
        """``MASTER_ADDR`` when set, else the first node of the step (asked of ``scontrol`` only when needed)."""
        return self.preset_addr or first_host(self.nodelist)


def task_env(env: Mapping[str, str] = os.environ) -> TaskEnv | None:
    """The task of an ``srun`` step of several tasks (``SLURM_STEP_NUM_TASKS > 1``), else None.

    Only a job *step* counts: a batch script also sees ``SLURM_NTASKS`` but runs once, and would wait for
    ranks that never start. The rules are submitit's (``TorchDistributedEnvironment``): rank
    ``SLURM_PROCID``, local rank ``SLURM_LOCALID``, rank 0 on the first node of the step's node list, and
    ``MASTER_PORT`` when set, else a port in [20000, 60000] drawn from the job id (the same in every task)."""
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or 1)
    if tasks <= 1 or "SLURM_PROCID" not in env:
        return None
    port = int(env.get("MASTER_PORT") or random.Random(env.get("SLURM_JOB_ID", "0")).randint(20000, 60000))
    return TaskEnv(rank=int(env["SLURM_PROCID"]), world_size=tasks, local_rank=int(env.get("SLURM_LOCALID") or 0),
                   nodelist=env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "",
                   master_port=port, preset_addr=env.get("MASTER_ADDR") or None)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04],gpu7`` -> ``node01``), expanded by ``scontrol``."""
    if not nodelist:
        return "127.0.0.1"
    if "[" not in nodelist:
        return nodelist.split(",")[0]
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        raise RuntimeError(f"cannot expand the SLURM node list {nodelist!r} with 'scontrol show hostnames' ({exc}); "
                           "set MASTER_ADDR to the first node's address") from exc
