"""``train(cfg)``: the only place that reads the config.

It checks the config, builds the data, model, schedule, method and tracker from it, hands plain
objects to the ``Trainer``, and writes the run directory:

    config.yaml      the resolved config           git.json       commit and dirty flag
    history.jsonl    one line per epoch            metrics.json   final metrics per predictor
    status.json      running / complete / failed / preempted, with the error if any
    checkpoints/     epochNNNN.pt (last two kept; saved/ holds trainer.save_at epochs)
    final.pt         live weights plus each method's own (SWA average, EMA)
    lineage.json     the checkpoint this run started from (trainer.init_from or trainer.branch_from), if any
    reliability.json per predictor, 15 confidence bins (count, accuracy, confidence) for reliability diagrams

Re-running the same command lands in the same directory (see ``conf/hydra/default.yaml``): a
finished run is skipped, an interrupted one resumes from its newest good checkpoint.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from swalab import distributed
from swalab.branching import check_branch, load_branch_state, read_lineage
from swalab.checkpoint import CheckpointError, load_latest, read_checkpoint
from swalab.config import ConfigError, check_config, check_writable
from swalab.data import ResidentLoader, subset
from swalab.tracking import NullTracker
from swalab.trainer import Preempted, Trainer, TrainerOptions, select_device


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


def default_run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path("outputs") / "run"


def resolve_run_dir(cfg: DictConfig, run_dir: str | Path | None) -> Path:
    resume = cfg.trainer.resume
    if isinstance(resume, str) and resume not in ("auto",):
        path = Path(resume)
        if not (path / "checkpoints").is_dir():
            raise FileNotFoundError(f"trainer.resume={resume}: no checkpoints/ folder there to continue from")
        return path
    return Path(run_dir) if run_dir is not None else default_run_dir()


def load_init_weights(spec: str) -> tuple[dict, dict]:
    """Weights to start from: ``<run dir>[@epoch]``, a swalab checkpoint, or a plain state dict file.

    Returns the state dict and a lineage record naming where it came from.
    """
    path, _, epoch = str(spec).partition("@")
    path = Path(path)
    if path.is_dir():
        ckpt_dir = path / "checkpoints"
        if epoch:
            candidates = [ckpt_dir / "saved" / f"epoch{int(epoch):04d}.pt", ckpt_dir / f"epoch{int(epoch):04d}.pt"]
            found = next((c for c in candidates if c.exists()), None)
            if found is None:
                raise FileNotFoundError(f"trainer.init_from={spec}: no checkpoint of epoch {epoch} in {ckpt_dir} "
                                        "(keep it with trainer.save_at=[{epoch}] in the parent run)")
            state = read_checkpoint(found)
        else:
            state = load_latest(ckpt_dir)
            if state is None:
                raise FileNotFoundError(f"trainer.init_from={spec}: {ckpt_dir} holds no checkpoint")
            found = Path(state["path"])
        return state["model"], {"parent": str(path), "checkpoint": str(found), "epoch": state["epoch"]}
    if not path.exists():
        raise FileNotFoundError(f"trainer.init_from={spec}: no such file or run directory")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"trainer.init_from={spec}: cannot read it ({type(exc).__name__}: {exc})") from exc
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
    test = StreamLoader(data.test.with_transform(test_tf), int(cfg.trainer.eval_batch_size), train=False, **common)
    keep = bn_subset_indices(len(data.train), float(cfg.trainer.bn_update_fraction), batch_size, int(cfg.seed) + 1)
    bn_split = data.train if keep is None else data.train.subset(keep)
    # drop_last: a last batch of one image cannot be batch-normalised in train mode; used rarely: no idle workers
    bn = StreamLoader(bn_split.with_transform(train_tf), batch_size, train=True, drop_last=True,
                      seed=int(cfg.seed) + 1, persistent_workers=False, **common)
    return train, test, bn


def build_loaders(cfg: DictConfig, data, device: torch.device):
    """Training, test and BN-update loaders on ``device``; the split stays resident there."""
    if cfg.dataset.get("loader", "resident") == "stream":
        return build_stream_loaders(cfg, data, device)
    mean = list(cfg.model.get("mean") or cfg.dataset.mean)
    std = list(cfg.model.get("std") or cfg.dataset.std)
    batch_size = int(cfg.trainer.batch_size)
    if batch_size > len(data.train):
        raise ConfigError(f"trainer.batch_size={batch_size} is larger than the {len(data.train)} training images "
                          "(lower it, or raise dataset.train_size)")
    channels_last = bool(cfg.trainer.channels_last)
    common = dict(device=device, mean=mean, std=std, channels_last=channels_last)
    ranks = distributed.info()  # torchrun: batch_size is the global batch, each rank takes its slice
    if batch_size % ranks.world_size:
        raise ConfigError(f"trainer.batch_size={batch_size} must divide evenly over {ranks.world_size} ranks")
    train = ResidentLoader(data.train, batch_size // ranks.world_size, pad=cfg.dataset.pad, flip=cfg.dataset.flip,
                           train=True, seed=int(cfg.seed), rank=ranks.rank, world_size=ranks.world_size, **common)
    test = ResidentLoader(data.test, int(cfg.trainer.eval_batch_size), train=False, **common)
    fraction = float(cfg.trainer.bn_update_fraction)
    bn_split = data.train if fraction >= 1 else subset(data.train, max(batch_size, int(fraction * len(data.train))),
                                                       seed=int(cfg.seed) + 1)
    bn = ResidentLoader(bn_split, batch_size, pad=cfg.dataset.pad, flip=cfg.dataset.flip, train=True,
                        drop_last=False, seed=int(cfg.seed) + 1, **common)
    return train, test, bn


def fingerprint_of(cfg: DictConfig) -> dict:
    """What must match for a checkpoint to be resumed by this config."""
    return {"dataset": cfg.dataset.name, "model": cfg.model.name, "method": cfg.method.name,
            "seed": int(cfg.seed), "epochs": int(cfg.trainer.epochs), "batch_size": int(cfg.trainer.batch_size),
            "train_size": cfg.dataset.get("train_size")}


def train(cfg: DictConfig, run_dir: str | Path | None = None) -> dict:
    """Train one run as ``cfg`` says and return its final metrics (``{predictor: {metric: value}}``)."""
    check_config(cfg)
    distributed.init_distributed(str(cfg.trainer.device))  # no-op unless launched by torchrun
    run_dir = resolve_run_dir(cfg, run_dir)
    metrics_path = run_dir / "metrics.json"
    resume_mode = cfg.trainer.resume
    if metrics_path.exists() and resume_mode is not False:
        print(f"[swalab] {run_dir} already holds a finished run; skipping (metrics.json kept)")
        return json.loads(metrics_path.read_text())
    check_writable(run_dir)  # an unwritable output directory fails here, before any data is loaded
    fingerprint = fingerprint_of(cfg)
    resume_state = load_latest(run_dir / "checkpoints", fingerprint) if resume_mode is not False else None
    if resume_mode is True and resume_state is None:
        raise FileNotFoundError(f"trainer.resume=true but {run_dir / 'checkpoints'} holds no checkpoint")
    if resume_mode is False and ((run_dir / "checkpoints").is_dir() or metrics_path.exists()):
        raise FileExistsError(f"{run_dir} already holds a run and trainer.resume=false: nothing is overwritten. "
                              "Continue it with trainer.resume=auto, or choose another hydra.run.dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if distributed.is_main():
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    write_json(run_dir / "git.json", git_info())
    write_json(run_dir / "status.json", {"status": "running"})

    try:
        metrics, trainer, method, epochs, tracker = _run(cfg, run_dir, resolved, fingerprint, resume_state)
    except Preempted as exc:
        write_json(run_dir / "status.json", {"status": "preempted", "message": str(exc)})
        raise
    except BaseException as exc:
        write_json(run_dir / "status.json", {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                             "traceback": traceback.format_exc()})
        raise
    final = {"model": trainer.model.state_dict(), "methods": method.final_weights(), "epoch": epochs,
             "fingerprint": fingerprint}
    if distributed.is_main():
        torch.save(final, run_dir / "final.pt")
    tracker.final_checkpoint(run_dir / "final.pt")
    write_json(run_dir / "reliability.json", getattr(trainer, "reliability", {}))
    write_json(metrics_path, metrics)
    write_json(run_dir / "status.json", {"status": "complete"})
    tracker.summary(metrics)
    tracker.finish()
    print(format_metrics(metrics), file=sys.stdout)
    return metrics


def _run(cfg: DictConfig, run_dir: Path, resolved: dict, fingerprint: dict, resume_state: dict | None):
    """Build everything from the config and train; the tracker is finished on any failure."""
    seed_everything(int(cfg.seed))
    device = distributed.local_device(select_device(str(cfg.trainer.device)))
    data = instantiate(cfg.dataset.source)
    if data.num_classes != cfg.dataset.num_classes:
        raise ConfigError(f"dataset.num_classes={cfg.dataset.num_classes} but the data at dataset.root has "
                          f"{data.num_classes} classes")
    train_loader, test_loader, bn_loader = build_loaders(cfg, data, device)
    model = instantiate(cfg.model.arch)
    lineage = None
    if cfg.trainer.get("init_from"):
        weights, lineage = load_init_weights(cfg.trainer.init_from)
        load_into(model, weights, str(cfg.trainer.init_from))
        write_json(run_dir / "lineage.json", lineage)
    branched = False
    if cfg.trainer.get("branch_from"):  # another run's full checkpoint state; see swalab.branching
        if lineage is not None:
            raise ConfigError("set trainer.init_from (weights only) or trainer.branch_from (full state), not both")
        if resume_state is None:
            resume_state, lineage = load_branch_state(str(cfg.trainer.branch_from), fingerprint)
            branched = True
        else:  # this branch wrote checkpoints of its own and resumes from them
            lineage = read_lineage(run_dir)
    epochs = int(cfg.trainer.epochs)
    if epochs == 0:  # evaluation only: score the starting weights (the "SGD" column of the ImageNet table)
        from swalab.methods.pretrained import Pretrained
        method = Pretrained()
    else:
        schedule = instantiate(cfg.schedule)
        method = instantiate(cfg.method, _partial_=True, _convert_="all")(schedule=schedule)
    method.validate(epochs, initialized=lineage is not None or bool(cfg.model.get("pretrained")))
    if branched:  # refuse before anything trains if the branch would not equal a straight-through run
        check_branch(method, resume_state, epochs, len(train_loader), cfg.trainer.momentum,
                     cfg.trainer.weight_decay, cfg.trainer.nesterov)
        write_json(run_dir / "lineage.json", lineage)

    tracker = NullTracker() if not distributed.is_main() else instantiate(cfg.logger, _partial_=True)(
        run_dir=str(run_dir), run_config=resolved if lineage is None else {**resolved, "lineage": lineage})
    options = TrainerOptions(
        epochs=epochs, momentum=cfg.trainer.momentum, weight_decay=cfg.trainer.weight_decay,
        nesterov=cfg.trainer.nesterov, amp=cfg.trainer.amp, channels_last=cfg.trainer.channels_last,
        compile=cfg.trainer.compile, eval_every=cfg.trainer.eval_every, checkpoint_every=cfg.trainer.checkpoint_every,
        keep_checkpoints=cfg.trainer.keep_checkpoints, nonfinite=cfg.trainer.nonfinite,
        max_skips=cfg.trainer.max_skips, progress=cfg.trainer.progress, save_at=tuple(cfg.trainer.save_at or ()))
    trainer = Trainer(model, method, train_loader, test_loader, bn_loader, device, run_dir, options,
                      fingerprint=fingerprint, logger=tracker,
                      on_epoch=lambda row: tracker.log(row, step=row["epoch"]))
    if resume_state is not None:
        print(f"[swalab] resuming {run_dir} from {resume_state['path']}")
    if branched:  # the trunk's epochs are this run's history too
        for row in resume_state["history"]:
            tracker.log(row, step=row["epoch"])
    try:
        metrics = trainer.fit(resume_state)
    except BaseException:
        tracker.finish(exit_code=1)
        raise
    return metrics, trainer, method, epochs, tracker

def format_metrics(metrics: dict) -> str:
    lines = [f"{'predictor':<12} {'acc %':>8} {'nll':>8} {'ece':>8}"]
    for name, m in metrics.items():
        if "acc" in m:
            lines.append(f"{name:<12} {m['acc']:8.2f} {m['nll']:8.4f} {m['ece']:8.4f}")
    return "\n".join(lines)
