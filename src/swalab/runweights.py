"""A run's weights as a weight spec names them (:class:`swalab.rundir.WeightSpec`): its final weights, a kept
checkpoint, or a weights file.

When it matters: ``model.init_from`` starts a run from them, and post-hoc averaging, the analyses and the report read
them; all through here, so that a run still training is never taken for its end and every reader refuses the same
things in the same words."""

from __future__ import annotations

from pathlib import Path

import torch

from swalab.checkpoint import (CheckpointError, CheckpointStore, damaged_says_what_to_do, read_checkpoint,
                               read_torch_file)
from swalab.config import ConfigError
from swalab.runlock import gone_holder
from swalab.runstatus import STOPPED_STATES, RunStatus
from swalab.rundir import DamagedRecord, RunDir, WeightSpec


def unfinished(run_dir: Path, epoch_pick: bool = True) -> str | None:
    """Why ``run_dir`` cannot stand for its final weights, or None when it has finished: a run still training
    (or stopped) has only intermediate checkpoints, which are never taken for its end without an explicit
    ``@<epoch>``. ``epoch_pick``: whether the caller takes ``<run dir>@<epoch>`` (``model.init_from`` does; compare,
    which scores a run's own predictors, does not), and so whether the message offers it."""
    try:
        if RunDir(run_dir).final_metrics() is not None:
            return None
    except DamagedRecord as exc:
        return f"{exc}; re-run its command to score it again"
    kept = CheckpointStore(run_dir).kept()
    newest = kept[-1][0] if kept else None
    trainer = (RunDir(run_dir).config() or {}).get("trainer", {})
    epochs = trainer.get("epochs") if isinstance(trainer, dict) else None
    where = f"its newest kept checkpoint is epoch {newest}" if newest is not None else "it has no checkpoint yet"
    total = f" of {epochs}" if epochs is not None and newest is not None else ""
    pick = f"name an epoch explicitly (<run dir>@{newest}) or " if newest is not None and epoch_pick else ""
    status = RunDir(run_dir).status()
    if status == RunStatus.RUNNING and gone_holder(run_dir) is not None:
        why = "no process trains it"
    elif status in STOPPED_STATES:
        why = f"it stopped: {status}"
    elif status == RunStatus.COMPLETE:  # metrics.json removed since: its command trains the run again
        why = "status.json says complete, but metrics.json is not there"
    else:  # training now, or as far as can be told from here
        return f"{run_dir} has not finished ({where}{total}): {pick}wait for it to finish"
    return f"{run_dir} has not finished ({where}{total}; {why}): {pick}re-run its own command to finish it"


def final_weights(run_dir: Path, name: str = "live", method: str = "") -> dict[str, torch.Tensor]:
    """A state dict of the finished run in ``run_dir`` from ``final.pt``: ``live`` (or ``sgd``: the last iterate) or
    a method's own weights (``swa``, ``ema``); ``method``: the run's, for the refusal. A run that has not finished has
    no final weights: its checkpoints are read by epoch (``<run dir>@<epoch>``), never taken for its end."""
    why = unfinished(run_dir)
    if why is not None:
        raise FileNotFoundError(why)
    final = Path(run_dir) / RunDir.FINAL
    if not final.exists():
        raise FileNotFoundError(f"{run_dir} has finished but holds no {RunDir.FINAL}: re-score it by moving its "
                                "metrics.json away and re-running its command")
    try:
        state = read_torch_file(final)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}: restore it from a copy of the run, or move its metrics.json away and re-run its "
                              "command to train it again") from None
    if name in ("live", "sgd", "model"):
        return state["model"]
    methods = state.get("methods") or {}
    if name not in methods:
        raise ConfigError(f"{run_dir}: {RunDir.FINAL} of this {method + ' ' if method else ''}run holds weights of "
                          f"{sorted(methods)} besides the live model, not {name!r}: name a run of method {name} "
                          "(or these weights as <run dir>, <run dir>@<epoch> or a .pt file)")
    return methods[name]


def load_init_weights(spec: str, key: str = "model.init_from=") -> tuple[dict, dict]:
    """Weights to start from: ``<run dir>`` (a finished run's last weights: its ``final.pt``), ``<run dir>@<epoch>`` (that epoch's
    checkpoint, finished or not), a swalab checkpoint, or a plain state dict file.

    Returns the state dict and a lineage record naming where it came from. Errors name the spec as ``key`` + spec."""
    weights = WeightSpec.parse(spec)
    path, epoch = weights.path, weights.epoch
    if weights.name:
        raise ConfigError(f"{key}{spec}: ':{weights.name}' is not read here; give the run directory (its last "
                          "weights), <run dir>@<epoch> or a weights file")
    if path.is_dir():
        store = CheckpointStore(path)
        if epoch is not None:
            found = store.find(epoch)
            if found is None:
                raise FileNotFoundError(f"{key}{spec}: no checkpoint of epoch {epoch} in {store.dir} "
                                        f"(a run keeps it with run.save_at=[{epoch}]: train that run again with it "
                                        "in a directory of its own, run.dir=<dir>; its own command skips it once "
                                        "finished)")
            state = damaged_says_what_to_do(read_checkpoint, found, f"{key}{spec}",
                                            f"start from another epoch kept in {store.dir}, or train that run again")
        else:
            why = unfinished(path)
            if why is not None:
                raise FileNotFoundError(f"{key}{spec}: {why}")
            final = path / RunDir.FINAL  # a finished run keeps no resume checkpoint (run.keep_finished_checkpoints)
            if final.is_file():
                state = damaged_says_what_to_do(read_torch_file, final, f"{key}{spec}",
                                                "start from <run dir>@<epoch> of a checkpoint it kept, or train that run "
                                                "again (move it away and re-launch its command)")
                return state["model"], {"parent": str(path), "checkpoint": str(final), "epoch": state["epoch"]}
            state = store.latest()
            if state is None:
                raise FileNotFoundError(f"{key}{spec}: {store.dir} holds no checkpoint")
            found = Path(state["path"])
        return state["model"], {"parent": str(path), "checkpoint": str(found), "epoch": state["epoch"]}
    if not path.exists():
        raise FileNotFoundError(f"{key}{spec}: no such file or run directory")
    state = read_torch_file(path, f"{key}{spec}")
    if isinstance(state, dict) and state.get("format") == "swalab-checkpoint":
        return state["model"], {"parent": str(path.parent.parent), "checkpoint": str(path), "epoch": state["epoch"]}
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    return state, {"parent": None, "checkpoint": str(path), "epoch": None}


def run_of(spec: str) -> Path | None:
    """The run directory a weight spec points into, if any (to find the config and data)."""
    path = WeightSpec.parse(spec).path
    if path.is_dir():
        return path
    for parent in path.parents:  # <run>/final.pt, <run>/checkpoints/[saved/]epochNNNN.pt
        if (parent / RunDir.CONFIG).exists():
            return parent
    return None


def load_weights(spec: str) -> dict[str, torch.Tensor]:
    """The state dict a weight spec names:

    * ``<run dir>`` or ``<run dir>:sgd``: the live weights at the end of the run (for a SWA run, the last SGD
      iterate); ``<run dir>:swa`` (or ``:ema``): a method's own weights;
    * ``<run dir>@<epoch>``: a checkpoint kept with ``run.save_at`` (or one of the newest two);
    * a ``.pt`` file: a swalab checkpoint, a ``final.pt`` (live weights) or a plain state dict."""
    weights = WeightSpec.parse(spec)
    if weights.path.is_dir() and weights.epoch is None:
        return final_weights(weights.path, weights.name or "live")
    if weights.name:
        head = str(spec)[:-len(weights.name) - 1]
        raise ConfigError(f"{spec}: ':{weights.name}' only applies to a run directory; name the run directory "
                          f"holding {head}, as <run dir>:{weights.name}")
    state, _ = load_init_weights(str(spec), key="")
    return state
