"""What earlier versions of swalab wrote, read under today's names: the one owner of old formats.

When it matters: a run directory, a checkpoint or a report input made by an earlier swalab (its config.yaml, its
identity.json) must compare equal to today's run of the same config, be rebuilt and scored as it was trained, and a
command line with a key that moved must be told where it lives now. Every rename, respelling and added key lives
here, once, as data, with the two readers that apply them:

* :func:`upgraded`: an identity (``{dotted key: value}``, ``swalab.identity``) under today's names;
* :func:`upgraded_config`: a resolved config (a run's ``config.yaml``) with its keys in today's places;
* :func:`moved_keys`: for a command line, where each moved key lives now.

This module imports nothing of swalab: the identity, the config checks and the report's readers import it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Identities written by earlier versions of swalab: they held a data folder's absolute path (a data set is its
# fingerprint now) and no fingerprint of the data. Comparing with one, these keys are not held against it.
RETIRED_KEYS = ("dataset.root", "dataset.root_is_data", "run.eval_every")
# Settings an earlier swalab recorded under other names: SWA's had a swa_ prefix (method.swa_lr, identity version
# 1), init_from was in run, the optimizer's settings in trainer. An identity of a run made then is read under today's
# names (:func:`upgraded`).
RENAMED = {"run.init_from": "model.init_from", "trainer.momentum": "optimizer.momentum",
           "trainer.weight_decay": "optimizer.weight_decay", "trainer.nesterov": "optimizer.nesterov",
           **{f"method.swa_{k}": f"method.{k}" for k in ("start", "start_epoch", "lr", "lr_min")}}
# Identity versions 2 to 5 held SWA's and FGE's settings as the model's recipe blocks they are read from today
# (model.swa.lr, model.fge.lr_max), the block of the run's own method only: today the method's keys hold them
# (method.lr). Configs of those runs held them there only; the method of this class (or name) reads this block.
RECIPE_BLOCKS = ("model.swa", "model.fge")
READS_BLOCK = {"swa": "swa", "swag": "swa", "fge": "fge"}  # by the class's name (method._target_), else the method's
# Settings whose values were spelled otherwise too: ``trainer.amp: true`` (bf16 autocast on CUDA) is
# ``trainer.precision: auto``, ``false`` is ``fp32``.
RESPELLED = {"trainer.amp": ("trainer.precision", {True: "auto", False: "fp32"})}
# Keys added since identities were first written, with the value that does what every run did before the key
# existed: an identity that lacks one is read as holding that value (:func:`upgraded`), so an earlier run of a
# config is the same run as today's at the defaults, and a run that sets the key otherwise is another.
ADDED_AT = {
    "optimizer._target_": "torch.optim.SGD", "optimizer.filter_bias_and_bn": False,
    "loss.label_smoothing": 0.0, "loss.mixup_alpha": 0.0, "loss.cutmix_alpha": 0.0, "loss.mix_prob": 1.0,
    "loss.switch_prob": 0.5, "loss.mix_mode": "batch",
    "schedule.warmup_epochs": 0.0,
    "trainer.clip_grad_norm": None, "trainer.accumulate": 1, "trainer.precision": "auto",
}
# Keys added since whose value before they existed was another key's, for one method: until method.diag_scale
# existed, SWAG sampled swag_diag at method.scale. An identity (or config) of such a run that lacks the key is read
# as holding that value, so an earlier SWAG run at scale 0.5 is another run than today's default (diag_scale 1.0):
# its swag_diag numbers were sampled with half the variance.
ADDED_AS = {"method.diag_scale": ("swag", "method.scale")}
# Identities written before a weights file counted by its content (identity version 3) held its path at these keys,
# and before a run directory counted as its source run (version 4, model.init_from=<run dir>) the directory's path:
# such a path is read as what is there today (``content``, which swalab.identity passes: the file's content, the
# source run), so a run of that config is the same run while the file or folder lies where it did; one moved since is
# another path, as it was then.
WEIGHTS_PATH_KEYS = ("model.init_from", "model.arch.pretrained_file")
# Run directory names before identity version 3 named every setting by its whole key (model.swa.lr-0.05, today
# swa.lr-0.05; swalab.identity.name_key) and a weights file by its path: swalab.upgrade renames such a directory.
SHORT_NAMES_SINCE = 3


def upgraded(identity: Mapping[str, Any], content: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """``identity`` under today's names and spellings (``RENAMED``, ``RESPELLED``, ``RECIPE_BLOCKS``), with the keys
    added since at the values that did what it did (``ADDED_AT``): an identity written by an earlier swalab compares
    equal to today's of the same config. Today's identities come back unchanged. ``content``: what a weights file's
    path holds (``swalab.identity.by_content``), for the paths earlier identities held (``WEIGHTS_PATH_KEYS``)."""
    out = {RENAMED.get(k, k): v for k, v in identity.items()}
    if content is not None:
        out.update({k: content(out[k]) for k in WEIGHTS_PATH_KEYS if k in out})
    for old, (new, values) in RESPELLED.items():
        if old in out:
            out[new] = values.get(out.pop(old), "<unknown>")
    for key in [k for k in out if any(k.startswith(block + ".") for block in RECIPE_BLOCKS)]:
        out["method." + key.split(".", 2)[2]] = out.pop(key)
    method = out.get("method.name")
    if out:  # not an empty identity (a run directory without one)
        out.update({k: v for k, v in ADDED_AT.items() if k not in out})
        for key, (for_method, source) in ADDED_AS.items():
            if method == for_method and key not in out and source in out:
                out[key] = out[source]
    return dict(sorted(out.items()))



# Keys of earlier versions and where they live now: how and where a run runs moved to the run group, SWA's prefixed
# settings to the model's recipe block (read by method.start, method.lr ... today), init_from to the model. SWA's and
# FGE's unprefixed settings (method.phase, method.lr_max) are today's keys again (identity version 6) and move nowhere.
MOVED_KEYS = {
    **{f"trainer.{k}": f"run.{k}" for k in ("device", "progress", "eval_batch_size", "compile", "channels_last",
                                           "eval_every", "deterministic")},
    "method.avg_device": "run.avg_device",  # where SWA's average and EMA's copy live: how a run runs, not what
    **{f"dataset.{k}": f"run.{k}" for k in ("cache_dir", "download", "num_workers", "prefetch_factor")},
    "run.init_from": "model.init_from",
    **{f"trainer.{k}": f"optimizer.{k}" for k in ("momentum", "weight_decay", "nesterov")},
    "trainer.amp": "trainer.precision",  # its values respelled: RESPELLED
    "method.swa_start": "model.swa.start", "method.swa_start_epoch": "model.swa.start_epoch",
    "method.swa_lr": "model.swa.lr", "method.swa_lr_min": "model.swa.lr_min",
}


def upgraded_config(config: dict) -> dict:
    """A resolved config written by an earlier swalab (a run's ``config.yaml``) with its moved keys in their places
    today (``MOVED_KEYS``; SWA's and FGE's settings into the method's keys from the recipe block it reads; ``trainer.amp``
    respelled as ``trainer.precision``) and the keys added since at the values that did what it did
    (``ADDED_AT``: the paper's SGD, plain cross-entropy, no warmup), so that the run can be rebuilt
    and scored again as it was trained. A config of today comes back unchanged."""
    out = copy.deepcopy(config)
    method = (out.get("method") or {}).get("name")

    def pop(dotted: str):
        group, _, key = dotted.partition(".")
        node = out.get(group)
        return node.pop(key) if isinstance(node, dict) and key in node else _MISSING

    def put(dotted: str, value) -> None:
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(leaf, value)

    for old, (new, values) in RESPELLED.items():  # trainer.amp: true -> trainer.precision: auto
        value = pop(old)
        if value is not _MISSING:
            put(new, values.get(value, value))
    for old, new in MOVED_KEYS.items():
        if new.startswith("model.swa.") and method != "swa":
            new = None
        value = pop(old)
        if value is not _MISSING and new is not None:
            put(new, value)
    node = out.get("method")
    block = (READS_BLOCK.get(str(node.get("_target_") or node.get("name") or "").rpartition(".")[2].lower())
             if isinstance(node, dict) else None)
    recipe = (out.get("model") or {}).get(block) if block else None
    if isinstance(recipe, dict):  # the method's keys read the block (versions 2 to 5 held them there only; version
        for key, value in recipe.items():  # 1's prefixed ones moved there above)
            node.setdefault(key, value)
    if block and not isinstance((config.get("model") or {}).get(block), dict):  # version 1 had no recipe block: the
        for key, value in node.items():                                         # method's settings make it
            if key not in ("_target_", "name", "budget"):
                put(f"model.{block}.{key}", value)
    if "trainer" in out:  # a run's config: the keys added since it was written, at the values that did what it did
        for key, value in ADDED_AT.items():
            put(key, value)
        for key, (for_method, source) in ADDED_AS.items():
            group, _, name = source.partition(".")
            if method == for_method and name in (out.get(group) or {}):
                put(key, out[group][name])
    return out


_MISSING = object()


def moved_keys(args: Sequence[str]) -> list[str]:
    """For each ``key=value`` among ``args`` whose key moved (``MOVED_KEYS``), a line saying where it lives now."""
    lines = []
    for arg in args:
        key = arg.lstrip("+~").split("=", 1)[0]
        if "=" in arg and key in RESPELLED:
            new, values = RESPELLED[key]
            spelled = {str(k).lower(): v for k, v in values.items()}.get(arg.split("=", 1)[1].lower(), "<value>")
            lines.append(f"{key} is now {new}: write {new}={spelled}")
        elif "=" in arg and key in MOVED_KEYS:
            lines.append(f"{key} is now {MOVED_KEYS[key]}: write {MOVED_KEYS[key]}={arg.split('=', 1)[1]}")
    return lines
