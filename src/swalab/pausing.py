"""Pausing a run on a signal: which signals pause, what a pause is called, how a run says it was paused.

When it matters: a scheduler's preemption or time limit (SIGTERM, SIGUSR1/2 under SLURM or submitit) and Ctrl-C
(SIGINT) all pause a run the same way: the loop (``swalab.trainer``) notes the signal, writes a checkpoint at the
step it is on and raises :class:`Preempted`, whose status goes into status.json and whose exit code run.py exits
with; the same command continues the run. :func:`catching_pause_signals` installs the handlers for the length of a
fit and puts the previous ones back."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

from swalab.runstatus import RunStatus

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"; the SLURM requeue wrapper re-launches on it
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

# The signals that pause a run: each makes the loop write a checkpoint at the step it is on and stop, leaving
# this status in status.json and this exit code for run.py. Ctrl-C is a pause like a preemption. Under SLURM
# swalab.slurm.stop_status names a preemption more exactly (requeued, cancelled).
PAUSE_SIGNALS: dict[int, tuple[RunStatus, int]] = {
    signal.SIGTERM: (RunStatus.PREEMPTED, PREEMPTED_EXIT_CODE),     # scheduler preemption, scancel, scontrol requeue, a time limit
    signal.SIGUSR1: (RunStatus.PREEMPTED, PREEMPTED_EXIT_CODE),     # sbatch --signal=USR1, SUBMITIT_PREEMPT_SIGNAL=USR1
    signal.SIGUSR2: (RunStatus.PREEMPTED, PREEMPTED_EXIT_CODE),     # submitit's default time-limit/preemption signal
    signal.SIGINT: (RunStatus.INTERRUPTED, INTERRUPTED_EXIT_CODE),
}


class Preempted(RuntimeError):
    """A pause signal (``PAUSE_SIGNALS``: SIGTERM, SIGUSR1, SIGUSR2, SIGINT) arrived; a checkpoint was written and
    the same command continues the run.

    ``status`` (what status.json records) and ``exit_code`` start as the signal's entry in ``PAUSE_SIGNALS``;
    ``swalab.train`` refines the status from what SLURM says (``requeued``, ``cancelled``) before recording it.
    The message ends with what happens next, which follows from the status."""

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum  # run.py hands the signal on to a launcher's own handler (submitit)
        self.status, self.exit_code = PAUSE_SIGNALS.get(signum, (RunStatus.PREEMPTED, PREEMPTED_EXIT_CODE))

    def __str__(self) -> str:
        then = ("the job is requeued and resumes from it" if self.status == RunStatus.REQUEUED
                else "re-run the same command to continue")
        return f"{self.args[0]}; {then}"


def signal_words(signum: int | None) -> str:
    """``Ctrl-C (SIGINT)`` or ``SIGTERM``: how a line names the signal that paused a run."""
    if signum is None:
        return "a signal"
    name = signal.Signals(signum).name
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name


@contextlib.contextmanager
def catching_pause_signals(note: Callable[[int], None], enabled: bool = True) -> Iterator[None]:
    """While the block runs, each of ``PAUSE_SIGNALS`` calls ``note(signum)`` instead of its usual handler (the loop
    then pauses at its next step); the previous handlers are restored afterwards. Nothing changes with ``enabled``
    false, or outside the main thread (where Python lets no handler be set)."""
    if not enabled:
        yield
        return
    previous = {}
    try:
        for sig in PAUSE_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, frame: note(signum))
    except ValueError:  # not in the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class PauseFlag:
    """The pause signal a fit has received, if any: :meth:`note` is the handler :func:`catching_pause_signals` calls,
    :meth:`paused` the loop's question at each step and epoch end.

    Under data parallelism the answer is agreed by every rank (``agree``: ``swalab.distributed.agree``): each pauses
    at the same step, under the same signal (the largest number of those received: a preemption's SIGTERM before a
    Ctrl-C). That costs one CPU all-reduce per question, which a single process (``agree`` None) never makes."""

    def __init__(self, agree: Callable[[int, str], int] | None = None):
        self.agree = agree
        self.signum: int | None = None

    def note(self, signum: int) -> None:
        self.signum = signum  # the loop pauses at its next step

    def paused(self) -> bool:
        if self.agree is None:
            return self.signum is not None
        agreed = self.agree(self.signum or 0, "max")
        if agreed:
            self.signum = agreed
        return bool(agreed)
