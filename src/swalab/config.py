"""OmegaConf resolvers used by ``conf/`` and the checks that run before anything is written.

Resolvers (registered on import of ``swalab``):

* ``${swalab.epochs:BUDGET,B}``: ``round(BUDGET * B)`` epochs, e.g. 1.5 budgets of a 200-epoch
  model is 300 epochs;
* ``${swalab.basename:PATH}``: a folder's own name (``dataset=folder`` names itself after its root);
* ``${swalab.classname:TARGET}``: a class's own name (``model=custom`` names itself after its class).

Checks, all before any file or folder is created:

* :func:`check_config`: types (an integer key given ``2.5`` or ``abc`` is a named error) and ranges
  of the keys ``swalab.train`` reads itself; each message names the key and what is allowed. The keys of
  a method, schedule, model or data set are checked by the object they configure, those of the trainer and
  run groups by their classes (``swalab.settings``).
* :func:`check_overrides`: a key added on the command line with ``+`` that nothing reads is refused;
* :func:`check_path_fits`: an output path the file system cannot hold (a name or the whole path too long)."""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def epochs_of_budget(budget: float, base: float) -> int:
    """``budget`` budgets of ``base`` epochs, rounded to whole epochs (1.25 x 150 = 188). A non-finite product
    (``method.budget=inf``) is returned as it is, for :func:`check_config` to refuse by name."""
    epochs = float(budget) * float(base)
    return int(round(epochs)) if math.isfinite(epochs) else epochs


def folder_name(path: str) -> str:
    """The last component of ``path`` (``/data/mnist28/`` -> ``mnist28``): a data folder's default name."""
    return Path(str(path).rstrip("/")).name or "folder"


def class_name(target: str) -> str:
    """The last component of an import path (``my_module.TinyNet`` -> ``TinyNet``): a custom model's default name."""
    return str(target).rsplit(".", 1)[-1]


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("swalab.epochs", epochs_of_budget, replace=True)
    OmegaConf.register_new_resolver("swalab.basename", folder_name, replace=True)
    OmegaConf.register_new_resolver("swalab.classname", class_name, replace=True)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what is allowed."""


# -- typed values ---------------------------------------------------------------------------------

def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float: NaN and inf are not numbers a setting can take (``nan <= low`` is False, so a
    range check alone would let them through)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_numbers(value: Any) -> bool:
    """A non-empty list of finite numbers (a per-channel ``mean`` or ``std``)."""
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
            and all(is_number(v) for v in value))


INT_LIMIT = 2 ** 63  # an integer setting reaches torch or numpy, which hold 64-bit integers ("Overflow when unpacking")


def kind_error(key: str, value: Any, kind: str) -> str | None:
    """The message for ``key=value`` when ``value`` is not of ``kind`` (``int``, ``number`` (finite),
    ``numbers`` (a list of finite numbers), ``bool``, ``str``); a trailing ``?`` allows null. None when it fits."""
    nullable = kind.endswith("?")
    if nullable:
        if value is None:
            return None
        kind = kind[:-1]
    ok = {"int": is_int, "number": is_number, "numbers": is_numbers, "bool": lambda v: isinstance(v, bool),
          "str": lambda v: isinstance(v, str)}[kind](value)
    if ok and kind == "int" and not -INT_LIMIT <= value < INT_LIMIT:  # torch and numpy take 64-bit integers
        return f"{key}={value!r} must be an integer below 2**63"
    if ok:
        return None
    wanted = {"int": "an integer", "number": "a finite number", "numbers": "a list of finite numbers",
              "bool": "true or false", "str": "a string"}[kind]
    return f"{key}={value!r} must be {wanted}" + (" or null" if nullable else "")


def require(key: str, value: Any, kind: str, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = False) -> Any:
    """``value`` when it is of ``kind`` and in range, else ``ConfigError`` naming ``key``.

    Used by methods, schedules and loaders to check their own arguments (their config keys)."""
    error = kind_error(key, value, kind)
    if error:
        raise ConfigError(error)
    if value is not None and (low is not None or high is not None):
        if isinstance(value, Sequence) and not isinstance(value, str):  # a per-channel list: every item in range
            for item in value:
                require(key, item, "number", low, high, low_open, high_open)
            return value
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            if high is None:
                span = f"{'>' if low_open else '>='} {low:g}"
            elif low is None:
                span = f"{'<' if high_open else '<='} {high:g}"
            else:
                span = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise ConfigError(f"{key}={value!r} must be {span}")
    return value


# The keys swalab.train reads itself, with their kind (see kind_error) and range; the trainer and run groups' are
# checked by their classes (swalab.settings).
KEYS: dict[str, tuple] = {
    "seed": ("int", 0, None),
    "dataset.train_size": ("int?", 1, None),
    "dataset.test_size": ("int?", 1, None),
    "dataset.image_size": ("int?", 1, None),
    "dataset.channels": ("int?", 1, None),
    "dataset.num_classes": ("int?", 1, None),
    "dataset.pad": ("int?", 0, None),
    "dataset.flip": ("bool", None, None),
    "model.budget_epochs": ("int", 0, None),
    "dataset.mean": ("numbers?", None, None),
    "dataset.std": ("numbers?", 0, None),
    "model.mean": ("numbers?", None, None),
    "model.std": ("numbers?", 0, None),
}
# keys whose lower bound is excluded (a value of exactly ``low`` is refused)
OPEN_LOW = ("dataset.std", "model.std")


AVG_DEVICES = ("train", "cpu")


def check_avg_device(avg_device: str) -> str:
    """``run.avg_device``: checked with the run's settings (``swalab.settings.RunSettings``) whatever the method, so that a typo
    is refused in every job of a grid over methods, not only in those of a method that keeps an average; a method
    built in Python (SWA, EMA) checks the argument it is given with it too."""
    if avg_device not in AVG_DEVICES:
        raise ConfigError(f"run.avg_device={avg_device!r} must be 'train' (the training device) or 'cpu'")
    return avg_device


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
COMPILE_OWN_GRAPHS = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs of their own


def compile_mode(compile: bool | str) -> str | None:
    """``run.compile`` as ``torch.compile``'s ``mode``: None for false (not compiled), ``default`` for true, else the
    mode it names (:data:`COMPILE_MODES`)."""
    if compile is False:
        return None
    if compile is True:
        return "default"
    if compile not in COMPILE_MODES:
        raise ConfigError(f"run.compile={compile!r} must be false, true or a torch.compile mode: "
                          f"{', '.join(COMPILE_MODES)}")
    return compile


def check_monitoring(eval_split: str, temperature_scaling: bool | str, has_val_split: bool) -> None:
    """``run.eval_split`` and ``run.temperature_scaling``, and that a run without a validation split asks for neither
    of what needs one."""
    if eval_split not in ("test", "val"):
        raise ConfigError(f"run.eval_split={eval_split!r} must be test or val")
    if eval_split == "val" and not has_val_split:
        raise ConfigError("run.eval_split=val monitors on the validation split, and this run has none: set "
                          "dataset.val_size=<images or a fraction>, or run.eval_split=test")
    if temperature_scaling not in ("auto", True, False):
        raise ConfigError(f"run.temperature_scaling={temperature_scaling!r} must be auto, true or false")
    if temperature_scaling is True and not has_val_split:
        raise ConfigError("run.temperature_scaling=true fits each temperature on the validation split, and this "
                          "run has none: set dataset.val_size=<images or a fraction>")


def invalid_config(errors: Sequence[str]) -> str:
    """The refusal of a config's bad values: one on one line (``invalid config: seed=-1 must be >= 0``), several as a
    list under ``invalid config:``, one a line."""
    if len(errors) == 1:
        return f"invalid config: {errors[0]}"
    return "invalid config:\n  - " + "\n  - ".join(errors)


def check_config(cfg: DictConfig, found: Sequence[str] = ()) -> None:
    """Raise ``ConfigError`` listing every bad value among the keys ``swalab.train`` reads (not just the first), with
    the errors ``found`` by the trainer and run settings' own checks (``swalab.settings``)."""
    errors: list[str] = list(found)
    missing = [k for k in ("dataset.root", "model.arch._target_", "model.init_from")
               if OmegaConf.is_missing(OmegaConf.select(cfg, k.rpartition(".")[0]), k.rpartition(".")[2])]
    if missing:  # '???' in a config: a value the user must give
        raise ConfigError(invalid_config([f"{k} is required: set {k}=..." for k in missing]))
    for key, (kind, low, high) in KEYS.items():
        if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            continue
        value = OmegaConf.select(cfg, key)
        try:
            require(key, value, kind, low, high, low_open=key in OPEN_LOW)
        except ConfigError as exc:
            errors.append(str(exc))
    if not str(OmegaConf.select(cfg, "paths.output_dir", default="outputs") or "").strip():
        errors.append("paths.output_dir is empty: give the directory that holds the runs (paths.output_dir=outputs)")
    if cfg.model.get("init_from") and cfg.run.get("branch_from"):
        errors.append("set model.init_from (weights only) or run.branch_from (full state), not both")
    if errors:
        raise ConfigError(invalid_config(errors))


def save_at_caveats(save_at, epochs: int) -> list[str]:
    """``run.save_at`` epochs beyond the run's ``epochs``: no checkpoint is kept for them. Said at launch, not refused:
    a grid over methods shares one list among runs of several lengths (SGD 1 B, SWA 1.5 B)."""
    beyond = [int(e) for e in save_at or () if int(e) > epochs]
    if not beyond:
        return []
    return [f"run.save_at={[int(e) for e in save_at]}: epoch{'s' if len(beyond) > 1 else ''} "
            f"{', '.join(map(str, beyond))} {'are' if len(beyond) > 1 else 'is'} beyond this run's trainer.epochs="
            f"{epochs}, so no checkpoint is kept for {'them' if len(beyond) > 1 else 'it'}"]


def check_path_fits(path: str | Path, key: str, fix: str, inside: int = 0, sibling: int = 0) -> None:
    """Raise ``ConfigError`` when the file system cannot hold ``path`` (set by ``key``): a folder name longer than its
    ``PC_NAME_MAX`` (255 bytes on most), or the whole path, with ``inside`` more characters for the files written
    below it, longer than its ``PC_PATH_MAX`` (4096). ``sibling``: characters a temporary name beside ``path`` adds
    to its last name (a report's work folder). Checked before anything is created: otherwise the folders made
    before the name that does not fit, and a run's ``.lock``, stay behind an ``[Errno 36] File name too long``.
    ``fix`` says what to shorten."""
    path = Path(os.path.abspath(path))
    existing = next(p for p in [*path.parents, path][::-1] if exists(p))
    name_max, path_max = limit_of(existing, "PC_NAME_MAX", 255), limit_of(existing, "PC_PATH_MAX", 4096)
    for part in path.parts[1:]:
        size = len(os.fsencode(part)) + (sibling if part == path.name else 0)
        if size > name_max:
            raise ConfigError(f"{key}: the folder name {part[:20]}... in it is {size} bytes"
                              + (" with the temporary name made beside it" if sibling and part == path.name else "")
                              + f", over the {name_max} the file system allows in a name: {fix}")
    if len(os.fsencode(str(path))) + inside >= path_max:
        raise ConfigError(f"{key}: {str(path)[:40]}... is {len(os.fsencode(str(path)))} bytes long; with the files "
                          f"written below it (up to {inside} more) that is over the {path_max} the file system allows "
                          f"in a path: {fix}")


def exists(path: Path) -> bool:
    """``path.exists()``, False for a path too long to ask about."""
    try:
        return path.exists()
    except OSError:
        return False


def limit_of(path: Path, name: str, default: int) -> int:
    """The file system's ``os.pathconf`` limit ``name`` at ``path``, or ``default`` where it has none to tell."""
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError):
        return default


# -- keys added on the command line ------------------------------------------------------------

# Blocks handed whole to a constructor: a key added there with '+' is an argument, checked by it.
OPEN_BLOCKS = ("model.arch", "dataset.source", "method", "schedule", "optimizer")


def split_override(override: str) -> tuple[str, str, str] | None:
    """``"+a.b=1"`` -> ``("+", "a.b", "1")``; None for an override without a value (``~a.b``)."""
    match = re.match(r"^(\+\+|\+|~)?([^=]+)=(.*)$", override.strip())
    if not match:
        return None
    return match.group(1) or "", match.group(2).strip(), match.group(3)


def check_overrides(overrides: Sequence[str], groups: Sequence[str]) -> None:
    """Refuse ``+key=value`` overrides that add a key nothing reads.

    ``groups`` are the config groups (``+sweep=...`` selects one and is fine). A key added inside one
    of ``OPEN_BLOCKS`` is passed to that block's constructor, which refuses it if it has no such
    argument; anywhere else an added key would be silently ignored, so it is refused here."""
    errors = []
    for override in overrides:
        parts = split_override(override)
        if parts is None or not parts[0].startswith("+"):
            continue
        key = parts[1]
        if key in groups or any(key.startswith(block + ".") for block in OPEN_BLOCKS):
            continue
        errors.append(f"{override}: swalab reads no key {key!r}, so the value would be ignored. The keys it reads "
                      "are in conf/ (`python run.py --cfg job` prints them); set an existing one without '+'")
    if errors:
        raise ConfigError("invalid override:\n  - " + "\n  - ".join(errors))


def unknown_key(exc: BaseException) -> str | None:
    """One line for Hydra's refusal of a command line's key that no block of the config has (``model.swa.strat=0.5``,
    a misspelling Hydra would print in seven lines, exit 1, telling the user to append it with ``+``): the override,
    the block, and the block's key nearest in spelling. None for another error (``run.py`` says it in Hydra's words)."""
    import difflib

    cause = exc.__cause__
    block, key, typed = (getattr(cause, name, None) for name in ("parent_node", "key", "full_key"))
    if not isinstance(block, DictConfig) or key is None or not typed:
        return None
    where = str(typed).rpartition(".")[0]
    near = difflib.get_close_matches(str(key), [str(k) for k in block.keys()], n=1)
    override = re.search(r"use \+(\S+=.*)$", str(exc), re.MULTILINE)  # as typed: Hydra's hint to append it
    meant = f", did you mean {where + '.' if where else ''}{near[0]}?" if near else ""
    return (f"{override.group(1) if override else typed}: {where or 'the config'} has no key {str(key)!r}{meant} "
            "(`python run.py --cfg job` prints every key)")


def build(node: DictConfig, key: str, **kwargs) -> Any:
    """Instantiate ``node`` (with ``kwargs`` added), naming ``<key>.<arg>`` when it has no such argument.

    Errors the target raises itself (``ValueError`` from a check, ``FileNotFoundError`` from a loader)
    reach the caller unwrapped, so their messages stay as the target wrote them."""
    from hydra.utils import get_method, instantiate

    factory = instantiate(node, _partial_=True, _convert_="all")
    try:
        return factory(**kwargs)
    except TypeError as exc:
        match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if not match:
            raise
        target = get_method(node._target_)
        takes = [p for p in inspect.signature(target).parameters
                 if p not in ("self", "args", "kwargs", *kwargs)]  # what the config may set, not what swalab passes
        raise ConfigError(f"{key}.{match.group(1)} is not a setting of {key} ({node._target_}); it takes: "
                          f"{', '.join(takes)}") from None


def default_choices(config_dir: Path = CONF_DIR, config_name: str = "config") -> dict[str, Any]:
    """The option each config group takes by default (the primary config's defaults list)."""
    import yaml

    primary = yaml.safe_load((config_dir / f"{config_name}.yaml").read_text()) or {}
    out: dict[str, Any] = {}
    for entry in primary.get("defaults", []):
        if not isinstance(entry, dict):
            continue
        for group, option in entry.items():
            group = str(group).removeprefix("optional ").strip()
            if not group.startswith("override "):
                out[group] = option
    return out
