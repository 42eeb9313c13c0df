"""``train(cfg)``: the only place that reads the config.

A run goes through two steps, and nothing is written before the second:

1. :func:`prepare` checks the config (types, ranges, keys nothing reads, the device, the method's
   own checks), computes the run's identity (``swalab.identity``) and its directory, and looks at
   what that directory holds: a finished run of the same identity is skipped, a run of another
   identity is refused with the keys that differ.
2. :func:`execute` takes the directory's lock (``swalab.runlock``: one process per run), loads the
   data, builds the model and the resume or branch state, and only then writes the run directory
   and trains. A run refused at this point (missing data, weights that do not fit, a branch that
   would not equal the straight-through run) removes what it created and leaves an existing run's
   files untouched.

The run directory::

    config.yaml      the resolved config           identity.json  the run's identity and its hashes
    overrides.yaml   the command line's overrides  git.json       commit and dirty flag
    history.jsonl    one line per epoch            metrics.json   final metrics per predictor
    status.json      running / complete / failed / preempted, with the error line if any
    run.log          the run's log lines (one per epoch) with time stamps
    checkpoints/     epochNNNN.pt (last two kept; saved/ holds run.save_at epochs)
    final.pt         live weights plus each method's own (SWA average, EMA)
    lineage.json     the checkpoint this run started from (run.init_from or run.branch_from), if any
    reliability.json per predictor, 15 confidence bins (count, accuracy, confidence) for reliability diagrams
    predictions.pt   per predictor, its test probabilities (float16, when at most 5M numbers) and the labels
    wandb_run.json   the W&B run that mirrors this run (logger=wandb): its id, name, group and tags
    wandb/           W&B's own files (offline-run-* for a later ``wandb sync``)

Re-running the same command lands in the same directory: a finished run is skipped, an
interrupted one resumes from its newest good checkpoint.
"""

from __future__ import annotations

import inspect
import json
import random
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from swalab import distributed
from swalab.branching import check_branch, load_branch_state, read_lineage
from swalab.checkpoint import CheckpointError, CheckpointStore, atomic_save, read_checkpoint
from swalab.config import ConfigError, build, check_config, check_overrides, default_choices
from swalab.data import ResidentLoader, subset
from swalab.evaluate import metrics_table
from swalab.identity import (IDENTITY_FILE, differences, group_hash, identity_of, name_items, record, run_name,
                             stored_identity)
from swalab.logs import epoch_line, get_logger, run_log
from swalab.runlock import RunLock
from swalab.tracking import RECORD_FILE, NullTracker, WandbTracker, plan_record, run_labels
from swalab.trainer import Preempted, Trainer, TrainerOptions, select_device

log = get_logger()
PREDICTIONS_FILE = "predictions.pt"
PREDICTIONS_MAX = 5_000_000  # numbers per predictor (test images x classes) kept in predictions.pt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def git_info() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {"commit": commit or None, "dirty": dirty}


def write_json(path: Path, obj) -> None:
    if not distributed.is_main():  # data-parallel runs: rank 0 writes the run directory
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")
    tmp.replace(path)


def load_init_weights(spec: str) -> tuple[dict, dict]:
    """Weights to start from: ``<run dir>[@epoch]``, a swalab checkpoint, or a plain state dict file.

    Returns the state dict and a lineage record naming where it came from.
    """
    path, sep, epoch = str(spec).rpartition("@")
    if not sep or not epoch.isdigit():  # no epoch given: the whole spec is the path
        path, epoch = str(spec), ""
    path = Path(path)
    if path.is_dir():
        store = CheckpointStore(path)
        if epoch:
            found = store.find(int(epoch))
            if found is None:
                raise FileNotFoundError(f"run.init_from={spec}: no checkpoint of epoch {epoch} in {store.dir} "
                                        f"(keep it with run.save_at=[{epoch}] in the parent run)")
            state = read_checkpoint(found)
        else:
            state = store.latest()
            if state is None:
                raise FileNotFoundError(f"run.init_from={spec}: {store.dir} holds no checkpoint")
            found = Path(state["path"])
        return state["model"], {"parent": str(path), "checkpoint": str(found), "epoch": state["epoch"]}
    if not path.exists():
        raise FileNotFoundError(f"run.init_from={spec}: no such file or run directory")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"run.init_from={spec}: cannot read it ({type(exc).__name__}: {exc})") from exc
    if isinstance(state, dict) and state.get("format") == "swalab-checkpoint":
        return state["model"], {"parent": str(path.parent.parent), "checkpoint": str(path), "epoch": state["epoch"]}
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    return state, {"parent": None, "checkpoint": str(path), "epoch": None}


def load_into(model: torch.nn.Module, state: dict, source: str) -> None:
    """Load weights strictly, naming the missing and unexpected keys when they do not fit."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # same keys, other shapes (e.g. another number of classes)
        raise CheckpointError(f"weights from {source} do not fit {type(model).__name__}: {exc}") from exc
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"weights from {source} do not fit {type(model).__name__}: "
                              f"missing keys {result.missing_keys[:8]}, unexpected keys {result.unexpected_keys[:8]}")


def eval_batch_size(cfg: DictConfig, device: torch.device) -> int:
    """``trainer.eval_batch_size``, or by device: large batches fill a GPU, but on a CPU a PreResNet-20 scores
    10,000 images in 4.1 s at batch 128 and 10.4 s at batch 1000 (cache misses; bench/README.md)."""
    size = cfg.trainer.get("eval_batch_size")
    return int(size) if size is not None else (1000 if device.type == "cuda" else 128)


def build_stream_loaders(cfg: DictConfig, data, device: torch.device):
    """Training, test and BN-update loaders that decode from disk in worker processes (``dataset.loader=stream``).

    Transforms follow the pretrained config of the timm model being trained (``model.arch.model_name``);
    the BN-update loader reads a fixed seeded ``trainer.bn_update_fraction`` of the training set.
    """
    from swalab.data.imagenet import StreamLoader, bn_subset_indices, imagenet_transforms

    model_name = cfg.model.arch.get("model_name")
    mean = cfg.model.get("mean") or (None if model_name else cfg.dataset.mean)
    std = cfg.model.get("std") or (None if model_name else cfg.dataset.std)
    train_tf, test_tf, _ = imagenet_transforms(model_name, image_size=cfg.dataset.get("image_size"), mean=mean,
                                               std=std, interpolation=cfg.dataset.get("interpolation"),
                                               crop_pct=cfg.dataset.get("crop_pct"), flip=bool(cfg.dataset.flip))
    batch_size = int(cfg.trainer.batch_size)
    if batch_size > len(data.train):
        raise ConfigError(f"trainer.batch_size={batch_size} is larger than the {len(data.train)} training images "
                          "(lower it, or raise dataset.train_size)")
    common = dict(num_workers=int(cfg.dataset.num_workers), pin_memory=device.type == "cuda",
                  prefetch_factor=cfg.dataset.get("prefetch_factor"))
    train = StreamLoader(data.train.with_transform(train_tf), batch_size, train=True, seed=int(cfg.seed), **common)
    test = StreamLoader(data.test.with_transform(test_tf), eval_batch_size(cfg, device), train=False, **common)
    keep = bn_subset_indices(len(data.train), float(cfg.trainer.bn_update_fraction), batch_size, int(cfg.seed) + 1)
    bn_split = data.train if keep is None else data.train.subset(keep)
    # drop_last: a last batch of one image cannot be batch-normalised in train mode; used rarely: no idle workers
    bn = StreamLoader(bn_split.with_transform(train_tf), batch_size, train=True, drop_last=True,
                      seed=int(cfg.seed) + 1, persistent_workers=False, **common)
    return train, test, bn


def build_model(cfg: DictConfig, data=None) -> torch.nn.Module:
    """The network of ``model.arch``. Its constructor's ``num_classes`` and ``in_channels`` arguments, when it
    has them, get the data's class count and channels (a folder's are found in its files; without ``data``,
    the config's)."""
    from hydra.utils import get_method

    found = {"num_classes": data.num_classes if data is not None else cfg.dataset.get("num_classes"),
             "in_channels": getattr(data, "channels", None) or cfg.dataset.get("channels")}
    takes = inspect.signature(get_method(cfg.model.arch._target_)).parameters
    return build(cfg.model.arch, "model.arch", **{k: int(v) for k, v in found.items() if k in takes and v})


def build_loaders(cfg: DictConfig, data, device: torch.device):
    """Training, test and BN-update loaders on ``device``; the split stays resident there."""
    if cfg.dataset.get("loader", "resident") == "stream":
        return build_stream_loaders(cfg, data, device)
    mean = list(cfg.model.get("mean") or cfg.dataset.get("mean") or getattr(data, "mean", None))
    std = list(cfg.model.get("std") or cfg.dataset.get("std") or getattr(data, "std", None))
    pad = cfg.dataset.get("pad")
    if pad is None:  # crop padding scaled to the image size: 4 pixels for 32
        pad = int(round(data.train.images.shape[-1] / 8))
    batch_size = int(cfg.trainer.batch_size)
    if batch_size > len(data.train):
        raise ConfigError(f"trainer.batch_size={batch_size} is larger than the {len(data.train)} training images "
                          "(lower it, or raise dataset.train_size)")
    channels_last = bool(cfg.trainer.channels_last)
    common = dict(device=device, mean=mean, std=std, channels_last=channels_last)
    ranks = distributed.info()  # torchrun: batch_size is the global batch, each rank takes its slice
    if batch_size % ranks.world_size:
        raise ConfigError(f"trainer.batch_size={batch_size} must divide evenly over {ranks.world_size} ranks")
    train = ResidentLoader(data.train, batch_size // ranks.world_size, pad=pad, flip=cfg.dataset.flip,
                           train=True, seed=int(cfg.seed), rank=ranks.rank, world_size=ranks.world_size, **common)
    test = ResidentLoader(data.test, eval_batch_size(cfg, device), train=False, **common)
    fraction = float(cfg.trainer.bn_update_fraction)
    bn_split = data.train if fraction >= 1 else subset(data.train, max(batch_size, int(fraction * len(data.train))),
                                                       seed=int(cfg.seed) + 1)
    bn = ResidentLoader(bn_split, batch_size, pad=pad, flip=cfg.dataset.flip, train=True,
                        drop_last=False, seed=int(cfg.seed) + 1, **common)
    return train, test, bn



# -- step 1: everything that can be checked before a file is written --------------------------------

@dataclass
class RunPlan:
    """An accepted config, ready to train: where, as what, and what it has already checked."""

    cfg: DictConfig
    run_dir: Path
    identity: dict
    resolved: dict
    overrides: list[str] | None
    device: torch.device
    method: Any
    apart: tuple[str, ...] = ()           # what sets the run apart in its name (identity.name_items): schedule-cosine, ...
    grid: str | None = None               # the grid launch's record directory name (<date_time>), if in a grid
    finished: dict | None = None          # the metrics of a finished run of this identity (to skip)
    started: bool = False                 # set once training starts: an error before it is a refusal


def locate(cfg: DictConfig, identity: dict, overrides: Sequence[str] | None, choices: dict | None) -> Path:
    """The run directory: ``run.dir`` when set, else the name ``swalab.identity.run_name`` makes."""
    if cfg.run.get("dir"):
        return Path(str(cfg.run.dir))
    names = {"dataset": str(cfg.dataset.name), "model": str(cfg.model.name), "method": str(cfg.method.name)}
    name = run_name(names, cfg.seed, overrides, choices or {}, default_choices(), group_hash(identity))
    return Path(str(cfg.paths.output_dir)) / name


def build_method(cfg: DictConfig, epochs: int):
    """The base schedule and the method, from their config groups (each checks its own arguments)."""
    kwargs = {}
    if "horizon" in cfg.schedule and cfg.schedule.horizon is None:  # null: the schedule spans the run
        kwargs["horizon"] = max(epochs, 1)
    schedule = build(cfg.schedule, "schedule", **kwargs)
    return build(cfg.method, "method", schedule=schedule, epochs=epochs)


def validate(cfg: DictConfig):
    """Every check of ``cfg`` that needs no data and writes nothing; returns the (checked) method.

    The config's own keys (``check_config``), the device, and the schedule and method, which check
    their own arguments when built and their combination in ``validate``.
    """
    check_config(cfg)
    select_device(str(cfg.trainer.device))
    method = build_method(cfg, int(cfg.trainer.epochs))
    method.validate(initialized=bool(cfg.run.get("init_from") or cfg.run.get("branch_from")
                                     or cfg.model.get("pretrained")))
    return method


def inspect_run_dir(run_dir: Path, identity: dict, resume) -> dict | None:
    """What ``run_dir`` holds, checked against this run: the metrics of a finished run of the same
    identity (to skip it), None for a new or interrupted one; refused when it holds another config."""
    theirs = stored_identity(run_dir)
    if theirs is not None and theirs != identity:
        raise ConfigError(f"{run_dir} holds a run of another config (" + "; ".join(differences(identity, theirs)[:8])
                          + "): nothing there is touched. Re-run with that config to continue it, or give this "
                          "one its own directory with run.dir=<dir>")
    metrics = run_dir / "metrics.json"
    if metrics.exists():
        if resume is False:
            raise FileExistsError(f"{run_dir} already holds a finished run and run.resume=false: nothing is "
                                  "overwritten. Choose another directory with run.dir=<dir>")
        return json.loads(metrics.read_text())
    has_checkpoints = bool(CheckpointStore(run_dir).paths())
    if resume is False and has_checkpoints:
        raise FileExistsError(f"{run_dir} already holds a run and run.resume=false: nothing is overwritten. "
                              "Continue it with run.resume=auto, or choose another directory with run.dir=<dir>")
    if resume is True and not has_checkpoints:
        raise FileNotFoundError(f"run.resume=true but {run_dir / 'checkpoints'} holds no checkpoint to resume")
    return None


def prepare(cfg: DictConfig, run_dir: str | Path | None = None, overrides: Sequence[str] | None = None,
            choices: dict | None = None, grid: str | Path | None = None) -> RunPlan:
    """Check ``cfg`` and find its run directory, writing nothing (step 1 of the module doc).

    ``overrides`` are the command line's overrides as typed and ``choices`` each config group's
    chosen option (``run.py`` passes Hydra's); they name the run directory and let keys added with
    ``+`` be checked. Without them the directory name carries the identity's hash instead.
    ``grid`` is the record directory of the grid launch running this job (``outputs/grids/<date_time>``):
    its name tags the W&B run.
    """
    if overrides is not None:
        check_overrides(overrides, list(choices or {}))
    method = validate(cfg)
    device = select_device(str(cfg.trainer.device))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    identity = identity_of(resolved)
    run_dir = Path(run_dir) if run_dir is not None else locate(cfg, identity, overrides, choices)
    apart = tuple(name_items(overrides, choices or {}, default_choices())[0])
    finished = inspect_run_dir(run_dir, identity, cfg.run.resume)
    return RunPlan(cfg=cfg, run_dir=run_dir, identity=identity, resolved=resolved,
                   overrides=None if overrides is None else list(overrides), device=device, method=method,
                   apart=apart, grid=None if grid is None else Path(str(grid)).name, finished=finished)


# -- step 2: lock, load, write, train --------------------------------------------------------------

@dataclass
class Built:
    """Everything a run trains with, built after its lock is held."""

    trainer: Trainer
    lineage: dict | None
    resume_state: dict | None
    branched: bool


def build_run(plan: RunPlan) -> Built:
    """Load the data, build the model, loaders, resume or branch state and the trainer (no file written)."""
    cfg, run_dir, method = plan.cfg, plan.run_dir, plan.method
    seed_everything(int(cfg.seed))
    device = distributed.local_device(plan.device)
    data = build(cfg.dataset.source, "dataset.source")
    expected = cfg.dataset.get("num_classes")
    if expected is not None and data.num_classes != expected:
        raise ConfigError(f"dataset.num_classes={expected} but the data at dataset.root has {data.num_classes} classes")
    train_loader, test_loader, bn_loader = build_loaders(cfg, data, device)
    model = build_model(cfg, data)
    lineage = None
    if cfg.run.get("init_from"):
        weights, lineage = load_init_weights(cfg.run.init_from)
        load_into(model, weights, str(cfg.run.init_from))
    resume_state = CheckpointStore(run_dir).latest(plan.identity) if cfg.run.resume is not False else None
    branched = False
    if cfg.run.get("branch_from"):  # another run's full checkpoint state; see swalab.branching
        if resume_state is None:
            resume_state, lineage = load_branch_state(str(cfg.run.branch_from), plan.identity)
            branched = True
            check_branch(method, resume_state, len(train_loader), cfg.trainer.momentum, cfg.trainer.weight_decay,
                         cfg.trainer.nesterov)
        else:  # this branch wrote checkpoints of its own and resumes from them
            lineage = read_lineage(run_dir)
    options = trainer_options(cfg, method.epochs)
    trainer = Trainer(model, method, train_loader, test_loader, bn_loader, device, run_dir, options,
                      identity=plan.identity)
    return Built(trainer=trainer, lineage=lineage, resume_state=resume_state, branched=branched)


def message(exc: BaseException) -> str:
    """What an error says, without Python's ``[Errno N]`` prefix on the OS errors swalab words itself."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        return str(exc.strerror).strip()
    return str(exc).strip()


def save_predictions(evaluation, path: Path) -> None:
    """Each predictor's test probabilities (float16) and the labels, for analyses that need no weights
    (the report's section 3.5 diagnostics). Left out above ``PREDICTIONS_MAX`` numbers per predictor
    (ImageNet's 50,000 x 1,000 would be 100 MB a predictor)."""
    kept = {name: p.half() for name, p in evaluation.probs.items() if p.numel() <= PREDICTIONS_MAX}
    if kept:
        atomic_save({"probs": kept, "labels": evaluation.labels}, path)


def trainer_options(cfg: DictConfig, epochs: int) -> TrainerOptions:
    """The loop's options: every ``TrainerOptions`` field from ``trainer.*`` or ``run.*`` of the same name."""
    from dataclasses import fields

    names = {f.name for f in fields(TrainerOptions)} - {"epochs", "save_at", "handle_signals"}
    values = {k: cfg[group][k] for group in ("trainer", "run") for k in names if k in cfg[group]}
    return TrainerOptions(epochs=epochs, save_at=tuple(cfg.run.save_at or ()), **values)


def one_line(exc: BaseException) -> str:
    """``<type>: <first line of its message>``: what status.json and a grid's summary record."""
    text = message(exc).splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def write_status(run_dir: Path, status: dict) -> None:
    """``status.json``, best effort: when the disk is full even this small file may not fit, and the
    error being reported matters more than the record of it."""
    try:
        write_json(run_dir / "status.json", status)
    except OSError as exc:
        log.warning(f"[swalab] could not record status {status.get('status')!r} in {run_dir} ({exc})")


def execute(plan: RunPlan) -> dict:
    """Train the run ``plan`` describes (step 2 of the module doc) and return its final metrics."""
    if plan.finished is not None:
        log.info(f"[swalab] {plan.run_dir} already holds a finished run of this config; skipping (metrics.json kept)")
        return plan.finished
    distributed.init_distributed(str(plan.cfg.trainer.device))  # no-op unless launched by torchrun
    lock = RunLock(plan.run_dir) if distributed.is_main() else None
    if lock is not None:
        lock.acquire()
    try:
        try:
            if lock is not None:  # another process may have finished this run while we waited for nothing
                plan.finished = inspect_run_dir(plan.run_dir, plan.identity, plan.cfg.run.resume)
                if plan.finished is not None:
                    log.info(f"[swalab] {plan.run_dir} was finished by another process meanwhile; skipping")
                    return plan.finished
            built = build_run(plan)
        except BaseException:
            if lock is not None:
                lock.discard()
                lock = None
            raise
        return _train(plan, built, lock)
    finally:
        if lock is not None:
            lock.release()


def write_run_files(plan: RunPlan, lineage: dict | None) -> None:
    if not distributed.is_main():
        return
    run_dir = plan.run_dir
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.resolved)))
    write_json(run_dir / IDENTITY_FILE, record(plan.identity))
    if plan.overrides is not None:
        (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.overrides)))
    write_json(run_dir / "git.json", git_info())
    if lineage is not None:
        write_json(run_dir / "lineage.json", lineage)
    write_json(run_dir / "status.json", {"status": "running"})


def wandb_run(plan: RunPlan) -> dict | None:
    """Who this run is on W&B (``swalab.tracking``): the W&B run id kept in ``wandb_run.json`` (a new
    one the first time), its name, group, job type and tags; None unless ``logger`` is W&B.

    ``logger.name``, ``logger.group`` and ``logger.job_type`` replace the computed ones when set;
    ``logger.tags`` come before the computed tags.
    """
    cfg = plan.cfg
    target = cfg.logger.get("_target_")
    if not target or not issubclass(get_class(str(target)), WandbTracker):
        return None
    labels = run_labels(str(cfg.dataset.name), str(cfg.model.name), str(cfg.method.name), cfg.seed, plan.apart,
                        group_hash(plan.identity), plan.grid)
    for key in ("name", "group", "job_type"):
        if cfg.logger.get(key):
            labels[key] = str(cfg.logger[key])
    labels["tags"] = list(dict.fromkeys([*map(str, cfg.logger.get("tags") or []), *labels["tags"]]))
    return plan_record(plan.run_dir, labels, str(cfg.logger.project), cfg.logger.get("entity"))


def make_tracker(plan: RunPlan, built: Built):
    """The logger of ``plan`` (``logger=``): the resolved config with the identity's hashes, and for W&B
    the run of :func:`wandb_run`, continued past the epochs it already holds when this run resumes."""
    if not distributed.is_main():
        return NullTracker()
    config = {**plan.resolved, "identity": {k: v for k, v in record(plan.identity).items() if k != "identity"}}
    if built.lineage is not None:
        config["lineage"] = built.lineage
    labels = wandb_run(plan)
    kwargs = {}
    if labels is not None:
        write_json(plan.run_dir / RECORD_FILE, labels)
        resumed = built.resume_state is not None and not built.branched  # a branch's W&B run starts empty
        kwargs = {"run_id": labels["id"], "name": labels["name"], "group": labels["group"],
                  "job_type": labels["job_type"], "tags": labels["tags"],
                  "logged_through": int(built.resume_state["epoch"]) if resumed else 0}
    return instantiate(plan.cfg.logger, _partial_=True)(run_dir=str(plan.run_dir), run_config=config, **kwargs)


def _train(plan: RunPlan, built: Built, lock: RunLock | None) -> dict:
    run_dir, trainer, method = plan.run_dir, built.trainer, plan.method
    plan.started = True
    write_run_files(plan, built.lineage)
    with run_log(run_dir):
        if lock is not None and lock.took_over():
            log.info(f"[swalab] {lock.took_over()}")
        if built.resume_state is not None and not built.branched:
            log.info(f"[swalab] resuming {run_dir} from {built.resume_state['path']}")
        else:
            log.info(f"[swalab] training {run_dir} ({method.name}, {method.epochs} epochs, identity "
                     f"{record(plan.identity)['hash']})")
        tracker = make_tracker(plan, built)

        def on_epoch(row: dict) -> None:
            tracker.log_epoch(row)
            log.info(epoch_line(row, method.epochs, trainer.run_eta(row["epoch"])))

        trainer.on_epoch = on_epoch
        if built.branched:  # the trunk's epochs are this run's history too
            for row in built.resume_state["history"]:
                tracker.log_epoch(row)
        try:
            evaluation = trainer.fit(built.resume_state)
            metrics = evaluation.metrics
            final = {"model": trainer.model.state_dict(), "methods": method.final_weights(), "epoch": method.epochs,
                     "identity": plan.identity}
            if distributed.is_main():
                atomic_save(final, run_dir / "final.pt")
            tracker.final_checkpoint(run_dir / "final.pt")
            write_json(run_dir / "reliability.json", evaluation.reliability)
            if distributed.is_main():
                save_predictions(evaluation, run_dir / PREDICTIONS_FILE)
                for name, obj in method.artifacts(trainer.ctx).items():
                    atomic_save(obj, run_dir / name)
            write_json(run_dir / "metrics.json", metrics)
        except Preempted as exc:
            write_status(run_dir, {"status": "preempted", "message": str(exc)})
            tracker.finish(exit_code=1)
            raise
        except BaseException as exc:
            write_status(run_dir, {"status": "failed", "error": one_line(exc), "traceback": traceback.format_exc()})
            log.info(f"[swalab] {run_dir} failed: {one_line(exc)}")
            tracker.finish(exit_code=1)
            raise
        write_status(run_dir, {"status": "complete"})
        tracker.results(metrics, evaluation.reliability)
        tracker.finish()
        log.info(metrics_table(metrics))
    return metrics


def train(cfg: DictConfig, run_dir: str | Path | None = None, overrides: Sequence[str] | None = None,
          choices: dict | None = None) -> dict:
    """Train one run as ``cfg`` says and return its final metrics (``{predictor: {metric: value}}``).

    ``run_dir`` places the run (default: ``run.dir``, else the name made from the config); see
    :func:`prepare` for ``overrides`` and ``choices``.
    """
    return execute(prepare(cfg, run_dir, overrides, choices))

