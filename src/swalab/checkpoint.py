"""Checkpoints that survive kills: atomic writes, the last two kept, corrupt files detected.

:class:`CheckpointStore` owns a run's ``checkpoints/`` folder: the names (``epochNNNN.pt``,
``epochNNNN_stepSSSSSS.pt`` mid-epoch), the newest ``keep`` kept, epochs kept for good in ``saved/``
(``run.save_at``, for branching), and finding the checkpoint of an epoch. Nothing else spells a
checkpoint's path.

A checkpoint is written to a temporary file in the same directory, flushed to disk and renamed
over its final name (``os.replace`` is atomic on POSIX), so a run killed mid-write leaves the
previous checkpoint intact. The newest ``keep`` checkpoints are kept; when the newest cannot be
read (truncated by a full disk, say) the one before it is used, with a warning saying so.

Every checkpoint carries the run's identity (``swalab.identity``: the resolved config minus what
cannot change results): resuming from a checkpoint of another config is refused, naming the keys
that differ, never silently ignored.

A checkpoint holds weights and state, not test-set predictions a method cached on the way (an FGE member's,
the SWA average's at a budget mark: 200 MB each on ImageNet). Those are written once, when computed, to
files of their own (:class:`PredictionFiles`, ``checkpoints/predictions/``) that checkpoints name; before,
every epoch's checkpoint carried all of them again."""

from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from swalab import faults
from swalab.rundir import RunDir, atomic_write, first_line

FORMAT = "swalab-checkpoint"
VERSION = 1
_NAME = re.compile(r"^epoch(\d+)(?:_step(\d+))?\.pt$")
_PREDICTION_NAME = re.compile(r"^[A-Za-z0-9_.@+-]+$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: corrupt, from another run, or of another format."""


def _os_error_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (itself or a cause): torch's zip writer reports a full disk as a
    ``RuntimeError`` ("enforce fail at inline_container.cc") whose context holds the real ``OSError``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` to a temp file beside ``path``, fsync, then rename over ``path``.

    Any failure to write (a full disk, a quota, a read-only file system) raises ``OSError`` with one
    line naming the file and the cause; the file it would have replaced is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f) -> None:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
        faults.hit("checkpoint_write")  # test-only: a kill here leaves the temp file, not a torn checkpoint

    try:
        return atomic_write(path, write)
    except (OSError, RuntimeError) as exc:
        cause = _os_error_in(exc)
        if cause is None:
            raise
        # full disk, quota, I/O error: the file it would have replaced is untouched
        raise OSError(cause.errno, f"cannot write {path} ({cause.strerror or cause}); nothing was replaced, so the "
                                   f"earlier files in {path.parent} are intact. Free space (or point "
                                   "paths.output_dir elsewhere) and re-launch the same command to continue") from None


PREDICTIONS_MAX = 5_000_000  # numbers per predictor (test images x classes) kept in predictions.pt


def save_predictions(log_probs: dict[str, torch.Tensor], labels: torch.Tensor, path: str | Path) -> None:
    """``predictions.pt``: each predictor's test probabilities and log-probabilities (float16) and the labels, for
    analyses that need no weights (the report's section 3.5 diagnostics, its ensembles of seeds). Training, a
    post-hoc average and a score on other data write it alike. The log-probabilities keep a small probability that
    float16 would round to 0 (an ensemble of seeds takes its NLL from them). Left out above ``PREDICTIONS_MAX``
    numbers per predictor (ImageNet's 50,000 x 1,000 would be 100 MB a predictor)."""
    kept = {name: p.float() for name, p in log_probs.items() if p.numel() <= PREDICTIONS_MAX}
    if kept:
        atomic_save({"probs": {name: p.exp().half() for name, p in kept.items()},
                     "log_probs": {name: p.half() for name, p in kept.items()}, "labels": labels}, path)


def checkpoint_paths(directory: str | Path) -> list[Path]:
    """Checkpoints in ``directory`` (``epochNNNN.pt``, ``epochNNNN_stepSSSSSS.pt``), newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [((int(m.group(1)), int(m.group(2) or 0)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """``epochNNNN.pt`` after ``epoch`` whole epochs; ``epochNNNN_stepSSSSSS.pt`` ``step`` steps into the next."""
    return f"epoch{epoch:04d}.pt" if step == 0 else f"epoch{epoch:04d}_step{step:06d}.pt"


def checkpoint_words(epoch: int, step: int = 0) -> str:
    """How every message describes the checkpoint :func:`checkpoint_name` names, in the name's own epochs and the
    epoch lines' count (from 1): ``after epoch 14`` for ``epoch0014.pt``, ``after epoch 14 and 2 steps of epoch 15``
    for ``epoch0014_step000002.pt``."""
    return f"after epoch {epoch}" if step == 0 else f"after epoch {epoch} and {step} steps of epoch {epoch + 1}"


def save_checkpoint(state: dict, directory: str | Path, epoch: int, step: int = 0, keep: int = 2) -> Path:
    """Write ``state`` atomically and delete all but the newest ``keep`` checkpoints.

    The name is ``epochNNNN.pt`` at an epoch boundary and ``epochNNNN_stepSSSSSS.pt`` for a
    checkpoint written ``step`` steps into the next epoch (preemption)."""
    state = {"format": FORMAT, "version": VERSION, **state}
    path = atomic_save(state, Path(directory) / checkpoint_name(epoch, step))
    for old in checkpoint_paths(directory)[keep:]:
        old.unlink(missing_ok=True)
    for stale in Path(directory).glob("epoch*.pt.*.tmp"):  # left by a run killed mid-write; one writer per run
        stale.unlink(missing_ok=True)
    return path


def read_torch_file(path: str | Path, name: str | None = None, weights_only: bool = False, mmap: bool = False) -> Any:
    """``torch.load`` of a weights file (a run's ``final.pt``, an FGE member, a snapshot, a file a user names) on the
    CPU. A file that cannot be read (cut short by a full disk or a copy, not torch's) raises ``CheckpointError`` in
    one line naming it as the user named it (``name``: ``model.init_from=...``; default: its path)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except Exception as exc:  # truncated zip, wrong pickle, disk error...
        raise CheckpointError(f"{name or path}: cannot read it ({first_line(exc)})") from exc


def read_checkpoint(path: str | Path) -> dict:
    """Load one checkpoint file, raising ``CheckpointError`` with the reason when it is unusable."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated zip, wrong pickle, disk error...
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a swalab checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {state.get('version')}, this swalab reads {VERSION}")
    return state


def damaged_says_what_to_do(read: Callable[[Path], Any], path: Path, spec: str, instead: str):
    """``read(path)``; a file that cannot be read (cut short by a kill, a full disk or a copy) refused in one line
    naming the spec, the file and what to do ``instead``."""
    try:
        return read(path)
    except CheckpointError as exc:
        cause = exc.__cause__
        if cause is None:  # read, but not what it should hold (another format or version): said as it is
            raise CheckpointError(f"{spec}: {exc}") from None
        raise CheckpointError(f"{spec}: {path} is damaged ({first_line(cause)}); {instead}") from None


def load_latest(directory: str | Path, identity: dict | None = None) -> dict | None:
    """The newest readable checkpoint in ``directory`` (None if there is none).

    Unreadable checkpoints are skipped with a warning naming them; a readable one written by a run
    of another ``identity`` is refused with ``CheckpointError``."""
    for path in checkpoint_paths(directory):
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"{exc}; falling back to the previous checkpoint", RuntimeWarning, stacklevel=2)
            continue
        check_identity(state, identity, path)
        state["path"] = str(path)
        return state
    if checkpoint_paths(directory):
        raise CheckpointError(f"no readable checkpoint in {directory}: every one is corrupt. Move the directory "
                              "away to start the run afresh.")
    return None


def check_identity(state: dict, identity: dict | None, path: str | Path) -> None:
    """Refuse a checkpoint written by a run of another config, naming the keys that differ."""
    from swalab.identity import differences

    if identity is None:
        return
    theirs = state.get("identity")
    if theirs is None:
        raise CheckpointError(f"checkpoint {path} carries no run identity (written by an older swalab): move the "
                              "run directory away to start the run afresh")
    diffs = differences(identity, theirs)
    if diffs:
        raise CheckpointError(f"checkpoint {path} belongs to a run of another config (" + "; ".join(diffs[:8]) +
                              "). Choose another directory with run.dir=<dir>, or move this one away.")


class CheckpointStore:
    """A run's ``checkpoints/`` folder (see the module doc): where to write, what is kept, what to find."""

    SAVED = "saved"

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.dir = Path(run_dir) / RunDir.CHECKPOINTS
        self.keep = keep

    def paths(self) -> list[Path]:
        """The rolling checkpoints, newest first."""
        return checkpoint_paths(self.dir)

    def save(self, state: dict, epoch: int, step: int = 0) -> Path:
        return save_checkpoint(state, self.dir, epoch, step, keep=self.keep)

    def kept_words(self) -> str:
        """What a run stopped by a non-finite loss keeps to continue from: its newest checkpoint, or none yet."""
        newest = self.paths()[:1]
        if newest:
            return f"the last good checkpoint {newest[0]} and history.jsonl are kept"
        return f"no checkpoint had been written yet in {self.dir}, so a re-run starts from the beginning"

    def keep_for_good(self, epoch: int) -> Path:
        """Hard-link (or copy) the checkpoint of ``epoch`` into ``saved/``, where the rolling deletion never reaches."""
        import shutil

        src = self.dir / checkpoint_name(epoch)
        dst = self.dir / self.SAVED / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            dst.unlink(missing_ok=True)
            dst.hardlink_to(src)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    def find(self, epoch: int) -> Path | None:
        """The checkpoint after ``epoch`` whole epochs: ``saved/`` first, then the rolling ones."""
        name = checkpoint_name(epoch)
        return next((p for p in (self.dir / self.SAVED / name, self.dir / name) if p.exists()), None)

    def kept(self) -> list[tuple[int, Path]]:
        """``(epoch, path)`` of every epoch-boundary checkpoint the run kept, rolling and saved, by epoch."""
        found = {}
        for path in [*self.dir.glob("epoch*.pt"), *(self.dir / self.SAVED).glob("epoch*.pt")]:
            match = _NAME.match(path.name)
            if match and not match.group(2):
                found.setdefault(int(match.group(1)), path)
        return sorted(found.items())

    def latest(self, identity: dict | None = None) -> dict | None:
        """The newest readable checkpoint (see :func:`load_latest`)."""
        return load_latest(self.dir, identity)

    def release_resume_state(self) -> list[Path]:
        """Delete what only a resume reads, once the run has finished, and return what was deleted: the rolling
        checkpoints (``final.pt`` holds the finished weights; a finished run is skipped, never resumed) and the
        predictions their method states name (``checkpoints/predictions/``: ``predictions.pt`` holds the final ones).
        The branch points of ``run.save_at`` in ``saved/`` stay (rows branch from them; each is a link of its own).

        When: only after every final record is durable (``swalab.train.records.make_durable``), so that a kill
        before then still finds a checkpoint to score the run from. Deleting twice is harmless."""
        import shutil

        removed = self.paths()
        for path in removed:
            path.unlink(missing_ok=True)
        predictions = self.dir / PredictionFiles.DIR
        if predictions.is_dir():
            removed.append(predictions)
            shutil.rmtree(predictions, ignore_errors=True)
        return removed


class PredictionFiles:
    """Test-set predictions a method computed during training, one file each in ``checkpoints/predictions/``.

    When to use it: a method that keeps what it scored (FGE's members, SWA's average at a budget mark) saves each
    prediction here once, when it is computed, and puts only its name in its ``state_dict``; a resume reads it back
    by name (:meth:`load`). Checkpoints then stay the size of the weights and are cheap to write every epoch.
    A prediction recomputed after a resume from an earlier checkpoint is written again under the same name, with the
    same values (the run is exact). Only the process that writes (``write``: rank 0) writes; every rank reads."""

    DIR = "predictions"

    def __init__(self, run_dir: str | Path, write: bool = True):
        self.dir = Path(run_dir) / RunDir.CHECKPOINTS / self.DIR
        self.write = write

    def path(self, name: str) -> Path:
        if not _PREDICTION_NAME.match(name):
            raise ValueError(f"prediction name {name!r}: use letters, digits and _ . @ + - only")
        return self.dir / f"{name}.pt"

    def save(self, name: str, predictions: torch.Tensor) -> str:
        """Write ``predictions`` under ``name`` (atomically, on the writing rank) and return the name."""
        path = self.path(name)
        if self.write:
            atomic_save(predictions.detach().cpu(), path)
        return name

    def load(self, name: str) -> torch.Tensor:
        path = self.path(name)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: the checkpoint names it as a prediction this run computed "
                                  "earlier, and the run cannot resume without it. Move the run directory away to "
                                  "start the run afresh") from None
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
            raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc


# -- the generators' states a checkpoint holds ----------------------------------------------------------------
def rng_state(device: torch.device) -> dict:
    """This process's generator states: torch's CPU generator, Python's, numpy's, and the training GPU's (only that
    one: a list of every visible GPU's, as ``get_rng_state_all`` gives, would be restored by index on another
    machine, or onto the wrong GPU under data parallelism)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["device"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` saved. A checkpoint of an earlier swalab holds every visible GPU's state
    (``cuda``): the training GPU's is taken from it when that GPU was among them."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if device.type != "cuda":
        return
    if "device" in state:
        torch.cuda.set_rng_state(state["device"], device)
    elif "cuda" in state:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index < len(state["cuda"]):
            torch.cuda.set_rng_state(state["cuda"][index], device)


def rank_rng_state(state: dict, rank: int, world_size: int) -> dict | None:
    """The generator states of ``rank`` in a checkpoint: its own entry of ``rng_ranks`` (every rank's, written by
    rank 0), or, in a checkpoint of one process or of an earlier swalab, ``rng`` (whose ranks all drew one
    stream). None for a rank the checkpoint has no state of (resumed by more ranks than wrote it): it keeps the
    stream it was seeded with, and the resume is not exact (it could not be with another number of ranks)."""
    ranks = state.get("rng_ranks")
    if ranks is None:
        return state["rng"]
    if rank < len(ranks):
        return ranks[rank]
    return None


def restore_rng(state: dict, rank: int, world_size: int, device: torch.device, warn: bool = True) -> None:
    """Put back the generator states ``rank`` had when ``state`` (a checkpoint) was written (:func:`rank_rng_state`);
    a rank it holds none of keeps its fresh stream, which ``warn`` says (the resume is then not exact)."""
    rng = rank_rng_state(state, rank, world_size)
    if rng is not None:
        set_rng_state(rng, device)
    elif warn:
        warnings.warn(f"{state.get('path', 'the checkpoint')} holds the generator states of {len(state['rng_ranks'])} "
                      f"ranks and {world_size} resume it: the ranks beyond keep their fresh streams, so this resume is "
                      "not exact", RuntimeWarning)

