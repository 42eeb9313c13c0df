"""The lines a person reads while a run trains: one per epoch, in ``<run>/run.log`` and on stdout.

When it matters: a run watched without a terminal (a grid, ``nohup``, SLURM) has no progress bar,
so each epoch ends with one line through :mod:`logging`::

    epoch 3/24  lr 0.05  train loss 0.532 acc 84.1%  test acc 93.1% nll 0.221  3.2s  ETA 1m07s

``python run.py`` prints these lines on stdout (``conf/hydra/job_logging/swalab.yaml``); every
accepted run also writes them, with a time stamp, to its own ``run.log`` (:func:`run_log`), so the
record survives the terminal. A refused run writes no ``run.log``: the file is opened only once the
run has its directory and its lock."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path


LOGGER_NAME = "swalab"
RUN_LOG = "run.log"


def format_seconds(seconds: float) -> str:
    """``75`` -> ``1m15s``, ``3725`` -> ``1h02m``: an ETA that reads at a glance."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_bar(epoch: int, epochs: int, steps: int, initial: int, eta: float | None, show: bool | None):
    """The epoch's progress bar, or None when none is shown: ``show`` false (``run.progress=false``), or None (the
    default) and no terminal. Off a terminal (SLURM, nohup) tqdm hands back a disabled bar, not None; it is closed and
    None returned, so the training step never reads the loss back for a postfix nobody sees."""
    if show is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    left = f" (run ETA {format_seconds(eta)})" if eta is not None else ""
    bar = tqdm(total=steps, initial=initial, desc=f"epoch {epoch + 1}/{epochs}{left}", leave=False,
               disable=None if show is None else not show)
    if bar.disable:
        bar.close()
        return None
    return bar


def get_logger(name: str | None = None) -> logging.Logger:
    """The ``swalab`` logger (or one of its children), whose records reach every run's ``run.log``."""
    return logging.getLogger(LOGGER_NAME if name is None else f"{LOGGER_NAME}.{name}")


@contextlib.contextmanager
def run_log(run_dir: str | Path, main: bool = True) -> Iterator[Path]:
    """Append swalab's log records, and the warnings shown, to ``<run_dir>/run.log`` while the block runs.

    Data-parallel runs log once: only rank 0 (``main``) writes ``run.log``; on the other ranks swalab's logger is
    silent while the block runs (their epoch lines and final table would repeat rank 0's, on the same terminal)."""
    path = Path(run_dir) / RUN_LOG
    if not main:
        logger = get_logger()
        was = logger.disabled
        logger.disabled = True
        try:
            yield path
        finally:
            logger.disabled = was
        return
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.set_name(RUN_LOG)  # found by run_log_only
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = get_logger()
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    shown = warnings.showwarning

    def show_and_keep(message, category, filename, lineno, file=None, line=None):
        """A warning (a corrupt checkpoint skipped, a full disk) still goes to stderr, and into run.log too."""
        shown(message, category, filename, lineno, file, line)
        handler.handle(logger.makeRecord(logger.name, logging.WARNING, filename, lineno,
                                         f"warning: {category.__name__}: {message}", None, None))

    warnings.showwarning = show_and_keep
    try:
        yield path
    finally:
        warnings.showwarning = shown
        logger.removeHandler(handler)
        handler.close()


def run_log_only(line: str) -> None:
    """Write ``line`` to the open ``run.log`` alone, not to the terminal: for a line its caller shows on the
    terminal itself (a pause, which run.py says on stderr as its last line), so that a terminal reads it once."""
    logger = get_logger()
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, line, None, None)
    for handler in logger.handlers:
        if handler.get_name() == RUN_LOG:
            handler.handle(record)


def heartbeat_line(epoch: int, epochs: int, step: int, steps: int, elapsed: float, eta: float) -> str:
    """A line within a long epoch, where no bar is shown (``run.heartbeat_minutes``): ``epoch 3/24  step 120/391
    elapsed 5m00s  ETA 1h02m`` (``epoch`` and ``step`` counted from 1, as the epoch lines count; ``elapsed`` in this
    epoch, ``ETA`` of the run). Made of host values alone: printing it reads nothing from the device."""
    return f"epoch {epoch}/{epochs}  step {step}/{steps}  elapsed {format_seconds(elapsed)}  ETA {format_seconds(eta)}"


def heartbeat(epoch: int, epochs: int, steps: int, first_step: int, minutes: float, mean_epoch_seconds: float | None,
              emit: Callable[[str], None]) -> Callable[[int, float], None] | None:
    """Where no bar is shown (a grid, nohup, SLURM): ``beat(step, epoch_t0)``, called after each step of epoch
    ``epoch`` (from 0), ``emit``s :func:`heartbeat_line` every ``minutes`` (``run.heartbeat_minutes``); None when that is
    0. It reads the host's clock only, never the device: a step with no line due makes no host sync, nor does one
    with a line. The ETA counts this epoch's steps left at its pace so far and the epochs left at
    ``mean_epoch_seconds`` (this epoch's pace before the first epoch ends)."""
    every = 60.0 * float(minutes)
    if every <= 0:
        return None
    began = time.perf_counter()
    due = began + every

    def beat(step: int, epoch_t0: float) -> None:
        nonlocal due
        now = time.perf_counter()
        if now < due:
            return
        due = now + every
        per_step = (now - began) / (step + 1 - first_step)
        epoch_seconds = mean_epoch_seconds or per_step * steps
        eta = per_step * (steps - step - 1) + epoch_seconds * (epochs - epoch - 1)
        emit(heartbeat_line(epoch + 1, epochs, step + 1, steps, now - epoch_t0, eta))

    return beat


def epoch_line(row: dict, epochs: int, eta: float | None) -> str:
    """One history row as a line: epoch, lr, train loss/accuracy, test (or validation) accuracy/NLL, seconds, the
    run's ETA."""
    parts = [f"epoch {row['epoch']}/{epochs}", f"lr {row['lr']:.4g}",
             f"train loss {row['train_loss']:.4f} acc {row['train_acc']:.2f}%"]
    for split in ("test", "val"):  # run.eval_split=val monitors on the validation split
        if f"{split}_acc" in row:
            parts.append(f"{split} acc {row[f'{split}_acc']:.2f}% nll {row[f'{split}_loss']:.4f}")
        for key in sorted(k for k in row if k.endswith(f"_{split}_acc")):  # a method's own model
            parts.append(f"{key.removesuffix(f'_{split}_acc')} {split} acc {row[key]:.2f}%" if split == "val"
                         else f"{key.removesuffix('_test_acc')} acc {row[key]:.2f}%")
    parts.append(f"{row['seconds']:.1f}s")
    if eta is not None and row["epoch"] < epochs:
        parts.append(f"ETA {format_seconds(eta)}")
    return "  ".join(parts)


def mean_epoch_seconds(history: list[dict]) -> float | None:
    """The mean time of the epochs a run's ``history`` rows have trained so far, or None before the first."""
    seconds = [float(row["seconds"]) for row in history if "seconds" in row]
    return statistics.fmean(seconds) if seconds else None


def run_eta(history: list[dict], epochs: int, epoch: int) -> float | None:
    """Seconds left in a run of ``epochs`` at the start of ``epoch``: the mean epoch time so far x epochs left."""
    mean = mean_epoch_seconds(history)
    return None if mean is None else mean * (epochs - epoch)
