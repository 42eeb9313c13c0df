"""The objects a run trains with, built from its config: method and schedule, model, loaders, weights.

Only the ``swalab.train`` package reads the config; what it builds here takes explicit arguments from
then on (the trainer, the methods, the loaders). Each builder names the config key a bad value came
from (``swalab.config.build``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from swalab import distributed
from swalab.branching import check_branch, load_branch_state, read_lineage
from swalab.checkpoint import CheckpointError, CheckpointStore
from swalab.config import ConfigError, build, is_number
from swalab.data import ResidentLoader, subset
from swalab.losses import LossSpec
from swalab.optim import OptimizerSpec
from swalab.runweights import load_init_weights
from swalab.settings import GROUPS, InvalidSettings, TrainerOptions


def data_files_record(cfg: DictConfig) -> dict | None:
    """The record of the files the run's data set reads (``swalab.data.fingerprint``), made by the recorder its
    loader (``dataset.source._target_``) declares (``fingerprint.records_files``) from the loader's arguments; None
    for a loader that declares none (a user's own) or data that are not there yet (a download still to come)."""
    from hydra.utils import get_method

    recorder = getattr(get_method(str(cfg.dataset.source._target_)), "files_record", None)
    if recorder is None:
        return None
    args = {k: v for k, v in OmegaConf.to_container(cfg.dataset.source, resolve=True).items() if k != "_target_"}
    return recorder(**args)


class StartKind(Enum):
    FRESH = "fresh"          # the model's own initial weights
    RESUME = "resume"        # the run's own newest checkpoint, however it started
    BRANCH = "branch"        # another run's checkpoint, its whole state but the method's (run.branch_from)
    INIT_FROM = "init-from"  # another run's or a file's weights only (model.init_from)


@dataclass(frozen=True)
class Start:
    """How a run begins (:func:`start_of`): it decides the run's first log line, the state the trainer continues
    from, where its W&B run picks up and its ``lineage.json``."""

    kind: StartKind
    state: dict | None = None    # the checkpoint state training continues from: the run's own or the trunk's
    lineage: dict | None = None  # where its first weights came from (model.init_from, run.branch_from), if elsewhere


def start_of(cfg: DictConfig, run_dir: Path, identity: dict, method, model: torch.nn.Module,
             steps_per_epoch: int) -> Start:
    """How the run of ``cfg`` begins, once its lock is held: resumed from its own newest checkpoint when it has one
    (``run.resume``), else branched, else from ``model.init_from``'s weights, else fresh. Those weights are loaded
    into ``model`` whenever they are set, a resumed run's too (its checkpoint then replaces them; its lineage stays
    theirs); a branch is refused here when it would not equal the straight-through run (``swalab.branching``)."""
    lineage = None
    if cfg.model.get("init_from"):
        weights, lineage = load_init_weights(cfg.model.init_from)
        load_into(model, weights, str(cfg.model.init_from))
    state = CheckpointStore(run_dir).latest(identity) if cfg.run.resume is not False else None
    if state is not None:  # a branch that wrote checkpoints of its own resumes from them, its lineage as recorded
        return Start(StartKind.RESUME, state, read_lineage(run_dir) if cfg.run.get("branch_from") else lineage)
    if cfg.run.get("branch_from"):
        state, lineage = load_branch_state(str(cfg.run.branch_from), identity)
        check_branch(method, state, steps_per_epoch)
        return Start(StartKind.BRANCH, state, lineage)
    return Start(StartKind.INIT_FROM if cfg.model.get("init_from") else StartKind.FRESH, None, lineage)


def load_into(model: torch.nn.Module, state: dict, source: str) -> None:
    """Load weights strictly, naming the missing and unexpected keys when they do not fit."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # same keys, other shapes (e.g. another number of classes)
        raise CheckpointError(f"weights from {source} do not fit {type(model).__name__}: {exc}") from exc
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"weights from {source} do not fit {type(model).__name__}: "
                              f"missing keys {result.missing_keys[:8]}, unexpected keys {result.unexpected_keys[:8]}")


def batch_size_for(cfg: DictConfig, images: int) -> int:
    """``trainer.batch_size``, refused when the training set holds fewer images, data-parallel when it does not
    divide evenly over the ranks, or when it cannot be split into ``trainer.accumulate`` micro-batches (the one check
    of it against the data and the ranks, made once the data are loaded, before anything is written). It is the *global* batch: each rank trains on its
    ``batch_size / world_size`` slice of it (``swalab.distributed``)."""
    batch_size = int(cfg.trainer.batch_size)
    if batch_size > images:
        raise ConfigError(f"trainer.batch_size={batch_size} is larger than the {images} training images "
                          f"({more_images_hint(cfg, images)})")
    ranks = distributed.info()
    if batch_size % ranks.world_size:
        raise ConfigError(f"trainer.batch_size={batch_size} must divide evenly over {ranks.world_size} ranks")
    accumulate = int(cfg.trainer.accumulate)
    if accumulate > batch_size // ranks.world_size:
        raise ConfigError(f"trainer.accumulate={accumulate} micro-batches cannot split a batch of "
                          f"{batch_size // ranks.world_size} images" + (" per rank" if ranks.enabled else "")
                          + ": lower trainer.accumulate or raise trainer.batch_size")
    return batch_size


def more_images_hint(cfg: DictConfig, images: int) -> str:
    """The fix of a batch larger than the training set: raising ``dataset.train_size`` only where it capped the
    images; when the run already trains on every training image, lowering the batch (or the validation split)."""
    cap = cfg.dataset.get("train_size")
    if cap is not None and int(cap) <= images:
        return f"lower it, or raise dataset.train_size={cap}"
    val = cfg.dataset.get("val_size")
    held = f", or lower dataset.val_size={val}, which holds images out of them" if val else ""
    return f"the run trains on every training image already: lower trainer.batch_size{held}"


def eval_batch_size(cfg: DictConfig, device: torch.device) -> int:
    """``run.eval_batch_size``, or by device: large batches fill a GPU, but on a CPU a PreResNet-20 scores
    10,000 images in 5.7 s at batch 128 and 10.2 s at batch 1000 (cache misses; bench/eval_batch.py)."""
    size = cfg.run.get("eval_batch_size")
    return int(size) if size is not None else (1000 if device.type == "cuda" else 128)


def stream_transforms(cfg: DictConfig):
    """``(train transform, eval transform)`` of a streaming data set, from the pretrained config of the timm model
    being trained (``model.arch.model_name``) and the data set's keys."""
    from swalab.data.imagenet import imagenet_transforms

    model_name = cfg.model.arch.get("model_name")
    mean = cfg.model.get("mean") or (None if model_name else cfg.dataset.mean)
    std = cfg.model.get("std") or (None if model_name else cfg.dataset.std)
    train_tf, test_tf, _ = imagenet_transforms(model_name, image_size=cfg.dataset.get("image_size"), mean=mean,
                                               std=std, interpolation=cfg.dataset.get("interpolation"),
                                               crop_pct=cfg.dataset.get("crop_pct"), flip=bool(cfg.dataset.flip))
    return train_tf, test_tf


def stream_options(cfg: DictConfig, device: torch.device) -> dict:
    return dict(num_workers=int(cfg.run.num_workers), pin_memory=device.type == "cuda",
                prefetch_factor=cfg.run.get("prefetch_factor"))


def build_stream_loaders(cfg: DictConfig, data, device: torch.device):
    """Training, test and BN-update loaders that decode from disk in worker processes (``dataset.loader=stream``).

    Transforms follow the pretrained config of the timm model being trained (``model.arch.model_name``);
    the BN-update loader reads a fixed seeded ``trainer.bn_update_fraction`` of the training set. Data-parallel,
    each rank's training loader yields its slice of every global batch of ``trainer.batch_size`` (the rule of the
    resident loader); the test and BN-update loaders are whole, and scoring shards their batches."""
    from swalab.data.imagenet import StreamLoader, bn_subset_indices

    train_tf, test_tf = stream_transforms(cfg)
    batch_size = batch_size_for(cfg, len(data.train))
    common = stream_options(cfg, device)
    ranks = distributed.info()
    train = StreamLoader(data.train.with_transform(train_tf), batch_size // ranks.world_size, train=True,
                         seed=int(cfg.seed), rank=ranks.rank, world_size=ranks.world_size, **common)
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


def normalisation(cfg: DictConfig, data) -> tuple[list[float], list[float]]:
    """The mean and std a resident data set's batches are normalised with: the model's, the data set's, or measured."""
    mean = list(cfg.model.get("mean") or cfg.dataset.get("mean") or getattr(data, "mean", None))
    std = list(cfg.model.get("std") or cfg.dataset.get("std") or getattr(data, "std", None))
    return mean, std


def build_val_loader(cfg: DictConfig, data, device: torch.device):
    """The validation split's loader (``dataset.val_size``), unaugmented and in order like the test set's, or None
    without one. Nothing else reads it: the BN-update loader reads the training split only."""
    val = getattr(data, "val", None)
    if val is None:
        return None
    if cfg.dataset.get("loader", "resident") == "stream":
        from swalab.data.imagenet import StreamLoader

        return StreamLoader(val.with_transform(stream_transforms(cfg)[1]), eval_batch_size(cfg, device), train=False,
                            **stream_options(cfg, device))
    mean, std = normalisation(cfg, data)
    return ResidentLoader(val, eval_batch_size(cfg, device), train=False, device=device, mean=mean, std=std,
                          channels_last=bool(cfg.run.channels_last))


def build_loaders(cfg: DictConfig, data, device: torch.device):
    """Training, test and BN-update loaders on ``device``; the split stays resident there. The BN-update loader reads
    the training split (``data.train``), which holds no validation image."""
    if cfg.dataset.get("loader", "resident") == "stream":
        return build_stream_loaders(cfg, data, device)
    mean, std = normalisation(cfg, data)
    pad = cfg.dataset.get("pad")
    if pad is None:  # crop padding scaled to the image size: 4 pixels for 32
        pad = int(round(data.train.images.shape[-1] / 8))
    batch_size = batch_size_for(cfg, len(data.train))
    channels_last = bool(cfg.run.channels_last)
    common = dict(device=device, mean=mean, std=std, channels_last=channels_last)
    ranks = distributed.info()  # torchrun: batch_size is the global batch, each rank takes its slice
    train = ResidentLoader(data.train, batch_size // ranks.world_size, pad=pad, flip=cfg.dataset.flip,
                           train=True, seed=int(cfg.seed), rank=ranks.rank, world_size=ranks.world_size, **common)
    test = ResidentLoader(data.test, eval_batch_size(cfg, device), train=False, **common)
    fraction = float(cfg.trainer.bn_update_fraction)
    bn_split = data.train if fraction >= 1 else subset(data.train, max(batch_size, int(fraction * len(data.train))),
                                                       seed=int(cfg.seed) + 1)
    bn = ResidentLoader(bn_split, batch_size, pad=pad, flip=cfg.dataset.flip, train=True,
                        drop_last=False, seed=int(cfg.seed) + 1, **common)
    return train, test, bn


def check_batches_of_one(model: torch.nn.Module, train_loader, device: torch.device) -> None:
    """Refuse, before training, a model that cannot train on the batches of one image this run would give it
    (``trainer.batch_size=1``, or a training set of one image): BatchNorm1d, for one, cannot normalise a single
    sample in training mode. The loaders never make a last batch of one otherwise (they fold it into the one
    before), so this costs one forward pass of a copy of the model, and only in that case."""
    if getattr(train_loader, "batch_size", 2) > 1 and getattr(train_loader, "num_samples", 2) > 1:
        return
    import copy

    x, _ = next(iter(train_loader))
    probe = copy.deepcopy(model).to(device).train()
    try:
        with torch.no_grad():
            probe(x[:1].to(device))
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"{type(model).__name__} cannot train on a batch of one image ({exc}), and this run would "
                          "give it one: raise trainer.batch_size (and dataset.train_size) above 1") from None


def arguments_of(cls) -> list[str]:
    """The named arguments a method class takes, its bases' included when it hands the rest on (``**kwargs``)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters
        names += [p for p, v in params.items() if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL) and p not in names]
        if not any(v.kind == v.VAR_KEYWORD for v in params.values()):
            break
    return names


def build_method(cfg: DictConfig, epochs: int):
    """The base schedule and the method, from their config groups (the method's keys are its arguments:
    ``conf/method/swa.yaml`` reads SWA's from the model's recipe block ``model.swa``); each checks its own arguments."""
    kwargs = {}
    if "horizon" in cfg.schedule and cfg.schedule.horizon is None:  # null: the schedule spans the run
        kwargs["horizon"] = max(epochs, 1) if is_number(epochs) else 1  # (a bad trainer.epochs: the method says so)
    schedule = build(cfg.schedule, "schedule", **kwargs)
    from hydra.utils import get_class

    placement = ({"avg_device": str(cfg.run.avg_device)}  # where a method that keeps an average keeps it
                 if "avg_device" in arguments_of(get_class(str(cfg.method._target_))) else {})
    return build(cfg.method, "method", schedule=schedule, epochs=epochs, **placement)


def optimizer_spec(cfg: DictConfig) -> OptimizerSpec:
    """The run's optimizer (``conf/optimizer``): its class, its keyword arguments and timm's ``filter_bias_and_bn``."""
    block = OmegaConf.to_container(cfg.optimizer, resolve=True)
    target = block.pop("_target_", None)
    if not target:
        raise ConfigError("optimizer._target_ is missing: name a torch.optim class (optimizer=sgd or optimizer=adamw)")
    return OptimizerSpec(str(target), block, block.pop("filter_bias_and_bn", False))


def loss_spec(cfg: DictConfig) -> LossSpec:
    """The run's training loss (``conf/loss``); a key it does not have is named by ``build``."""
    return build(OmegaConf.create({"_target_": "swalab.losses.LossSpec", **cfg.loss}), "loss")


def settings_of(cfg: DictConfig, group: str):
    """``cfg.<group>`` (trainer, run) instantiated as its class (``swalab.settings``), which checks each value; a key
    the class lacks (added with ``+`` where no command line was checked) is refused."""
    cls = GROUPS[group]
    stray = [f"{group}.{k} is not a setting of {group} ({cls.__module__}.{cls.__name__}), so nothing would read it"
             for k in cfg[group] if k not in cls.__dataclass_fields__]
    if stray:
        raise InvalidSettings(stray)
    return OmegaConf.to_object(cfg[group])


def settings_problems(cfg: DictConfig) -> list[str]:
    """Every bad value of the trainer and run groups (:func:`settings_of`), for ``check_config`` to list."""
    problems = []
    for group in GROUPS:
        try:
            settings_of(cfg, group)
        except InvalidSettings as exc:
            problems += exc.errors
    return problems


def trainer_options(cfg: DictConfig, epochs: int) -> TrainerOptions:
    """The loop's options: the run's trainer and run settings (:func:`settings_of`), run for ``epochs``."""
    return TrainerOptions(**vars(settings_of(cfg, "trainer")) | vars(settings_of(cfg, "run")) | {"epochs": epochs})
