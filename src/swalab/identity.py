"""Run identity: which runs are the same run, and where a run lives.

A run *is* its resolved config minus the keys that cannot change its results. Two runs with the
same identity are the same experiment (re-running one resumes or skips it); two runs that differ in
any identity key are different experiments, and nothing in swalab treats them as one: a run
directory refuses a config of another identity (naming the keys that differ), a checkpoint of
another identity is never resumed, and a report cell never pools them.

Whether a key counts follows from where it is declared: the groups of what a run computes
(``RESULT_GROUPS``: seed, dataset, model, method, schedule, optimizer, loss, trainer) count, the groups of how and
where it runs (``RUN_GROUPS``: the run group with device, progress, evaluation cadence, checkpoints,
caches and workers; the logger; the paths; Hydra) never do. Within the counted groups, five rules:

* a data set is what its files hold, ``data.fingerprint`` (``swalab.data.fingerprint``), never
  where they lie (``LOCATION``: ``dataset.root``); a weights file likewise (:func:`is_weights_key`:
  ``model.init_from`` naming a file, ``model.pretrained_file`` as the network reads it) counts as
  ``sha256-<16 hex>`` of its content, so moving it makes no new run and rewriting it does; and a run directory
  ``model.init_from`` names (``<dir>`` or ``<dir>@<epoch>``) counts as that source run (:func:`source_run`):
  ``run-<its group hash>`` when its seed is this run's, so that the seeds of one config started each from its own
  seed's run share a group, ``run-<group hash>-seed<k>`` when it is another seed's, with the ``@<epoch>`` kept;
  never the path, so spelling, moving or copying the folder makes no new run;
* a value read only through another key that counts is held there (``READ_THROUGH``: ``model.lr``
  as ``schedule.lr``, the loader's ``dataset.source.*`` copies of ``dataset.*``);
* a method's settings are its own keys (``method.*``, its constructor's arguments); a model's per-model values of
  them (its recipe blocks, ``METHOD_RECIPES``: ``model.swa``, ``model.fge``) are read only through those keys
  (``method.lr: ${model.swa.lr}``), so ``model.swa.lr=0.05`` leaves an SGD run the same run; and what only training
  reads (``TRAINING_GROUPS``) counts only for a method that trains (``Method.trains``: not ``method=pretrained``);
* a key added after runs were made counts only away from the value that leaves a run as it was
  (``UNSET_VALUES``: ``dataset.val_size`` null or 0, ``dataset.classes`` null, Laplace's ``method.prior_range`` at
  [-4, 4] and ``method.weights`` at last_layer), so those runs keep their identity;
* a key that says only what a run keeps, never what it computes (``OUTPUT_ONLY``: FGE's ``method.save_members``,
  which also writes FGE's members' weights), never counts, nor where an identity written before this rule holds it
  (:func:`today`): keeping more is the same run, the same group and the same name.

The identity is stored in the run directory (``identity.json``: the canonical form and a short hash,
and what sets the run apart from its defaults) and in every checkpoint. ``group_hash`` is the
identity minus the seed: the seeds of one config share it (a report cell, a W&B group). Identities
written by earlier versions are read under today's names (``swalab.compat.upgraded``).

Run directories are ``<paths.output_dir>/[<experiment>/][<sweep>/]<dataset>/<model>/<method>/<rest>/seed<N>``
where ``<rest>`` names what sets the run apart from the defaults of its data set, model and method
(:func:`settings_apart`, the function the report's row labels come from too): the group choices
that differ from the default (``schedule-cosine``), then every setting whose value differs, in the
key a user types, a block of the model's without ``model.`` (``swa.lr-0.05``, ``arch.depth-8``,
``trainer.epochs-6``: :func:`name_key`), joined by ``+``, or ``default``; a weights file by its content
(``model.init_from-sha256-<16 hex>``), a source run by its value (``model.init_from-run-<group hash>``, an epoch as
``-epoch<k>``). One config therefore has one name, however it was typed. A directory named
by an earlier swalab (whole keys, a weights file's or a run directory's path, a key that only says what the run keeps)
is renamed by ``python -m swalab.upgrade`` (``swalab.train.plan.locate`` refuses to train its config beside it). The name uses only characters a shell and a Hydra
override take unquoted (letters, digits and ``_ - . +``), so a run directory can be passed as
``model.init_from=<dir>`` as it is. When a value needs other characters, or the name grows long, the
group hash is appended (``+id-<hash>``) so that two configs never share a name."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swalab.compat import RECIPE_BLOCKS, RETIRED_KEYS, SHORT_NAMES_SINCE, upgraded, upgraded_config
from swalab.data.fingerprint import weights_fingerprint
from swalab.rundir import RunDir, WeightSpec

# Where a key is declared says whether it counts: the groups of what a run computes, and the groups of how and
# where it runs (the run group: device, progress, checkpoints, caches, workers; the logger, the paths, Hydra's own),
# which never count. tests/test_run_identity.py fails when a key of conf/ lies in neither.
RESULT_GROUPS = ("seed", "dataset", "model", "method", "schedule", "optimizer", "loss", "trainer")
RUN_GROUPS = ("run", "logger", "paths", "hydra")
# A data set is what its files hold (its fingerprint, ``data.fingerprint``), never where they lie.
LOCATION = ("dataset.root",)
# The model's blocks of per-model method settings (conf/recipe/paper.yaml): the method's yaml reads each of its keys
# (conf/method/swa.yaml: ``lr: ${model.swa.lr}``), so they count where the method holds them, for that method only.
METHOD_RECIPES = RECIPE_BLOCKS  # model.swa, model.fge: defined where earlier identities are read, which sits below
# Values the run reads only through other keys of its identity, which hold them resolved: the loader's copies of
# the data set's keys (dataset.source), the model's recipe values the schedule (model.lr), the trainer
# (model.weight_decay, model.budget_epochs) and the network (model.pretrained, model.pretrained_file) read, and the
# methods' recipe blocks. tests/test_run_identity.py checks each is interpolated where this says.
READ_THROUGH = (
    "dataset.source",
    "model.lr", "model.weight_decay", "model.budget_epochs", "model.pretrained", "model.pretrained_file",
    *METHOD_RECIPES,
)
# What only training reads: no part of the identity of a method that trains nothing (``Method.trains``: Pretrained).
TRAINING_GROUPS = ("optimizer", "schedule", "loss", "trainer")
# Keys added after runs were made, at the values that leave a run as it was: there they are left out of the identity,
# so a run made before the key existed keeps its identity, its directory and its report cell. Any other value counts.
UNSET_VALUES = {"dataset.val_size": (None, 0), "dataset.classes": (None,), "method.prior_range": ([-4, 4],),
                "method.weights": ("last_layer",)}
# Keys of the counted groups that say only what a run keeps, never what it computes: they never count (dropped like
# LOCATION), and identities written before this rule (version 4 and earlier) are read
# without them (:func:`today`), so a run that keeps more is the same run, group, directory and report row.
#   method.save_members (FGE's; model.fge.save_members as a user types it, in a settings-apart record): also write
#     each member's weights to <run>/members/ (after the member is scored: no number of the run depends on it;
#     swalab.methods.FGE.on_epoch_end).
OUTPUT_ONLY = ("method.save_members", "model.fge.save_members")


def method_part(key: str) -> bool:
    """Whether ``key`` (of an identity, or as a user types it) is what only the method decides: its own keys and their
    recipe blocks (``model.swa``), the run's length and the schedule's horizon. Rows of a report share everything
    else; a branch may change these."""
    return _under(key, ("method", *METHOD_RECIPES, "trainer.epochs", "schedule.horizon"))


IDENTITY_FILE = RunDir.IDENTITY
# 2: directories named from the identity, SWA/FGE settings in the model's recipe blocks; 3: weights files by content,
# names shortened (swa.lr-0.05 for model.swa.lr); 4: a run directory
# model.init_from names counts as its source run (run-<group hash>), not as its path; 5: what only says what a run
# keeps (OUTPUT_ONLY: model.fge.save_members) never counts; 6: every method's settings are its method.* keys (SWA's
# and FGE's were their recipe blocks model.swa, model.fge). swalab.upgrade renames directories named by 2 to 5.
IDENTITY_VERSION = 6
DATA_FINGERPRINT = "data.fingerprint"
# Keys identities hold today that an earlier swalab did not record (old-format reading: swalab.compat).
ADDED_KEYS = (DATA_FINGERPRINT,)


SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
MAX_REST = 100  # characters of <rest> before the group hash replaces the tail


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def flat(node: Mapping[str, Any]) -> dict[str, Any]:
    """``{dotted key: leaf}`` of a nested mapping, as an identity holds a config (a list is a leaf, an empty block
    ``{}``)."""
    out: dict[str, Any] = {}
    _flatten(node, "", out)
    return out


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


def is_weights_key(key: str) -> bool:
    """Whether ``key`` of an identity names weights: ``model.init_from`` (a file, or a run directory: its source run)
    and the network's copy of ``model.pretrained_file`` (``model.arch.pretrained_file``)."""
    return key == "model.init_from" or (key.startswith("model.") and key.endswith(".pretrained_file"))


def by_content(value: Any, cache_dir: str | Path | None = None, seed: Any = None) -> Any:
    """A weights key's value as the identity holds it: the file's content fingerprint when it names a file
    (``swalab.data.fingerprint.weights_fingerprint``), the source run when it names a run directory with a readable
    identity (:func:`source_run`; ``seed``: this run's), else the value as it is (null, a path that is not there: the
    run refuses it when it loads it)."""
    if not isinstance(value, str) or not value:
        return value
    return weights_fingerprint(value, cache_dir) or source_run(value, seed) or value


SOURCE_PREFIX = "run-"
SOURCE_VALUE = re.compile(r"run-[0-9a-f]{12}(-seed[A-Za-z0-9_.\-]+)?(@[0-9]+)?")
_READING: set[Path] = set()  # the source runs being read now: a loop of directories naming each other ends


def source_run(spec: str, seed: Any = None) -> str | None:
    """What a run directory named by ``model.init_from`` (``<dir>``, or ``<dir>@<epoch>`` as
    ``swalab.runweights.load_init_weights`` reads it) counts as: its source run, ``run-<group hash>`` of the identity
    it recorded (:func:`recorded_identity`, under today's names), with ``-seed<k>`` when its seed ``k`` is not
    ``seed`` (this run's) and ``@<epoch>`` when one is picked (module doc: why). None when ``spec`` names no
    directory with a readable identity (the value then stays as it is)."""
    weights = WeightSpec.parse(spec)
    where, epoch = weights.path, weights.epoch
    if not where.is_dir() or weights.name:  # a method's weights: refused when read (model.init_from takes none)
        return None
    key = where.resolve()
    if key in _READING:
        return None
    _READING.add(key)
    try:
        source = recorded_identity(where)
    finally:
        _READING.discard(key)
    if not source:
        return None
    value = SOURCE_PREFIX + group_hash(source)
    if source.get("seed") != seed:
        value += f"-seed{_safe(str(source.get('seed')))[0]}"
    return value + (f"@{epoch}" if epoch is not None else "")


def identity_of(resolved: Mapping[str, Any], data_fingerprint: str | None = None) -> dict[str, Any]:
    """The identity of a resolved config (a plain dict): ``{dotted key: value}`` of every key that counts by the
    module doc's rules, and ``data.fingerprint``, the fingerprint of the files the run reads
    (``swalab.data.fingerprint``), when known."""
    flat: dict[str, Any] = {}
    for root in RESULT_GROUPS:
        if root in resolved:
            _flatten(resolved[root], root, flat)
    unread = () if method_trains(resolved) else TRAINING_GROUPS
    dropped = (*LOCATION, *READ_THROUGH, *unread, *OUTPUT_ONLY)
    identity = {k: v for k, v in flat.items() if not _under(k, dropped)
                and not (k in UNSET_VALUES and _unset(k, v))}
    cache_dir, seed = (resolved.get("run") or {}).get("cache_dir"), resolved.get("seed")
    identity.update({k: by_content(v, cache_dir, seed) for k, v in identity.items() if is_weights_key(k)})
    if data_fingerprint is not None:
        identity[DATA_FINGERPRINT] = data_fingerprint
    return dict(sorted(identity.items()))


def _unset(key: str, value: Any) -> bool:
    """Whether ``value`` of ``key`` (one of ``UNSET_VALUES``) is one that leaves a run as it was (``0`` and ``0.0`` alike,
    never ``False``)."""
    return not isinstance(value, bool) and any(value is None if u is None else value == u for u in UNSET_VALUES[key])


def method_trains(resolved: Mapping[str, Any]) -> bool:
    """Whether the run's method trains (its class's ``trains``; True for a class that cannot be imported here)."""
    return getattr(method_class_of(resolved), "trains", True)


def untrained_view(identity: Mapping[str, Any]) -> dict[str, Any]:
    """A flat identity as one of a method that trains nothing holds it: without ``TRAINING_GROUPS`` when its method
    trains nothing (an identity written before that rule held them), else unchanged."""
    if method_trains({"method": {"_target_": identity.get("method._target_")}}):
        return dict(identity)
    return {k: v for k, v in identity.items() if not _under(k, TRAINING_GROUPS)}


def method_class_of(resolved: Mapping[str, Any]):
    """The class of the run's method (``method._target_``), or None when there is none or it cannot be imported here
    (a method of one's own off this PYTHONPATH)."""
    target = (resolved.get("method") or {}).get("_target_")
    if not target:
        return None
    try:
        from hydra.utils import get_class

        return get_class(str(target))
    except Exception:  # noqa: BLE001  a method class that cannot be imported here
        return None


def canonical(identity: Mapping[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)


def identity_hash(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:12]


def group_hash(identity: Mapping[str, Any]) -> str:
    """The hash of the identity minus the seed: shared by every seed of one config."""
    return identity_hash({k: v for k, v in identity.items() if k != "seed"})


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """``key: <theirs> there, <ours> here`` for every key whose values differ (absent keys included, but for
    the keys an earlier swalab recorded or did not: ``RETIRED_KEYS``, ``ADDED_KEYS``)."""
    ours, theirs = (untrained_view(today(i)) for i in (ours, theirs))
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
    out = {"version": IDENTITY_VERSION, "hash": identity_hash(identity), "group": group_hash(identity),
           "identity": dict(identity)}
    if apart is not None:
        out["apart"] = dict(apart)
    return out


def settings_apart(identity: Mapping[str, Any], default: Mapping[str, Any], sources: Mapping[str, str],
                   choices: Mapping[str, Any] = {}) -> dict[str, Any]:
    """What sets a run apart from the default config of its data set, model and method, in the keys a user types.

    ``default`` is the identity of the config composed with the run's own group choices and no other override;
    ``sources`` names, for a key read through an interpolation in the default config (``method.lr: ${model.swa.lr}``),
    the key it reads (``model.swa.lr``), which is the one shown whichever of the two a user typed; ``choices`` are the group choices
    that differ from the primary config's (``schedule: cosine``), shown first as ``schedule``. The data set's
    fingerprint and the seed are not settings. Returns ``{key: value}`` in that order, sorted within each part by the
    key shown (:func:`in_order`)."""
    out: dict[str, Any] = {str(g): v for g, v in sorted(choices.items())}
    settings: dict[str, Any] = {}
    for key in sorted(set(identity) | set(default)):
        if key == "seed" or key.startswith("data."):
            continue
        if identity.get(key, "<absent>") != default.get(key, "<absent>"):
            settings.setdefault(sources.get(key, key), identity.get(key, "<absent>"))
    return {**out, **in_order(settings)}


def in_order(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A settings-apart record's group choices (keys without a dot: ``schedule``) first as they stand, then its
    settings sorted by the key shown, so that a name never depends on the key a setting is counted under
    (``method.lr`` shown as ``model.swa.lr`` sorts as ``model.swa.lr``)."""
    return {**{k: v for k, v in settings.items() if "." not in k},
            **dict(sorted((k, v) for k, v in settings.items() if "." in k))}


def label_of(apart: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """``schedule=cosine, model.swa.lr=0.05``: a settings-apart record (or the ``keys`` of it) as a label."""
    return ", ".join(f"{k}={_shown(v)}" for k, v in apart.items() if keys is None or k in keys)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def today(identity: Mapping[str, Any]) -> dict[str, Any]:
    """``identity`` under today's names (``swalab.compat.upgraded``), the weights paths an earlier swalab held read as
    what they name today (:func:`by_content`: a file's content, a run directory's source run, for its own seed), and
    without what only says what a run keeps (:func:`counted`), which an identity of version 4 or earlier held."""
    return counted(upgraded(identity, content=lambda value: by_content(value, seed=identity.get("seed"))))


def counted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (an identity, or what sets a run apart: :func:`settings_apart`) without the keys that only say
    what a run keeps (``OUTPUT_ONLY``), which an earlier swalab counted and recorded."""
    return {k: v for k, v in settings.items() if not _under(k, OUTPUT_ONLY)}


def recorded_identity(run_dir: str | Path) -> dict[str, Any] | None:
    """The identity the run in ``run_dir`` recorded (``identity.json``) under today's names (:func:`today`); None
    when it has none, or one that cannot be read or holds something else than a mapping (damaged, edited by hand)."""
    record = RunDir(run_dir).read_json(RunDir.IDENTITY)
    identity = record.get("identity") if isinstance(record, dict) else None
    return today(identity) if isinstance(identity, Mapping) else None


def stored_identity(run_dir: str | Path) -> dict[str, Any] | None:
    """The identity of the run in ``run_dir`` under today's names (``swalab.compat.upgraded``): ``identity.json``
    (:func:`recorded_identity`), else computed from its ``config.yaml`` (its keys in today's places:
    ``swalab.compat.upgraded_config``); None without either. A file that cannot be read, or holds something else than a mapping (damaged, or
    edited by hand), counts as absent."""
    recorded = recorded_identity(run_dir)
    if recorded is not None:
        return recorded
    resolved = RunDir(run_dir).config()
    return None if resolved is None else today(identity_of(upgraded_config(resolved)))


# -- run directory names ------------------------------------------------------------------------

def _safe(text: str) -> tuple[str, bool]:
    """``text`` with every character outside ``[A-Za-z0-9_.-]`` replaced; and whether it was exact."""
    cleaned = SAFE.sub("_", text)
    return cleaned, cleaned == text


def _name_value(value: Any) -> tuple[str, bool]:
    """A setting's value as a directory name takes it: a list's items joined by ``_``; whether it was exact."""
    if isinstance(value, (list, tuple)):
        parts = [_name_value(v) for v in value]
        return "_".join(p for p, _ in parts) or "empty", all(ok for _, ok in parts)
    return _safe(_shown(value))


def _source_name(value: Any) -> Any:
    """A source run's value (:func:`source_run`) as a name takes it: ``run-<group hash>-epoch<k>`` for
    ``run-<group hash>@<k>`` (``@`` is no character of a name); any other value as it is."""
    if isinstance(value, str) and SOURCE_VALUE.fullmatch(value):
        return value.replace("@", "-epoch")
    return value


def name_key(key: str) -> str:
    """A setting's key as a directory name shows it: a block of the model's without ``model.`` (``swa.lr`` for
    ``model.swa.lr``, ``arch.depth`` for ``model.arch.depth``), which no other key can read as (no config group is
    named after a block of the model's; such a block keeps its whole key); every other key whole."""
    parts = key.split(".")
    if len(parts) >= 3 and parts[0] == "model" and parts[1] not in (*RESULT_GROUPS, *RUN_GROUPS):
        return ".".join(parts[1:])
    return key


def name_items(apart: Mapping[str, Any] | None, version: int = IDENTITY_VERSION) -> tuple[list[str], bool]:
    """What sets a run apart (:func:`settings_apart`) as the items of its directory's name, in its order (group
    choices first: ``schedule-cosine``, then settings: ``trainer.epochs-6``, ``swa.lr-0.05``: :func:`name_key`); and
    whether they render it exactly (False when ``apart`` is unknown, a config composed in Python, or a value needed
    other characters). ``version``: the names an identity of that version gave (whole keys before
    ``compat.SHORT_NAMES_SINCE``), to rename a run directory an earlier swalab named (``swalab.upgrade``)."""
    if apart is None:
        return [], False
    items, exact = [], True
    for key, value in apart.items():
        text, ok = _name_value(_source_name(value) if key == "model.init_from" else value)
        key_text, key_ok = _safe(name_key(key) if version >= SHORT_NAMES_SINCE else key)
        items.append(f"{key_text}-{text}")
        exact &= ok and key_ok
    return items, exact


def run_name(names: Mapping[str, str], seed: Any, apart: Mapping[str, Any] | None, choices: Mapping[str, Any],
             group: str, version: int = IDENTITY_VERSION) -> str:
    """The run directory below ``paths.output_dir`` (see the module doc).

    ``names``: ``dataset``, ``model`` and ``method`` names (``cfg.<group>.name``); ``apart``: what sets the run
    apart from its defaults (:func:`settings_apart`, the function the report's row labels come from; None when
    unknown: the name then carries the group hash); ``choices``: the chosen option of every config group (an
    experiment or sweep heads the path); ``group``: :func:`group_hash` of the run's identity; ``version``: as
    :func:`name_items` takes it."""
    head = [str(choices[g]) for g in ("experiment", "sweep") if choices.get(g) not in (None, "", "null")]
    items, exact = name_items(apart, version)
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
