"""Step 1 of a run: every check that needs no data and writes nothing, and the run's directory.

:func:`prepare` checks the config (types, ranges, keys nothing reads, the device, the method's own
checks), computes the run's identity (``swalab.identity``) and its directory, and looks at what that
directory holds: a finished run of the same identity is skipped, a run of another identity is refused
with the keys that differ."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from swalab.checkpoint import CheckpointStore
from swalab.config import (ConfigError, check_config, check_overrides, check_path_fits, default_choices,
                           save_at_caveats, split_override)
from swalab.data.fingerprint import changes
from swalab.identity import (DATA_FINGERPRINT, IDENTITY_FILE, IDENTITY_VERSION, METHOD_RECIPES, READ_THROUGH,
                             TRAINING_GROUPS, differences, flat, group_hash, identity_of, method_trains, name_items,
                             run_name, settings_apart, stored_identity)
from swalab.logs import get_logger
from swalab.graphed import check_graph_mode
from swalab.precision import check_precision
from swalab.train.build import build_method, data_files_record, loss_spec, optimizer_spec, settings_problems
from swalab.tracking import RECORD_FILE
from swalab.rundir import DamagedRecord, RunDir, read_json
from swalab.distributed import select_device


@dataclass(frozen=True)
class RunPlan:
    """An accepted config, ready to train: where, as what, and what it has already checked. Immutable: what a
    later step learns (the fingerprint of data downloaded while the run is built) makes a new plan
    (``dataclasses.replace``), so a plan says exactly what :func:`prepare` checked."""

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
    data_record: dict | None = None       # the files the data set reads (swalab.data.fingerprint), when known
    settings: dict | None = None          # what sets it apart from its defaults, in user keys (apart_from_defaults)

    @property
    def skips(self) -> bool:
        """Whether the run is skipped, not trained: its directory holds this config's finished run (``finished``)."""
        return self.finished is not None


def locate(cfg: DictConfig, identity: dict, apart: dict | None, choices: dict | None) -> Path:
    """The run directory: ``run.dir`` when set, else the name ``swalab.identity.run_name`` makes from what sets the
    run apart from its defaults. A run of this config that an earlier swalab named otherwise is refused with the
    command that renames it (:func:`earlier_run_dir`), never trained again beside it."""
    if cfg.run.get("dir"):
        return fits(cfg, Path(str(cfg.run.dir)))
    names = {"dataset": str(cfg.dataset.name), "model": str(cfg.model.name), "method": str(cfg.method.name)}
    named = fits(cfg, Path(str(cfg.paths.output_dir)) / run_name(names, cfg.seed, apart, choices or {},
                                                                  group_hash(identity)))
    earlier = earlier_run_dir(named, identity)
    if earlier is None:
        return named
    seed = earlier.name == named.name
    where, today = (earlier, named) if seed else (earlier.parent, named.parent)
    version = (read_json(earlier / IDENTITY_FILE) or {}).get("version")
    fix = (f"move it there (mv {where} {today})" if version is None else  # named from the command line: no record
           f"rename it with python -m swalab.upgrade {where} --write")
    raise ConfigError(f"{'the run' if seed else 'other seeds'} of this config {'is' if seed else 'are'} in {where}, "
                      f"named by an earlier swalab; its name today is {today}: {fix} and run the same command again to "
                      "continue or skip it, or give this run a directory of its own with run.dir=<dir>")


# Room for the longest path a run writes below its directory (checkpoints/predictions/fge_member_012_val.pt.<random>.tmp
# is 58 characters; W&B's files under wandb/ a few more), checked before the directory is made (check_path_fits).
RUN_FILES_ROOM = 100


def fits(cfg: DictConfig, run_dir: Path) -> Path:
    """``run_dir`` once the file system is known to hold it and the files a run writes below it
    (``swalab.config.check_path_fits``), before anything is created; the refusal names the key that placed it."""
    check_path_fits(run_dir, "run.dir" if cfg.run.get("dir") else "paths.output_dir",
                    "give a shorter paths.output_dir (all runs), or place this run with a shorter run.dir=<dir>",
                    inside=RUN_FILES_ROOM)
    return run_dir


def earlier_run_dir(named: Path, identity: dict) -> Path | None:
    """A run directory beside ``named`` (same data set, model and method) that an earlier swalab named otherwise
    (its ``identity.json`` of an earlier identity version, or none) and that holds this config: of this seed when
    ``named`` does not exist, of any seed when no seed of the config is under today's name yet."""
    if named.exists() or not named.parent.parent.is_dir():
        return None
    pattern = f"*/{named.name}" if named.parent.exists() else "*/seed*"
    for candidate in sorted(named.parent.parent.glob(pattern)):
        version = (read_json(candidate / IDENTITY_FILE) or {}).get("version")
        if candidate.parent == named.parent or (version or 0) >= IDENTITY_VERSION:
            continue
        theirs = stored_identity(candidate)
        if theirs is not None and all(d.startswith("seed:") for d in differences(identity, theirs)):
            return candidate
    return None


def identity_for(cfg: DictConfig) -> tuple[dict, dict, dict | None]:
    """The run's identity (``swalab.identity.identity_of``: the resolved config and the fingerprint of the data
    it reads), the resolved config, and the record of the data's files (None when they are not there yet)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    data_record = data_files_record(cfg)
    return (identity_of(resolved, data_record["fingerprint"] if data_record else None),
            resolved, data_record)


# Group choices that name the run's place (its directory and table row), not a setting that sets it apart.
PLACE_GROUPS = ("dataset", "model", "method", "experiment", "sweep", "dataset_model", "logger", "paths")


def interpolation_sources(cfg: DictConfig, keys, follow: bool = True) -> dict[str, str]:
    """For each of ``keys`` whose value in ``cfg`` is a plain interpolation (``method.lr: ${model.swa.lr}``), the key
    it reads, followed to the last one of a chain unless not ``follow``."""
    out = {}
    for key in keys:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        try:
            raw = node._get_node(leaf)._value() if OmegaConf.is_dict(node) else None
        except (AttributeError, KeyError):
            raw = None
        match = re.fullmatch(r"\$\{([A-Za-z0-9_.]+)\}", raw) if isinstance(raw, str) else None
        if match:
            read = match.group(1)
            out[key] = interpolation_sources(cfg, [read]).get(read, read) if follow else read
    return out


def defaults_of(cfg: DictConfig, choices: dict | None) -> DictConfig | None:
    """The config of the run's group choices without the command line's key overrides: what a run is named against
    (:func:`apart_from_defaults`) and where a key's interpolation is read (:func:`check_typed_values_read`). None when
    no Hydra application is running to compose it (a config built in Python), or the defaults cannot be composed."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if not choices or not GlobalHydra.instance().is_initialized():
        return None
    primary = default_choices()
    overrides = [f"{'' if g in primary else '+'}{g}={v}" for g, v in choices.items()
                 if v is not None and not g.startswith("hydra") and g != "dataset_model"]
    try:
        default = compose(config_name="config", overrides=overrides)
    except Exception:  # noqa: BLE001  defaults that do not compose: no record, the report falls back
        return None
    for key in ("dataset.root", "model.arch._target_"):  # values the defaults leave to the user ('???')
        parent, _, leaf = key.rpartition(".")
        if OmegaConf.is_missing(OmegaConf.select(default, parent), leaf):
            OmegaConf.update(default, key, OmegaConf.select(cfg, key), force_add=True)
    return default


def apart_from_defaults(cfg: DictConfig, identity: dict, choices: dict | None,
                        default: DictConfig | None) -> dict | None:
    """What sets this run apart from ``default``, the config of the same group choices without the command line's
    key overrides (:func:`defaults_of`; ``identity.settings_apart``); None without it."""
    if default is None:
        return None
    try:
        default_identity = identity_of(OmegaConf.to_container(default, resolve=True), identity.get(DATA_FINGERPRINT))
    except Exception:  # noqa: BLE001  a config the defaults cannot resolve: no record, the report falls back
        return None
    primary = default_choices()
    trains = method_trains({"method": {"_target_": cfg.method.get("_target_")}})  # else no training group counts
    changed_groups = {g: v for g, v in choices.items() if g not in PLACE_GROUPS and not g.startswith("hydra")
                      and v != primary.get(g) and (trains or g not in TRAINING_GROUPS)}
    # each key under the name the defaults read it by (method.lr as model.swa.lr), however it was typed: one name
    return settings_apart(identity, default_identity, interpolation_sources(default, identity), changed_groups)


def check_typed_values_read(cfg: DictConfig, overrides: Sequence[str], default: DictConfig | None) -> None:
    """Refuse a command line that types a value no setting reads: a key read only through another
    (``identity.READ_THROUGH``: ``model.swa.lr``, read by ``method.lr: ${model.swa.lr}``; ``model.lr``, read by
    ``schedule.lr``) typed beside every key that reads it, at another value (``model.swa.lr=0.05 method.lr=0.06``
    trains at 0.06 whatever the order: the 0.05 would be dropped without a word)."""
    if default is None:
        return
    typed = {parts[1]: parts[2] for parts in map(split_override, overrides) if parts and parts[0] in ("", "++")}
    read = [k for k in typed if k.startswith(READ_THROUGH) and OmegaConf.select(cfg, k, default=None) is not None]
    if not read:  # the common command line: nothing to look up
        return
    sources = interpolation_sources(default, flat(OmegaConf.to_container(default, resolve=False)), follow=False)
    for key in read:
        readers = [k for k, source in sources.items() if source == key]
        if not readers or any(k not in typed for k in readers):
            continue
        overruled = [k for k in readers if OmegaConf.select(cfg, k) != OmegaConf.select(cfg, key)]
        if overruled:
            reader = overruled[0]
            raise ConfigError(f"{key}={typed[key]} is read only by {reader}, which this command sets itself "
                              f"({reader}={typed[reader]}), so {key}={typed[key]} would change nothing: give one "
                              f"of the two ({key} names the run either way)")


def validate(cfg: DictConfig):
    """Every check of ``cfg`` that needs no data and writes nothing; returns the (checked) method.

    The config's own keys (``check_config``, the trainer and run groups' by their classes), the device, the optimizer and the loss, and the schedule and method,
    which check their own arguments when built and their combination in ``validate``. A refusal names the key the
    user sets (:func:`in_user_keys`), not the key that reads it."""
    with named_as_typed(cfg):
        check_recipe_read(cfg)
        check_config(cfg, settings_problems(cfg))
        select_device(str(cfg.run.device))
        optimizer_spec(cfg).check()
        loss_spec(cfg)
        check_precision(str(cfg.trainer.precision))
        check_graph_mode(str(cfg.run.cuda_graphs))
        method = build_method(cfg, cfg.trainer.epochs)  # the method checks trainer.epochs (an integer >= 0)
        method.validate(initialized=bool(cfg.model.get("init_from") or cfg.run.get("branch_from")
                                         or cfg.model.get("pretrained")))
        if method.needs_validation_split and not cfg.dataset.get("val_size"):
            raise ConfigError(f"method={method.name} {method.needs_validation_split}, and this run has none: set "
                              "dataset.val_size (e.g. dataset.val_size=5000)")
    return method


@contextmanager
def named_as_typed(cfg: DictConfig) -> Iterator[None]:
    """A ``ConfigError`` raised inside re-raised with its keys named as a user sets them (:func:`in_user_keys`)."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(in_user_keys(cfg, str(exc))) from None


def check_recipe_read(cfg: DictConfig) -> None:
    """Refuse a method key that reads a recipe block's key the model lacks (a model's yaml of one's own not started
    from the base recipe), and a key of a recipe block the run's method reads (``model.swa`` for SWA:
    ``identity.METHOD_RECIPES``) that names none of its settings (each ``method.<key>`` reads ``model.swa.<key>``): an
    experiment's misspelt ``model.swa.strat`` would otherwise change nothing without a word."""
    sources = interpolation_sources(cfg, [f"method.{k}" for k in cfg.method], follow=False)
    for source in sources.values():
        if source.startswith(METHOD_RECIPES) and OmegaConf.select(cfg, source, default=KeyError) is KeyError:
            raise ConfigError(f"method={cfg.method.get('name')} reads {source}, which model={cfg.model.get('name')} "
                              "lacks: start the model's yaml from the base recipe (defaults: [/recipe/paper@_here_], "
                              f"conf/recipe/paper.yaml), or give {source}=...")
    for block in (b for b in METHOD_RECIPES if any(k.startswith(b + ".") for k in sources.values())):
        keys = OmegaConf.select(cfg, block) or {}
        stray = [k for k in keys if k not in cfg.method]
        if stray:
            raise ConfigError(f"{block}.{stray[0]} is read by no setting of method={cfg.method.get('name')}, so it "
                              f"would change nothing: {block} has {', '.join(k for k in cfg.method if k in keys)}")


KEY_IN_MESSAGE = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.\w+)+)")


def in_user_keys(cfg: DictConfig, message: str) -> str:
    """``message`` with each ``<key>`` whose key only reads another (``schedule.lr: ${model.lr}``,
    ``trainer.weight_decay: ${model.weight_decay}``) named by the key it reads, the one a user sets: a bad
    ``model.lr=nan`` is refused as ``model.lr=nan``, not as ``schedule.lr=nan``. A key given a value of its own on
    the command line is no interpolation and keeps its name."""
    sources = interpolation_sources(cfg, sorted(set(KEY_IN_MESSAGE.findall(message))))
    for key, source in sources.items():
        message = re.sub(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", source, message)
    return message


def run_record(run_dir: Path) -> str | None:
    """The file that marks ``run_dir`` as a swalab run, or None: its ``identity.json`` (holding an identity), else
    checkpoints named as swalab names them (each carries its run's identity, checked when one is resumed), else its W&B
    record (``wandb_run.json``), else a ``config.yaml`` holding a resolved swalab config (a run of an earlier swalab wrote no identity.json), which names
    its seed, data set, model and method."""
    if isinstance((read_json(run_dir / IDENTITY_FILE) or {}).get("identity"), dict):
        return IDENTITY_FILE
    if CheckpointStore(run_dir).paths():
        return RunDir.CHECKPOINTS
    if (run_dir / RECORD_FILE).is_file():  # the W&B run of a run: a name only swalab writes
        return RECORD_FILE
    config = RunDir(run_dir).config() or {}
    if "seed" in config and all(isinstance(config.get(g), dict)
                                                             for g in ("dataset", "model", "method")):
        return RunDir.CONFIG
    return None


def check_not_foreign(run_dir: Path) -> None:
    """Refuse ``run_dir`` when it is no swalab run (:func:`run_record`) yet holds a file of a name a run writes
    (``RunDir.FILES``): the run would write over a file of the user's (their own ``history.jsonl``)."""
    if run_record(run_dir) is not None or not run_dir.is_dir():
        return
    clashes = [name for name in RunDir.FILES if (run_dir / name).exists()]
    if clashes:
        raise ConfigError(f"{run_dir} is not a swalab run (no identity.json, no config.yaml of a run) but holds "
                          f"{', '.join(clashes)}, which a run writes: nothing there is touched. Give the run a new or "
                          "empty folder with run.dir=<dir>")
    inner = next(run_dir.rglob(IDENTITY_FILE), None)  # an outputs folder typed as run.dir
    if inner is not None:
        raise ConfigError(f"{run_dir} is not a swalab run but holds runs ({inner.parent.relative_to(run_dir)}): "
                          f"nothing there is touched. paths.output_dir={run_dir} places runs under it; run.dir=<dir> "
                          "takes a new or empty folder")


def inspect_run_dir(run_dir: Path, identity: dict, resume, data_record: dict | None = None,
                    again: bool = False) -> dict | None:
    """What ``run_dir`` holds, checked against this run: the metrics of a finished run of the same
    identity (to skip it), None for a new or interrupted one; refused when it holds another config, or the
    same config on data that changed since (naming the class folders that did), or is no run but holds files a run
    writes (:func:`check_not_foreign`). ``again``: a second look (under the run's lock), which says nothing the first
    one said."""
    check_not_foreign(run_dir)
    theirs = stored_identity(run_dir)
    diffs = differences(identity, theirs) if theirs is not None else []
    if [d for d in diffs if d.startswith(DATA_FINGERPRINT + ":")] and len(diffs) == 1:
        then = RunDir(run_dir).read_json(RunDir.DATA)
        what = changes(then["record"], data_record) if then and data_record else "its files differ"
        raise ConfigError(f"{run_dir} holds this config's run on other data: the data set changed since it was "
                          f"made ({what}). Nothing there is touched. Restore the data to continue that run, or train "
                          "on the new data in a directory of its own with run.dir=<dir>")
    if diffs:
        raise ConfigError(f"{run_dir} holds a run of another config (" + "; ".join(diffs[:8])
                          + "): nothing there is touched. Re-run with that config to continue it, or give this "
                          "one its own directory with run.dir=<dir>")
    unfingerprinted = theirs is not None and DATA_FINGERPRINT in identity and DATA_FINGERPRINT not in theirs
    try:
        metrics = RunDir(run_dir).final_metrics()
    except DamagedRecord as exc:  # the run is scored again from its last checkpoint, which overwrites it
        (get_logger().debug if again else get_logger().warning)(f"[swalab] {exc}: ignored; " + (
            "the run continues from its newest checkpoint (after the last epoch: only the final scoring runs again) "
            "and writes it anew" if CheckpointStore(run_dir).paths() else "its resume checkpoints were deleted when it "
            "finished (run.keep_finished_checkpoints=false), so it trains again from the start and writes it anew"))
        metrics = None
    if unfingerprinted and not again:  # this config's own run, made before runs recorded their data
        get_logger().warning(f"[swalab] {run_dir} was made by a swalab that did not fingerprint its data: whether its "
                             "data changed since cannot be checked" + ("" if metrics is not None else
                                                                      "; from now on they are (data.json)"))
    if metrics is not None:
        if resume is False:
            raise FileExistsError(f"{run_dir} already holds a finished run and run.resume=false: nothing is "
                                  "overwritten. Choose another directory with run.dir=<dir>")
        return metrics
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
    its name tags the W&B run."""
    default = defaults_of(cfg, choices)
    if overrides is not None:
        check_overrides(overrides, list(choices or {}))
        check_typed_values_read(cfg, overrides, default)
    method = validate(cfg)
    for caveat in [*method.caveats(), *save_at_caveats(cfg.run.get("save_at"), method.epochs)]:
        get_logger().warning(f"[swalab] {in_user_keys(cfg, caveat)}")
    device = select_device(str(cfg.run.device))
    identity, resolved, data_record = identity_for(cfg)
    settings = apart_from_defaults(cfg, identity, choices, default)
    with named_as_typed(cfg):  # a refusal names what differs by the keys a user sets (model.swa.lr, not method.lr)
        run_dir = fits(cfg, Path(run_dir)) if run_dir is not None else locate(cfg, identity, settings, choices)
        finished = inspect_run_dir(run_dir, identity, cfg.run.resume, data_record)
    apart = tuple(name_items(settings)[0])
    for line in method.unkept(run_dir, finished) if finished is not None else ():
        get_logger().warning(f"[swalab] {run_dir}: {line}")
    return RunPlan(cfg=cfg, run_dir=run_dir, identity=identity, resolved=resolved,
                   overrides=None if overrides is None else list(overrides), device=device, method=method,
                   apart=apart, grid=None if grid is None else Path(str(grid)).name, finished=finished,
                   data_record=data_record, settings=settings)
