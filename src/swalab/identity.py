"""Run identity: which runs are the same run, and where a run lives.

A run *is* its resolved config minus the keys that cannot change its results. Two runs with the
same identity are the same experiment (re-running one resumes or skips it); two runs that differ in
any identity key are different experiments, and nothing in swalab treats them as one: a run
directory refuses a config of another identity (naming the keys that differ), a checkpoint of
another identity is never resumed, and a report cell never pools them.

What is *not* part of the identity (``NON_RESULT`` and ``READ_THROUGH``, both documented below):

* ``NON_RESULT``: where things are and how they are shown or sped up: paths, the logger, the
  device, progress bars, the evaluation batch size, ``torch.compile`` and memory layout, data
  loader workers, run handling (resume, checkpoint cadence, ``run.save_at``, ``run.branch_from``:
  a branch equals the straight-through run, see ``swalab.branching``);
* ``READ_THROUGH``: recipe values that the run reads only through other keys, whose resolved values
  are part of the identity (``model.lr`` is read as ``schedule.lr``, ``model.swa.*`` as
  ``method.*``, the loader's ``dataset.source.*`` are copies of ``dataset.*`` and ``seed``).

Keys outside the groups a run consumes (``seed``, ``dataset``, ``model``, ``method``, ``schedule``,
``trainer``, ``run``) are left out too: an experiment's helper keys reach the run only through them.

The identity is stored in the run directory (``identity.json``: the canonical form and a short hash)
and in every checkpoint. ``group_hash`` is the identity minus the seed: the seeds of one config share
it (a report cell, a W&B group).

Run directories are ``<paths.output_dir>/[<experiment>/][<sweep>/]<dataset>/<model>/<method>/<rest>/seed<N>``
where ``<rest>`` names every group choice that differs from the default (``schedule-cosine``) and every
command-line override of a key that can change results (``trainer.epochs-6``), joined by ``+``, or
``default``. The name uses only characters a shell and a Hydra override take unquoted (letters,
digits and ``_ - . +``), so a run directory can be passed as ``run.init_from=<dir>`` as it is. When
an override's value needs other characters, or the name grows long, the group hash is appended
(``+id-<hash>``) so that two configs never share a name.
A name follows the command line, so one config can get two names (an override the method never
reads); ``swalab.train.plan.same_run_elsewhere`` then finds the run already made under the other.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CONSUMED = ("seed", "dataset", "model", "method", "schedule", "trainer", "run")

# Keys (and subtrees) that cannot change a run's results.
NON_RESULT = (
    "run.dir", "run.resume", "run.branch_from", "run.save_at", "run.checkpoint_every", "run.keep_checkpoints",
    "dataset.root", "dataset.download", "dataset.cache_dir", "dataset.num_workers", "dataset.prefetch_factor",
    "trainer.device", "trainer.progress", "trainer.eval_batch_size", "trainer.compile", "trainer.channels_last",
    "logger", "paths", "hydra",
)
# Keys whose values the run reads only through other identity keys (interpolations of them).
READ_THROUGH = (
    "dataset.source",
    "model.lr", "model.weight_decay", "model.budget_epochs", "model.swa", "model.fge",
    "model.pretrained", "model.pretrained_file",
)
# Keys a branch (``run.branch_from``) may change; ``swalab.branching.check_branch`` checks the rest of
# what matters (the learning rate of every epoch before the branch point, momentum, weight decay).
BRANCH_MAY_DIFFER = ("method", "trainer.epochs", "schedule", "trainer.eval_every")

IDENTITY_FILE = "identity.json"
DATA_FINGERPRINT = "data.fingerprint"
# Identities written by earlier versions of swalab: they held a data folder's absolute path (a data set is its
# fingerprint now) and no fingerprint of the data. Comparing with one, these keys are not held against it.
RETIRED_KEYS = ("dataset.root", "dataset.root_is_data")
ADDED_KEYS = (DATA_FINGERPRINT,)
SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
MAX_REST = 100  # characters of <rest> before the group hash replaces the tail


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, Mapping):
        if not node:
            out[prefix] = {}
        for k, v in node.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(node, (list, tuple)):
        out[prefix] = [_plain(v) for v in node]
    else:
        out[prefix] = node


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def identity_of(resolved: Mapping[str, Any], data_fingerprint: str | None = None) -> dict[str, Any]:
    """The identity of a resolved config (a plain dict): ``{dotted key: value}`` of every key that counts,
    and ``data.fingerprint``, the fingerprint of the files the run reads (``swalab.data.fingerprint``), when
    known. A data set is what its files hold, never where they lie: ``dataset.root`` does not count, so a
    folder copied elsewhere is the same data set and a folder whose images changed is another one.
    """
    flat: dict[str, Any] = {}
    for root in CONSUMED:
        if root in resolved:
            _flatten(resolved[root], root, flat)
    identity = {k: v for k, v in flat.items() if not (_under(k, NON_RESULT) or _under(k, READ_THROUGH))}
    if data_fingerprint is not None:
        identity[DATA_FINGERPRINT] = data_fingerprint
    return dict(sorted(identity.items()))


def canonical(identity: Mapping[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)


def identity_hash(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:12]


def without_seed(identity: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in identity.items() if k != "seed"}


def group_hash(identity: Mapping[str, Any]) -> str:
    """The hash of the identity minus the seed: shared by every seed of one config."""
    return identity_hash(without_seed(identity))


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """``key: <theirs> there, <ours> here`` for every key whose values differ (absent keys included, but for
    the keys an earlier swalab recorded or did not: ``RETIRED_KEYS``, ``ADDED_KEYS``)."""
    out = []
    for key in sorted(set(ours) | set(theirs)):
        if _under(key, ignore):
            continue
        if (key in RETIRED_KEYS and key not in ours) or (key in ADDED_KEYS and key not in theirs):
            continue  # an identity written by an earlier swalab (RETIRED_KEYS)
        a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
        if a != b:
            out.append(f"{key}: {b!r} there, {a!r} here")
    return out


def record(identity: Mapping[str, Any], apart: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``identity.json`` holds: the hashes, the canonical identity, and what sets the run apart from its
    defaults (:func:`settings_apart`, when known; not part of the hashes)."""
    out = {"hash": identity_hash(identity), "group": group_hash(identity), "identity": dict(identity)}
    if apart is not None:
        out["apart"] = dict(apart)
    return out


def settings_apart(identity: Mapping[str, Any], default: Mapping[str, Any], sources: Mapping[str, str],
                   choices: Mapping[str, Any] = {}) -> dict[str, Any]:
    """What sets a run apart from the default config of its data set, model and method, in the keys a user types.

    ``default`` is the identity of the config composed with the run's own group choices and no other override;
    ``sources`` names, for a key read through an interpolation (``method.swa_lr: ${model.swa.lr}``), the key it
    reads (``model.swa.lr``), which is the one a user types and the one shown; ``choices`` are the group choices
    that differ from the primary config's (``schedule: cosine``), shown first as ``schedule``. The data set's
    fingerprint and the seed are not settings. Returns ``{key: value}`` in that order, sorted within each part.
    """
    out: dict[str, Any] = {str(g): v for g, v in sorted(choices.items())}
    for key in sorted(set(identity) | set(default)):
        if key == "seed" or key.startswith("data."):
            continue
        if identity.get(key, "<absent>") != default.get(key, "<absent>"):
            out.setdefault(sources.get(key, key), identity.get(key, "<absent>"))
    return out


def label_of(apart: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """``schedule=cosine, model.swa.lr=0.05``: a settings-apart record (or the ``keys`` of it) as a label."""
    return ", ".join(f"{k}={_shown(v)}" for k, v in apart.items() if keys is None or k in keys)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def stored_identity(run_dir: str | Path) -> dict[str, Any] | None:
    """The identity of the run in ``run_dir``: ``identity.json``, else computed from its ``config.yaml``."""
    run_dir = Path(run_dir)
    path = run_dir / IDENTITY_FILE
    if path.exists():
        try:
            return dict(json.loads(path.read_text())["identity"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    config = run_dir / "config.yaml"
    if config.exists():
        import yaml

        try:
            return identity_of(yaml.safe_load(config.read_text()) or {})
        except yaml.YAMLError:
            return None
    return None


# -- run directory names ------------------------------------------------------------------------

def _safe(text: str) -> tuple[str, bool]:
    """``text`` with every character outside ``[A-Za-z0-9_.-]`` replaced; and whether it was exact."""
    cleaned = SAFE.sub("_", text)
    return cleaned, cleaned == text


def _render_value(value: str) -> tuple[str, bool]:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    if value.startswith("[") and value.endswith("]"):  # a list: its items joined by '_'
        items = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        parts = [_safe(v) for v in items]
        return "_".join(p for p, _ in parts) or "empty", all(ok for _, ok in parts)
    return _safe(value)


def split_override(override: str) -> tuple[str, str, str] | None:
    """``"+a.b=1"`` -> ``("+", "a.b", "1")``; None for an override without a value (``~a.b``)."""
    match = re.match(r"^(\+\+|\+|~)?([^=]+)=(.*)$", override.strip())
    if not match:
        return None
    return match.group(1) or "", match.group(2).strip(), match.group(3)


def name_items(overrides: Sequence[str] | None, choices: Mapping[str, Any],
               default_choices: Mapping[str, Any]) -> tuple[list[str], bool]:
    """What sets a run apart in its name, sorted: every group choice that differs from the default
    (``schedule-cosine``) and every command-line override of a key that can change results
    (``trainer.epochs-6``); and whether those items render the overrides exactly (False when
    ``overrides`` are unknown or a value needed other characters)."""
    shown = [g for g in choices if g not in ("dataset", "model", "method", "experiment", "sweep", "dataset_model",
                                            "logger", "paths") and not g.startswith("hydra")]
    items, exact = [], overrides is not None
    for g in sorted(shown):
        if choices.get(g) != default_choices.get(g):
            text, ok = _safe(f"{g}-{choices[g]}")
            items.append(text)
            exact &= ok
    last: dict[str, str] = {}  # a key given twice counts once, with the value Hydra applies (the last)
    for override in overrides or ():
        parts = split_override(override)
        if parts is not None:
            last[parts[1]] = parts[2]
    for key, value in last.items():
        if key in choices or key == "seed" or _under(key, NON_RESULT):
            continue
        rendered, ok = _render_value(value)
        key_text, key_ok = _safe(key)
        items.append(f"{key_text}-{rendered}")
        exact &= ok and key_ok
    return sorted(items), exact


def run_name(names: Mapping[str, str], seed: Any, overrides: Sequence[str] | None, choices: Mapping[str, Any],
             default_choices: Mapping[str, Any], group: str) -> str:
    """The run directory below ``paths.output_dir`` (see the module doc).

    ``names``: ``dataset``, ``model`` and ``method`` names (``cfg.<group>.name``); ``overrides``: the
    command line's overrides as typed (None when they are unknown, e.g. a config composed in Python:
    the name then carries the group hash); ``choices``: the chosen option of every config group;
    ``default_choices``: the primary config's; ``group``: :func:`group_hash` of the run's identity.
    """
    head = [str(choices[g]) for g in ("experiment", "sweep") if choices.get(g) not in (None, "", "null")]
    items, exact = name_items(overrides, choices, default_choices)
    rest = "+".join(items) or "default"
    if not exact or len(rest) > MAX_REST:  # keep the whole items that fit, then the group hash
        kept = []
        for item in items:
            if len("+".join([*kept, item])) > MAX_REST - 12:
                break
            kept.append(item)
        rest = "+".join([*(kept if items else ["default"]), f"id-{group[:8]}"])
    parts = [*head, names["dataset"], names["model"], names["method"]]
    path = "/".join(_safe(p)[0] for p in parts)
    return f"{path}/{rest}/seed{_safe(str(seed))[0]}"
