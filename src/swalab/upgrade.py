"""``python -m swalab.upgrade <outputs dir or run dir>... [--write]``: outputs of earlier swalab versions rewritten
once in today's format, so that nothing else reads an old format.

When to use it: today's code refuses what an earlier swalab wrote and it no longer reads in place (a checkpoint
holding predictions inside, a prediction file of probabilities only, a run directory named by an earlier identity
version, a config with keys in their old places), naming the file and this command. It walks every run directory
(``swalab.rundir.RunDir``) below the paths given and, per run, says what it would change; ``--write`` changes it:

* ``identity.json`` (and the identity inside each checkpoint and ``final.pt``) under today's names
  (``swalab.compat.upgraded``, ``swalab.identity.today``: SWA's and FGE's settings as their ``method.*`` keys since
  version 6), recorded as today's identity version;
* ``config.yaml`` with its keys in today's places (``swalab.compat.upgraded_config``);
* a checkpoint whose method state carries the predictions it scored (FGE's members, SWA's budget marks, as
  probabilities or log-probabilities): each moved to its file in ``checkpoints/predictions/``, the state naming it;
* ``predictions.pt`` of probabilities only, and ``fge_member_probs.pt`` of ``member_probs``: log-probabilities added;
* a run directory named by an earlier identity version (``model.swa.lr-0.05``, a weights file's path,
  ``fge.save_members-True``, ``schedule.lr-0.07`` for a key that only reads another: :func:`read_through`) renamed to
  today's name; refused, saying so, when that name is taken. The records
  below the paths given that name a renamed run (a branched row's ``rows/*.json``, a grid's ``jobs/*.json``, a
  branch's ``lineage.json``, by relative or absolute path, of this machine or another) are pointed at its new name.

Each run is rewritten on its own: every new file is written beside the old one first, then the old ones are
replaced (``os.replace``). The records naming renamed runs are rewritten first, and each run's directory is renamed
before its files are replaced (:func:`apply`), so a kill leaves each run old or new, or part done in a way the same
command again finishes, and a second invocation reports nothing to do. Without
``--write`` nothing is written."""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from omegaconf import OmegaConf

from swalab.checkpoint import PredictionFiles, checkpoint_paths, read_torch_file
from swalab.cli import run_command
from swalab.compat import RETIRED_KEYS, upgraded_config
from swalab.evaluate import log_of
from swalab.identity import (IDENTITY_VERSION, counted, flat, group_hash, in_order, is_weights_key, record,
                             run_name, today, untrained_view)
from swalab.methods.fge import member_file
from swalab.methods.swa import val_file
from swalab.rundir import RunDir, read_json

TEMP_SUFFIX = ".upgrade.tmp"  # a new file written beside the one it replaces, until it replaces it


@dataclass
class Upgrade:
    """What one run needs: one line per change (``notes``), the files to put in place (``files``: path -> bytes
    writer), and today's place of the run when it differs (``move``), or why it cannot move (``blocked``)."""

    run: Path
    notes: list[str] = field(default_factory=list)
    files: dict[Path, Callable[[Any], None]] = field(default_factory=dict)
    move: Path | None = None
    blocked: str | None = None
    stale: list[Path] = field(default_factory=list)  # temp files an interrupted upgrade left: removed
    damaged: list[str] = field(default_factory=list)  # records that cannot be read, so not checked: left as they are

    def add(self, note: str, path: Path, write: Callable[[Any], None]) -> None:
        self.notes.append(note)
        self.files[path] = write


def run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Every run directory at or below ``paths`` (one holding ``identity.json`` or the ``config.yaml`` of a run),
    sorted; the folders inside a run are not entered."""
    found: list[Path] = []
    for top in map(Path, paths):
        if not top.is_dir():
            raise FileNotFoundError(f"{top}: no such directory (give an outputs directory or a run directory)")
        for here, dirs, _ in os.walk(top):
            if is_run(Path(here)):
                found.append(Path(here))
                dirs.clear()
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(set(found))


def is_run(path: Path) -> bool:
    """Whether ``path`` is a run directory: its ``identity.json`` holds an identity, its ``checkpoints/`` a checkpoint,
    or its ``config.yaml`` a run's config (a seed, a data set, a model and a method; an earlier swalab wrote no
    identity.json)."""
    if isinstance((read_json(path / RunDir.IDENTITY) or {}).get("identity"), dict):
        return True
    if checkpoint_paths(path / RunDir.CHECKPOINTS):
        return True
    config = RunDir(path).config() or {}
    return "seed" in config and all(isinstance(config.get(g), dict) for g in ("dataset", "model", "method"))


def todays_identity(identity: dict) -> dict:
    """An identity an earlier swalab recorded, as today's run of its config holds it (``swalab.identity.today``;
    no training keys for a method that trains nothing: ``untrained_view``), without the keys it no longer records (``swalab.compat.RETIRED_KEYS``: a data folder's path)."""
    return {k: v for k, v in untrained_view(today(identity)).items() if k not in RETIRED_KEYS}


def plan_identity(up: Upgrade) -> None:
    """``identity.json`` under today's names and version, with what sets the run apart in today's keys; and the
    run's place today when an earlier identity version named it (:func:`plan_move`)."""
    path = up.run / RunDir.IDENTITY
    old = read_json(path)
    if not isinstance(old, dict) or not isinstance(old.get("identity"), dict):
        return
    identity = todays_identity(old["identity"])
    apart = todays_apart(old, identity)
    new = {**old, **record(identity, apart)}
    if new != old:
        up.add(f"{RunDir.IDENTITY}: identity version {old.get('version', 1)} -> {IDENTITY_VERSION}"
               + ("" if identity == old["identity"] else " (keys under today's names)"),
               path, json_writer(new))
    plan_move(up, old, identity, apart)


def todays_apart(old: dict, identity: dict) -> dict | None:
    """What set the run apart (``apart`` of its ``identity.json``) in today's terms: without what only says what a
    run keeps (``swalab.identity.counted``), a weights file's path or a run directory's as today's identity holds
    it (its content, its source run), each setting by the key it reads (:func:`read_through`), in today's order
    (``swalab.identity.in_order``: version 5 sorted a setting by the key it was counted under)."""
    apart = old.get("apart")
    if not isinstance(apart, dict):
        return None
    then = old["identity"]
    values = {then[k]: identity[k] for k in then if is_weights_key(k) and k in identity and then[k] != identity[k]}
    typed = read_through()
    return in_order({typed.get(k, k): values.get(v, v) if isinstance(v, str) else v for k, v in counted(apart).items()})


@lru_cache(maxsize=1)
def read_through() -> dict[str, str]:
    """For each key of today's default config that only reads another (``schedule.lr: ${model.lr}``), the key it reads,
    but for the method's own keys. Identity version 5 and earlier named such a setting by the key typed (a run of
    ``schedule.lr=0.07`` in ``schedule.lr-0.07``, one of ``model.lr=0.07`` in ``model.lr-0.07``: one config, two
    names); today's name is the key read, however it was typed (``swalab.train.plan.apart_from_defaults``)."""
    from hydra import compose, initialize_config_dir

    from swalab.config import CONF_DIR
    from swalab.train.plan import interpolation_sources

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config")
    keys = flat(OmegaConf.to_container(cfg, resolve=False))
    return {k: v for k, v in interpolation_sources(cfg, keys).items() if not k.startswith("method.")}


def plan_move(up: Upgrade, old: dict, identity: dict, apart: dict | None) -> None:
    """The run's directory under today's name, when an earlier identity version named it (its ``<rest>/seed<N>``
    is the name that version gave its record) and today's differs. A run placed by hand (``run.dir``) stays."""
    version = old.get("version")
    if not isinstance(version, int) or version >= IDENTITY_VERSION or apart is None:
        return
    seed = identity.get("seed")
    then = name_tail(old["apart"], seed, str(old.get("group", "")), version)
    if then != (up.run.parent.name, up.run.name):
        return
    rest, seed_dir = name_tail(apart, seed, group_hash(identity), IDENTITY_VERSION)
    target = up.run.parent.parent / rest / seed_dir
    if target == up.run:
        return
    if target.exists():
        up.blocked = (f"its name today is {target}, which is taken: move one of the two away and run this again "
                      "to rename it")
    else:
        up.move = target
        up.notes.append(f"directory renamed to today's name {rest}/{seed_dir}")


def name_tail(apart: dict, seed: Any, group: str, version: int) -> tuple[str, str]:
    """``(<rest>, seed<N>)`` of the name identity ``version`` gave a run of ``apart`` and ``group``."""
    names = {"dataset": "d", "model": "m", "method": "x"}
    rest, seed_dir = run_name(names, seed, apart, {}, group, version=version).split("/")[-2:]
    return rest, seed_dir


def plan_config(up: Upgrade) -> None:
    """``config.yaml`` with its keys in today's places and the keys added since at the values it ran with."""
    config = RunDir(up.run).config()
    if config is None:
        return
    new = upgraded_config(config)
    if new != config:
        text = OmegaConf.to_yaml(OmegaConf.create(new)).encode()
        up.add(f"{RunDir.CONFIG}: keys moved to today's places", up.run / RunDir.CONFIG, lambda f: f.write(text))


def plan_checkpoints(up: Upgrade) -> None:
    """Each checkpoint (rolling, ``saved/``, ``final.pt``) whose identity or method state is of an earlier
    format: the predictions inside moved to files of their own (:func:`todays_method_state`), the identity under
    today's names."""
    folder = up.run / RunDir.CHECKPOINTS
    paths = sorted([*folder.glob("epoch*.pt"), *(folder / "saved").glob("epoch*.pt"), up.run / RunDir.FINAL])
    predictions = PredictionFiles(up.run)
    for path in (p for p in paths if p.is_file()):
        state = read_torch_file(path)
        if not isinstance(state, dict):
            continue
        notes = []
        if isinstance(state.get("identity"), dict):
            identity = todays_identity(state["identity"])
            if identity != state["identity"]:
                state["identity"] = identity
                notes.append("identity under today's names")
        if isinstance(state.get("method"), dict):
            state["method"], files, what = todays_method_state(state["method"])
            for name, tensor in files.items():
                up.files[predictions.path(name)] = torch_writer(tensor)
            notes += what
        if notes:
            up.add(f"{path.relative_to(up.run)}: " + "; ".join(notes), path, torch_writer(state))


def todays_method_state(state: dict) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """A method's checkpoint state of an earlier format as today's: FGE's members and SWA's budget marks, which it
    carried (as probabilities before log-probabilities), named instead (``member_files``, ``budget_files``), with
    the predictions to write under those names. Today's state comes back unchanged, with no files."""
    state, files = dict(state), {}
    if "member_files" not in state and ("member_probs" in state or "member_log_probs" in state):
        tests = state.pop("member_log_probs", None) or [log_of(p) for p in state.pop("member_probs", [])]
        state.pop("member_probs", None)
        vals = list(state.pop("member_val_log_probs", ()))
        state["member_files"] = [member_file(k) for k in range(1, len(tests) + 1)]
        state["member_val_files"] = [member_file(k, "val") for k in range(1, len(vals) + 1)]
        files.update(zip(state["member_files"], tests))
        files.update(zip(state["member_val_files"], vals))
        return state, files, [f"{len(tests)} FGE members' predictions moved to {PredictionFiles.DIR}/"]
    marks = ("budget_probs", "budget_log_probs", "budget_val_log_probs")
    if "budget_files" not in state and any(k in state for k in marks):
        tests = {k: log_of(p) for k, p in state.pop("budget_probs", {}).items()}
        tests.update(state.pop("budget_log_probs", {}))
        vals = dict(state.pop("budget_val_log_probs", {}))
        state["budget_files"], state["budget_val_files"] = list(tests), list(vals)
        files.update(tests)
        files.update({val_file(k): v for k, v in vals.items()})
        return state, files, [f"{len(tests)} SWA budget marks' predictions moved to {PredictionFiles.DIR}/"]
    return state, files, []


def plan_predictions(up: Upgrade) -> None:
    """``predictions.pt`` holding probabilities only and ``fge_member_probs.pt`` holding ``member_probs``: their
    log-probabilities added (the ones a probability rounded to 0 leaves: ``swalab.evaluate.log_of``)."""
    path = up.run / RunDir.PREDICTIONS
    saved = read_torch_file(path) if path.is_file() else None
    if isinstance(saved, dict) and "probs" in saved and "log_probs" not in saved:
        saved["log_probs"] = {k: log_of(p).half() for k, p in saved["probs"].items()}
        up.add(f"{RunDir.PREDICTIONS}: log-probabilities added", path, torch_writer(saved))
    path = up.run / RunDir.MEMBER_PROBS
    members = read_torch_file(path) if path.is_file() else None
    if isinstance(members, dict) and "member_probs" in members and "member_log_probs" not in members:
        members["member_log_probs"] = [log_of(p) for p in members.pop("member_probs")]
        up.add(f"{RunDir.MEMBER_PROBS}: members' log-probabilities in place of probabilities", path,
               torch_writer(members))


def json_writer(obj: Any) -> Callable[[Any], None]:
    import json

    text = (json.dumps(obj, indent=2, default=float) + "\n").encode()
    return lambda f: f.write(text)


def torch_writer(obj: Any) -> Callable[[Any], None]:
    return lambda f: torch.save(obj, f)


def check_readable(up: Upgrade) -> None:
    """Name the run's records that cannot be read (cut short, not JSON or YAML), which the steps below skip:
    such a run is not in today's format, whatever else it holds, and nothing of it is written over."""
    identity = read_json(up.run / RunDir.IDENTITY)
    if (up.run / RunDir.IDENTITY).exists() and not isinstance((identity or {}).get("identity"), dict):
        up.damaged.append(f"{RunDir.IDENTITY} cannot be read (cut short, or holds no identity): left as it is; "
                          "restore it from a copy of the run")
    # none at all is no damage: a run the Python API made (swalab.trainer.Trainer) has checkpoints and no config
    if (up.run / RunDir.CONFIG).exists() and RunDir(up.run).config() is None:
        up.damaged.append(f"{RunDir.CONFIG} cannot be read (cut short, or holds no config): left as it is; restore "
                          "it from a copy of the run (the report leaves the run out until then)")


def plan(run: Path) -> Upgrade:
    """What ``run`` needs to be in today's format (nothing for a run of today's), and what of it cannot be read."""
    up = Upgrade(run)
    for step in (check_readable, plan_predictions, plan_checkpoints, plan_config, plan_identity):
        step(up)
    up.stale = sorted(run.rglob(f"*{TEMP_SUFFIX}"))
    if up.stale:
        up.notes.append(f"{len(up.stale)} temp file(s) an interrupted upgrade left: removed")
    return up


# The last components of a run directory's path that name it below an outputs directory:
# <dataset>/<model>/<method>/<rest>/seed<N>. A record names a run by a path that ends so.
NAMED_PARTS = 5


def records_naming_runs(tops: Sequence[Path]) -> list[Path]:
    """The records below ``tops`` that name run directories by path: branched rows (``rows/*.json``), grid jobs
    (``grids/<date_time>/jobs/*.json``) and branches' ``lineage.json``."""
    found = set()
    for top in tops:
        for path in top.rglob("*.json"):
            if (path.name == RunDir.LINEAGE or path.parent.name == "rows"
                    or (path.parent.name == "jobs" and path.parent.parent.parent.name == "grids")):
                found.add(path)
    return sorted(found)


def repointed(value: Any, moves: Sequence[tuple[str, str]]) -> Any:
    """``value`` (a record's JSON) with every path that names a moved run, or a file in it, naming its new place:
    ``moves`` are ``(old, new)`` pairs of the runs' last :data:`NAMED_PARTS` path components, matched whole, at the
    end of a path or before a ``/``, whatever comes before them (a relative path, another machine's absolute one)."""
    if isinstance(value, dict):
        return {k: repointed(v, moves) for k, v in value.items()}
    if isinstance(value, list):
        return [repointed(v, moves) for v in value]
    if not isinstance(value, str):
        return value
    for old, new in moves:
        at = value.find(old)
        while at >= 0:
            end = at + len(old)
            if (at == 0 or value[at - 1] == "/") and (end == len(value) or value[end] == "/"):
                return value[:at] + new + value[end:]
            at = value.find(old, at + 1)
    return value


def plan_records(ups: Sequence[Upgrade], tops: Sequence[Path]) -> Upgrade | None:
    """The records below ``tops`` that name a run being renamed, pointed at its new name (one :class:`Upgrade` of
    their own, applied before the runs); None when no run moves or no record names one."""
    moves = [("/".join(up.run.parts[-NAMED_PARTS:]), "/".join(up.move.parts[-NAMED_PARTS:])) for up in ups if up.move]
    if not moves:
        return None
    records = Upgrade(Path(tops[0]))
    for path in records_naming_runs(tops):
        old = read_json(path)
        new = repointed(old, moves)
        if old is not None and new != old:
            records.add(f"{path}: names a renamed run by its new name", path, json_writer(new))
    return records if records.notes else None


def apply(up: Upgrade) -> None:
    """Rename the directory first (one atomic step), then write every new file beside the one it replaces and replace
    them all. A kill after the rename leaves a run under today's name whose files the same command again rewrites
    (today's name is no longer the one an earlier version gave its record, so it is not moved twice); a kill before
    the replacements leaves its files as they were, and only temp files behind."""
    base = up.run
    if up.move is not None:
        up.move.parent.mkdir(parents=True, exist_ok=True)
        os.rename(up.run, up.move)
        base = up.move
        try:
            up.run.parent.rmdir()  # the old <rest> folder, when this was its last seed
        except OSError:
            pass
    staged = []
    try:
        for path, write in up.files.items():
            path = base / path.relative_to(up.run) if path.is_relative_to(up.run) else path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=TEMP_SUFFIX, dir=path.parent)
            os.chmod(tmp, 0o644)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            staged.append((tmp, path))
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    for path in up.stale:
        (base / path.relative_to(up.run)).unlink(missing_ok=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m swalab.upgrade",
                                description="Rewrite the outputs of earlier swalab versions in today's format "
                                            "(docs/reliability.md). Dry run unless --write.")
    p.add_argument("paths", nargs="+", help="outputs directories or run directories")
    p.add_argument("--write", action="store_true", help="apply the changes (default: only say what they would be)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Say (or, with ``--write``, make) each run's changes; 1 when a run could not be renamed or is damaged, else 0."""
    args = parser().parse_args(argv)
    runs = run_dirs(args.paths)
    planned = list(map(plan, runs))
    todo = [up for up in planned if up.notes or up.blocked]
    damaged = [up for up in planned if up.damaged]
    for up in (up for up in planned if up.notes or up.blocked or up.damaged):
        print(f"{up.run}:")
        for note in up.damaged:
            print(f"  not checked: {note}")
        for note in up.notes:
            print(f"  {note}")
        if up.blocked:
            print(f"  not renamed: {up.blocked}")
    records = plan_records(todo, [Path(p) for p in args.paths])
    if records is not None:
        print("records:")
        for note in records.notes:
            print(f"  {note}")
    if args.write:  # the records first: a kill before a run is renamed leaves them naming a name it takes next time
        for up in ([records] if records else []) + todo:
            apply(up)
    if damaged:
        print(f"{len(damaged)} of {len(runs)} run(s) damaged: the files named above could not be checked")
    if not todo:
        print(f"nothing to do: {len(runs)} run(s)" + ("" if damaged else ", all in today's format"))
    elif not args.write:
        print(f"dry run: {len(todo)} of {len(runs)} run(s) would change; add --write to change them")
    else:
        print(f"upgraded {len(todo)} of {len(runs)} run(s)")
    return 1 if damaged or any(up.blocked for up in todo) else 0


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="swalab.upgrade",
                                 interrupted="each run is changed whole or not yet; the same command again "
                                             "finishes the rest"))
