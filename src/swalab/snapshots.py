"""Snapshots: the live model's weights written as training goes, for averages chosen after training.

``run.snapshots`` says how often: ``null`` never (the default); an integer N, at the end of every N-th epoch; a
fraction 1/k of an epoch (0.5, 0.25, 0.1), k times per epoch, at steps round(j * steps / k) for j = 1..k, the last at
the epoch's end. A snapshot is ``<run>/snapshots/epochNNNN.pt`` after NNNN whole epochs, ``epochNNNN_stepSSSSSS.pt``
SSSSSS steps into the next (the names of ``swalab.checkpoint``), and holds ``{"epoch", "step", "steps_per_epoch",
"model"}``: the state dict (parameters and buffers) on the CPU, floating tensors in float32, nothing else (no
optimizer, no method state), so a snapshot is the size of the weights. ``python -m swalab.posthoc`` builds averages
from them (SWA windows, LAWA, EMA, soups, WiSE-FT).

Snapshots are written atomically (``swalab.checkpoint.atomic_save``) and named by their place in training, so a
resumed run writes those it had not yet written, and one it writes again (the steps between its last checkpoint
and a kill) replaces the file with the same weights: an exact resume trains them bit for bit again. They change
no result, so ``run.snapshots`` is no part of a run's identity (the ``run`` group).

``run.powerema`` (a list of relative widths sigma_rel, e.g. ``[0.05, 0.10]``) tracks EDM2's power-function EMAs of
the live weights after every optimizer step (``swalab.powerema``) and writes them into every snapshot as
``"powerema": {"t": steps averaged, "sigma_rels": {label: width}, "averages": {label: state dict}}``, from which
``python -m swalab.posthoc --powerema`` rebuilds any other width. They change no trained weight either: no part of the
identity. A checkpoint carries them (:meth:`SnapshotWriter.state_dict`), so a resumed run continues them exactly."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from swalab.checkpoint import CheckpointError, atomic_save, checkpoint_name, read_torch_file
from swalab.config import ConfigError
from swalab.powerema import PowerEMA
from swalab.rundir import RunDir

FOLDER = RunDir.SNAPSHOTS
_NAME = re.compile(r"^epoch(\d+)(?:_step(\d+))?\.pt$")


def per_epoch(snapshots: int | float | None) -> tuple[int, int]:
    """``(every, k)``: a snapshot every ``every`` epochs, ``k`` per epoch it writes in; ``(0, 0)`` for none. The one
    check of ``run.snapshots``."""
    if snapshots is None or snapshots is False:
        return 0, 0
    fix = "use null (none), an integer N (every N epochs) or a fraction 1/k of an epoch (0.5, 0.25, 0.1)"
    if isinstance(snapshots, bool) or not isinstance(snapshots, (int, float)) or not snapshots > 0:
        raise ConfigError(f"run.snapshots={snapshots!r} is not a number of epochs: {fix}")
    if float(snapshots).is_integer():
        return int(snapshots), 1
    k = 1 / snapshots
    if snapshots > 1 or not math.isclose(k, round(k), rel_tol=1e-6):
        raise ConfigError(f"run.snapshots={snapshots!r} is neither a whole number of epochs nor 1/k of one: {fix}")
    return 1, round(k)


def fp32_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict on the CPU, contiguous, floating tensors in float32 (integers as they are)."""
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach().to("cpu")
        out[key] = (t.float() if t.is_floating_point() else t).contiguous().clone()
    return out


@dataclass
class SnapshotWriter:
    """Writes the snapshots ``run.snapshots`` asks for (module doc) into ``<run_dir>/snapshots``; the trainer calls
    :meth:`after_step` after each optimizer step and :meth:`after_epoch` after each epoch's method hook."""

    run_dir: Path
    snapshots: int | float | None = None
    write: bool = True  # False on every rank but the one that writes
    powerema: tuple[float, ...] = ()  # widths of the power-function EMAs tracked and written with each snapshot

    def __post_init__(self):
        self.every, self.k = per_epoch(self.snapshots)
        self.dir = Path(self.run_dir) / FOLDER
        self.power = PowerEMA(tuple(self.powerema)) if self.powerema else None
        if self.power is not None and not self.every:
            raise ConfigError(f"run.powerema={list(self.power.sigma_rels)} is written only into snapshots, and "
                              "run.snapshots is null: set run.snapshots (e.g. 1: every epoch) or drop run.powerema")

    def _save(self, model: nn.Module, epoch: int, step: int, steps: int) -> None:
        if self.write:
            snapshot = {"epoch": epoch, "step": step, "steps_per_epoch": steps, "model": fp32_weights(model)}
            if self.power is not None:
                snapshot["powerema"] = {"t": self.power.t, "sigma_rels": dict(zip(self.power.gammas,
                                                                                 self.power.sigma_rels)),
                                        "averages": self.power.weights(model)}
            atomic_save(snapshot, self.dir / checkpoint_name(epoch, step))

    def state_dict(self) -> dict | None:
        """What a checkpoint keeps of this writer: the power EMAs' state, or None without them."""
        return None if self.power is None else self.power.state_dict()

    def load_state_dict(self, state: dict | None, device: torch.device | str, resumed_at: str) -> None:
        """Continue the power EMAs of a checkpoint (``resumed_at``: its place, for the refusal of one without)."""
        if self.power is None:
            return
        if state is None:
            raise ConfigError(f"run.powerema={list(self.power.sigma_rels)}: the checkpoint it resumes from "
                              f"({resumed_at}) tracked no power EMA, so the averages since step 1 cannot be had; drop "
                              "run.powerema for this run, or train a new one with it from the start")
        self.power.load_state_dict(state, device)

    def after_step(self, model: nn.Module, epoch: int, step: int, steps: int) -> None:
        """Step ``step`` (from 0) of epoch ``epoch`` (from 0) is done: the power EMAs move, and a mid-epoch
        snapshot is written when one falls here."""
        if self.power is not None:
            self.power.update(model)
        if self.k <= 1 or step + 1 >= steps:
            return
        if any(step + 1 == round(j * steps / self.k) for j in range(1, self.k)):
            self._save(model, epoch, step + 1, steps)

    def after_epoch(self, model: nn.Module, done: int, steps: int) -> None:
        """``done`` epochs are done: a snapshot at every ``every``-th epoch end."""
        if self.every and done % self.every == 0:
            self._save(model, done, 0, steps)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file: after ``epoch`` whole epochs and ``step`` steps of the next."""

    epoch: int
    step: int
    path: Path

    def position(self, steps_per_epoch: int) -> float:
        """Its place in training, in epochs (2.5: half way through epoch 3)."""
        return self.epoch + (self.step / steps_per_epoch if self.step else 0.0)

    def read(self, mmap: bool = False) -> dict:
        """The file's contents, or ``CheckpointError`` in one line: a snapshot is written whole, so one that cannot
        be read was damaged since (a copy cut short, a full disk), and the line says how to average without it."""
        try:
            return read_torch_file(self.path, weights_only=True, mmap=mmap)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; the snapshot was damaged after it was written (a copy cut short, a full "
                                  f"disk): move it out of {self.path.parent} to average the other snapshots without "
                                  "it") from None

    def weights(self) -> dict[str, torch.Tensor]:
        """Its weights, or ``CheckpointError`` in one line naming a tensor that holds NaN or Inf: every average of
        them would be NaN throughout."""
        state = self.read()["model"]
        bad = next((k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
        if bad is not None:
            raise CheckpointError(f"{self.path}: {bad} holds NaN or Inf weights: move it out of {self.path.parent} "
                                  "to average the other snapshots without it")
        return state

    def steps_per_epoch(self) -> int:
        return int(self.read()["steps_per_epoch"])


def snapshots_of(run_dir: str | Path) -> list[Snapshot]:
    """The run's snapshots in training order (none when it wrote none)."""
    folder = Path(run_dir) / FOLDER
    found = [Snapshot(int(m.group(1)), int(m.group(2) or 0), p)
             for p in (folder.iterdir() if folder.is_dir() else ()) if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda s: (s.epoch, s.step))
