"""Test-only fault injection: make a run die (or be signalled) at an exact point, on purpose.

The reliability tests (``tests/test_reliability.py``) must kill a training run *mid-epoch*, *while
SWA averages*, *during the BN update* or *while a checkpoint is being written*, and do so at the
same place every time. Sending a signal from outside at a wall-clock moment cannot hit those
points reliably, so the code calls :func:`hit` at each of them and this module decides, from one
environment variable, whether to act:

    SWALAB_FAULT=<point>:<n>[:<signal>]      e.g.  SWALAB_FAULT=train_step:7
                                                   SWALAB_FAULT=checkpoint_write:2:KILL
                                                   SWALAB_FAULT=train_step:5:TERM
    SWALAB_FAULT=<point>:slow:<seconds>[:<file>]  e.g.  SWALAB_FAULT=train_step:slow:0.5:/tmp/slow

At the ``n``-th hit of ``<point>`` in this process, the process sends itself ``<signal>`` (default
``KILL``: no handler, no cleanup, exactly like ``kill -9`` or an out-of-memory kill). ``TERM`` and
``USR1`` exercise the preemption path instead; ``STOP`` freezes the process where it is (holding its
run's lock) until it gets ``SIGCONT``. ``slow`` sleeps ``<seconds>`` at every hit instead, while ``<file>`` exists when one is
named: a run that lasts as long as a test needs in wall-clock time without using the CPU, and computes
exactly what it would without the sleeps (the SLURM time-limit tests, ``tests/test_cluster_requeue.py``,
remove the file once the job was requeued often enough). Points: ``starting`` (``import swalab``: the imports of
``run.py`` or ``python -m swalab.<tool>`` under way, nothing written), ``run_start`` (the run's first line logged, its
tracker not yet made, no step taken), ``train_step`` (after an optimizer step),
``swa_average`` (after SWA folds a model into its average), ``bn_update`` (per batch of a BatchNorm
re-estimation), ``checkpoint_write`` (temp file written, not yet renamed into place), ``final_record`` (``metrics.json``
written, ``status.json`` not yet updated), ``record_commit`` (a record of ``swalab.results.score`` or ``swalab.posthoc``:
the files beside its ``metrics.json`` written, ``metrics.json`` not yet: ``swalab.rundir.write_record``),
``folders_held`` (a command of such records holds its folders, ``scores/`` or ``posthoc/``, and has written nothing
yet: ``swalab.runlock.held_folders``).

Without the variable :func:`hit` is one dictionary lookup and does nothing; never set it outside
tests."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterable, Iterator

ENV = "SWALAB_FAULT"
POINTS = ("starting", "run_start", "train_step", "swa_average", "bn_update", "checkpoint_write", "final_record", "record_commit",
          "folders_held")
_hits: Counter[str] = Counter()


def _plan() -> tuple[str, int, signal.Signals | tuple[float, str]] | None:
    """``(point, n, signal)``, or ``(point, 0, (seconds, file))`` for ``<point>:slow:<seconds>[:<file>]``."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    count, _, sig = rest.partition(":")
    if point in POINTS and count == "slow":
        seconds, _, gate = sig.partition(":")
        try:
            return point, 0, (float(seconds), gate)
        except ValueError:
            pass
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{ENV}={spec!r}: expected <point>:<n>[:<signal>] or <point>:slow:<seconds>[:<file>] with "
                         f"point in {POINTS} and n >= 1")
    return point, int(count), signal.Signals["SIG" + (sig or "KILL").upper().removeprefix("SIG")]


def hit(point: str) -> None:
    """Count one pass through ``point``; at the planned pass, signal this process (or sleep at every pass)."""
    plan = _plan()
    if plan is None or plan[0] != point:
        return
    if plan[1] == 0:
        seconds, gate = plan[2]
        if not gate or os.path.exists(gate):
            time.sleep(seconds)
        return
    _hits[point] += 1
    if _hits[point] == plan[1]:
        os.kill(os.getpid(), plan[2])


def watch(batches: Iterable, point: str) -> Iterable:
    """``batches`` unchanged, with :func:`hit` called before each batch when a fault is planned."""
    plan = _plan()
    if plan is None or plan[0] != point:
        return batches
    return _watched(batches, point)


def _watched(batches: Iterable, point: str) -> Iterator:
    for batch in batches:
        hit(point)
        yield batch


def reset() -> None:
    """Forget the hits counted so far (tests that inject faults in-process call it first)."""
    _hits.clear()
