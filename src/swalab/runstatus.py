"""Every state a run or a grid job is in, named once: what ``status.json``, a grid's ``jobs/<n>.json`` and the
report's list of runs say.

When it matters: the trainer writes a state, the report, ``model.init_from`` and a grid's summary read it back.
A :class:`RunStatus` is the string on disk (``StrEnum``), so files of every version read and write the same
words, and a state read from a file compares equal to its member."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    # written to status.json (and a grid job's record) by the process that trains the run
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    PREEMPTED = "preempted"      # a pause signal; the same command continues the run
    INTERRUPTED = "interrupted"  # Ctrl-C
    REQUEUED = "requeued"        # under SLURM: the job comes back and resumes
    CANCELLED = "cancelled"      # under SLURM: the job ended for another reason than its time limit
    # a grid job's record only: the run was finished before, or never started
    SKIPPED = "skipped"
    LOCKED = "locked"
    REFUSED = "refused"
    # read back by the report: what the files say together
    STOPPED = "stopped"          # status.json says running, but no process trains it
    INCOMPLETE = "incomplete"    # status.json says complete, but metrics.json is not there
    DAMAGED = "damaged"          # metrics.json cannot be read
    NONE = "no status"           # no status.json


# States of a run that no process trains any more and that has not finished: its own command continues it.
STOPPED_STATES = frozenset({RunStatus.PREEMPTED, RunStatus.INTERRUPTED, RunStatus.FAILED, RunStatus.REQUEUED,
                            RunStatus.CANCELLED})
# The grid job states that count as done in a grid's summary.
OK_STATES = (RunStatus.COMPLETE, RunStatus.SKIPPED)
