"""``python -m swalab.upgrade``: outputs of earlier swalab versions rewritten once in today's format (docs/reliability.md).

A run of today is trained once (the tiny SWA run of tests/test_reliability.py), copied, and the copy rewritten as an
earlier swalab wrote it: its identity and config under the old names, its checkpoints carrying the scored budget
marks as probabilities, its predictions.pt of probabilities only. Today's code refuses such a run in one line naming
the command; the command's dry run changes nothing, ``--write`` gives back today's files, and a second invocation
has nothing to do. A kill between two runs leaves each whole.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from swalab import upgrade
from swalab.checkpoint import checkpoint_paths
from swalab.compat import RENAMED
from swalab.identity import IDENTITY_VERSION, group_hash
from swalab.results.ensembles import saved_log_probs
from swalab.results.runs import Run
from swalab.rundir import RunDir
from test_reliability import make_cfg

UPGRADE = "python -m swalab.upgrade"


@pytest.fixture(scope="module")
def today_run(tmp_path_factory) -> Path:
    """A finished SWA run of today that kept its checkpoints (its scored budget marks in checkpoints/predictions/)."""
    from swalab.train import train

    run = tmp_path_factory.mktemp("today") / "swa" / "default" / "seed0"
    train(make_cfg("model.swa.score_at_budgets=[1.125]"), run_dir=run)  # a mark at epoch 3 of 4
    return run


# SWA's settings an earlier swalab spelled with a prefix (method.swa_lr for method.lr), as compat.RENAMED reads them.
SWA_PREFIXED = {new.split(".")[1]: old.split(".")[1] for old, new in RENAMED.items() if old.startswith("method.swa_")}


def earlier_identity(identity: dict) -> dict:
    """An identity as an earlier swalab recorded it: SWA's settings in method.* with their own spellings, init_from
    in run."""
    spelled = {"model.init_from": "run.init_from"} | {f"method.{k}": f"method.{o}" for k, o in SWA_PREFIXED.items()}
    return {spelled.get(k, k): v for k, v in identity.items()}


def earlier_config(config: dict) -> dict:
    """A config.yaml as an earlier swalab wrote it: SWA's settings in method.* (with their own spellings) and no
    recipe block, the optimizer's in trainer."""
    old = json.loads(json.dumps(config))
    del old["model"]["swa"]
    for name, old_name in SWA_PREFIXED.items():
        old["method"][old_name] = old["method"].pop(name)
    for key in ("momentum", "weight_decay", "nesterov"):
        old["trainer"][key] = old["optimizer"].pop(key)
    return old


def make_earlier(today: Path, where: Path) -> Path:
    """A copy of the run ``today`` at ``where``, rewritten in the formats of an earlier swalab."""
    run = Path(shutil.copytree(today, where))
    record = json.loads((run / RunDir.IDENTITY).read_text())
    kept = {k: record[k] for k in ("hash", "group", "apart") if k in record}
    (run / RunDir.IDENTITY).write_text(json.dumps({**kept, "identity": earlier_identity(record["identity"])}))
    (run / RunDir.CONFIG).write_text(yaml.safe_dump(earlier_config(RunDir(run).config())))
    for path in checkpoint_paths(run / RunDir.CHECKPOINTS):
        state = torch.load(path, weights_only=False)
        state["identity"] = earlier_identity(state["identity"])
        names = state["method"].pop("budget_files")
        state["method"].pop("budget_val_files")
        state["method"]["budget_probs"] = {k: torch.load(path.parent / "predictions" / f"{k}.pt").exp() for k in names}
        torch.save(state, path)
    shutil.rmtree(run / RunDir.CHECKPOINTS / "predictions")
    saved = torch.load(run / RunDir.PREDICTIONS, weights_only=False)
    torch.save({"probs": saved["probs"], "labels": saved["labels"]}, run / RunDir.PREDICTIONS)
    return run


def contents(top: Path) -> dict[str, str]:
    """Every file below ``top`` and a hash of its bytes."""
    return {p.relative_to(top).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(top.rglob("*")) if p.is_file()}


def test_a_run_of_today_needs_nothing(today_run, capsys):
    before = contents(today_run)
    assert upgrade.main([str(today_run.parent.parent), "--write"]) == 0
    assert "nothing to do: 1 run(s), all in today's format" in capsys.readouterr().out
    assert contents(today_run) == before


def test_todays_report_refuses_an_earlier_runs_predictions_naming_the_command(today_run, tmp_path):
    run = make_earlier(today_run, tmp_path / "old" / "seed0")
    _, _, why = saved_log_probs(run, "swa")
    assert why.startswith(f"{run / RunDir.PREDICTIONS} is in the format of an earlier swalab") and UPGRADE in why


def test_the_dry_run_says_what_it_would_change_and_changes_nothing(today_run, tmp_path, capsys):
    run = make_earlier(today_run, tmp_path / "old" / "seed0")
    before = contents(tmp_path)
    assert upgrade.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert contents(tmp_path) == before
    for said in ("predictions.pt: log-probabilities added", "config.yaml: keys moved to today's places",
                 f"identity.json: identity version 1 -> {IDENTITY_VERSION}", "SWA budget marks' predictions moved",
                 "dry run: 1 of 1 run(s) would change; add --write"):
        assert said in out, out
    assert str(run) in out


def test_write_gives_back_todays_files_and_a_second_invocation_has_nothing_to_do(today_run, tmp_path, capsys):
    run = make_earlier(today_run, tmp_path / "swa" / "default" / "seed0")
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    assert "upgraded 1 of 1 run(s)" in capsys.readouterr().out
    assert json.loads((run / RunDir.IDENTITY).read_text()) == json.loads((today_run / RunDir.IDENTITY).read_text())
    assert Run(run).config == Run(today_run).config
    for path in checkpoint_paths(today_run / RunDir.CHECKPOINTS):
        ours = torch.load(run / RunDir.CHECKPOINTS / path.name, weights_only=False)
        theirs = torch.load(path, weights_only=False)
        assert ours["identity"] == theirs["identity"] and ours["method"].keys() == theirs["method"].keys()
        for name in theirs["method"]["budget_files"]:
            torch.testing.assert_close(torch.load(path.parent / "predictions" / f"{name}.pt"),
                                       torch.load(run / RunDir.CHECKPOINTS / "predictions" / f"{name}.pt"))
    ours, _, why = saved_log_probs(run, "swa")
    theirs, _, _ = saved_log_probs(today_run, "swa")
    assert why is None
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=2e-3)  # float16 probabilities, then their logs
    after = contents(tmp_path)
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    assert "nothing to do: 1 run(s)" in capsys.readouterr().out
    assert contents(tmp_path) == after


def test_a_kill_between_two_runs_leaves_the_first_new_and_the_second_old_and_the_same_command_finishes(
        today_run, tmp_path, monkeypatch, capsys):
    first = make_earlier(today_run, tmp_path / "a" / "seed0")
    second = make_earlier(today_run, tmp_path / "b" / "seed0")
    old_second = contents(second)
    applied = []
    real_apply = upgrade.apply

    def killed_at_the_second(up):
        if applied:
            raise KeyboardInterrupt  # the kill, before the second run's first file was written
        applied.append(up.run)
        real_apply(up)

    monkeypatch.setattr(upgrade, "apply", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        upgrade.main([str(tmp_path), "--write"])
    monkeypatch.undo()
    assert upgrade.plan(first).notes == []  # whole: today's
    assert contents(second) == old_second   # whole: as it was
    capsys.readouterr()
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    out = capsys.readouterr().out
    assert str(second) in out and f"{first}:" not in out
    assert upgrade.plan(second).notes == []


def todays_name_record(today_run: Path, apart: dict) -> dict:
    """``today_run``'s identity record set apart from its defaults by ``apart``, as identity version 5 writes it."""
    record = json.loads((today_run / RunDir.IDENTITY).read_text())
    return {**record, "apart": apart}


def test_a_run_directory_named_by_identity_version_2_is_renamed_to_todays_name(today_run, tmp_path, capsys):
    apart = {"model.swa.lr": 0.05}
    record = {**todays_name_record(today_run, apart), "version": 2}
    then_rest, seed = upgrade.name_tail(apart, record["identity"]["seed"], record["group"], 2)
    today_rest, _ = upgrade.name_tail(apart, record["identity"]["seed"], group_hash(record["identity"]),
                                      IDENTITY_VERSION)
    assert (then_rest, today_rest) == ("model.swa.lr-0.05", "swa.lr-0.05")
    old = tmp_path / "digits" / "preresnet8" / "swa" / then_rest / seed
    old.mkdir(parents=True)
    (old / RunDir.IDENTITY).write_text(json.dumps(record))
    shutil.copy(today_run / RunDir.CONFIG, old)  # every run holds its config
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    assert "directory renamed to today's name swa.lr-0.05/seed0" in capsys.readouterr().out
    new = old.parent.parent / today_rest / seed
    assert not old.parent.exists() and json.loads((new / RunDir.IDENTITY).read_text())["version"] == IDENTITY_VERSION
    assert upgrade.main([str(tmp_path)]) == 0 and "nothing to do" in capsys.readouterr().out


def test_a_rename_onto_a_taken_name_is_refused_saying_so_and_the_run_stays(today_run, tmp_path, capsys):
    apart = {"model.swa.lr": 0.05}
    record = {**todays_name_record(today_run, apart), "version": 2}
    old = tmp_path / "swa" / "model.swa.lr-0.05" / "seed0"
    taken = tmp_path / "swa" / "swa.lr-0.05" / "seed0"
    for folder in (old, taken):
        folder.mkdir(parents=True)
    (old / RunDir.IDENTITY).write_text(json.dumps(record))
    shutil.copy(today_run / RunDir.CONFIG, old)  # every run holds its config
    (taken / RunDir.IDENTITY).write_text(json.dumps({**record, "version": IDENTITY_VERSION}))
    assert upgrade.main([str(tmp_path), "--write"]) == 1
    assert f"not renamed: its name today is {taken}, which is taken" in capsys.readouterr().out
    assert (old / RunDir.IDENTITY).exists()


def test_a_run_placed_by_hand_keeps_its_directory(today_run, tmp_path, capsys):
    record = {**todays_name_record(today_run, {"model.swa.lr": 0.05}), "version": 2}
    run = tmp_path / "my_runs" / "lr005"
    run.mkdir(parents=True)
    (run / RunDir.IDENTITY).write_text(json.dumps(record))
    shutil.copy(today_run / RunDir.CONFIG, run)  # every run holds its config
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    assert "renamed" not in capsys.readouterr().out and (run / RunDir.IDENTITY).exists()


def test_a_damaged_run_is_named_with_its_damaged_file_and_left_as_it_is_not_called_todays_format(
        today_run, tmp_path, capsys):
    cut, bare = tmp_path / "cut" / "seed0", tmp_path / "bare" / "seed0"
    for run in (cut, bare):
        shutil.copytree(today_run, run)
    (cut / RunDir.IDENTITY).write_text((cut / RunDir.IDENTITY).read_text()[:20])
    (bare / RunDir.CONFIG).write_text("seed: [0\n")  # cut short; a run without one (the Python API's) is no damage
    before = contents(tmp_path)
    assert upgrade.main([str(tmp_path), "--write"]) == 1
    out = capsys.readouterr().out
    assert f"{cut}:\n  not checked: {RunDir.IDENTITY} cannot be read" in out
    assert f"{bare}:\n  not checked: {RunDir.CONFIG} cannot be read" in out
    assert "all in today's format" not in out and "2 of 2 run(s) damaged" in out
    assert contents(tmp_path) == before


def test_a_path_that_is_no_directory_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        upgrade.run_command(upgrade.main, [str(tmp_path / "nosuch")], prog="swalab.upgrade")
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"[swalab.upgrade] {tmp_path / 'nosuch'}: no such directory (give an " \
                                              "outputs directory or a run directory)"


def test_the_records_that_name_a_renamed_run_name_it_by_its_new_name(today_run, tmp_path, capsys):
    """A branched row's record, a grid job's and a branch's lineage name runs by path (relative, or absolute on the
    machine that ran them): after the rename each names the run's new directory, and the report's row still finds
    it; a path that only begins like the old name is left alone."""
    apart = {"model.swa.lr": 0.05}
    record = {**todays_name_record(today_run, apart), "version": 2}
    old = tmp_path / "digits" / "preresnet8" / "swa" / "model.swa.lr-0.05" / "seed0"
    old.mkdir(parents=True)
    (old / RunDir.IDENTITY).write_text(json.dumps(record))
    shutil.copy(today_run / RunDir.CONFIG, old)  # every run holds its config
    elsewhere = "/cluster/me/outputs/digits/preresnet8/swa/model.swa.lr-0.05/seed0"
    row = {"jobs": [{"run_dir": "digits/preresnet8/swa/model.swa.lr-0.05/seed0"}, {"run_dir": elsewhere},
                    {"run_dir": "digits/preresnet8/swa/model.swa.lr-0.05x/seed0"}]}
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "row_seed0.json").write_text(json.dumps(row))
    job = tmp_path / "grids" / "2026-11-27_08-00-00" / "jobs" / "0.json"
    job.parent.mkdir(parents=True)
    job.write_text(json.dumps({"run_dir": str(old), "state": "complete"}))
    child = tmp_path / "digits" / "preresnet8" / "swag" / "default" / "seed0"
    child.mkdir(parents=True)
    (child / RunDir.LINEAGE).write_text(json.dumps({"kind": "branch", "parent": elsewhere,
                                                    "checkpoint": f"{elsewhere}/checkpoints/saved/epoch0003.pt"}))
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    new = "digits/preresnet8/swa/swa.lr-0.05/seed0"
    assert "names a renamed run by its new name" in capsys.readouterr().out
    row = json.loads((tmp_path / "rows" / "row_seed0.json").read_text())
    assert [j["run_dir"] for j in row["jobs"]] == [new, f"/cluster/me/outputs/{new}",
                                                   "digits/preresnet8/swa/model.swa.lr-0.05x/seed0"]
    assert json.loads(job.read_text()) == {"run_dir": str(tmp_path / new), "state": "complete"}
    lineage = json.loads((child / RunDir.LINEAGE).read_text())
    assert lineage["parent"] == f"/cluster/me/outputs/{new}"
    assert lineage["checkpoint"] == f"/cluster/me/outputs/{new}/checkpoints/saved/epoch0003.pt"
    assert (tmp_path / new / RunDir.IDENTITY).exists()
    assert upgrade.main([str(tmp_path)]) == 0 and "nothing to do" in capsys.readouterr().out


def test_a_kill_after_a_rename_leaves_a_run_the_same_command_finishes_without_moving_it_again(
        today_run, tmp_path, capsys, monkeypatch):
    apart = {"model.swa.lr": 0.05}
    record = {**todays_name_record(today_run, apart), "version": 2}
    old = tmp_path / "swa" / "model.swa.lr-0.05" / "seed0"
    old.mkdir(parents=True)
    (old / RunDir.IDENTITY).write_text(json.dumps(record))
    shutil.copy(today_run / RunDir.CONFIG, old)  # every run holds its config

    def killed(*_, **__):
        raise KeyboardInterrupt
    with monkeypatch.context() as patched:
        patched.setattr(upgrade.tempfile, "mkstemp", killed)  # renamed, then killed before its files are written
        with pytest.raises(KeyboardInterrupt):
            upgrade.main([str(tmp_path), "--write"])
    new = tmp_path / "swa" / "swa.lr-0.05" / "seed0"
    assert not old.exists() and json.loads((new / RunDir.IDENTITY).read_text())["version"] == 2
    capsys.readouterr()
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    out = capsys.readouterr().out
    assert "directory renamed" not in out and f"{new}:\n  identity.json: identity version 2 -> " in out
    assert json.loads((new / RunDir.IDENTITY).read_text())["version"] == IDENTITY_VERSION
    assert upgrade.main([str(tmp_path)]) == 0 and "nothing to do" in capsys.readouterr().out


def test_the_temp_files_of_an_upgrade_killed_while_writing_are_removed_by_the_next_one(today_run, tmp_path, capsys):
    run = make_earlier(today_run, tmp_path / "swa" / "default" / "seed0")
    left = run / f"{RunDir.PREDICTIONS}.abc123{upgrade.TEMP_SUFFIX}"
    left.write_bytes(b"half a file")
    assert upgrade.main([str(tmp_path), "--write"]) == 0
    assert "1 temp file(s) an interrupted upgrade left: removed" in capsys.readouterr().out
    assert not left.exists() and not list(run.rglob(f"*{upgrade.TEMP_SUFFIX}"))
    assert upgrade.main([str(tmp_path)]) == 0 and "nothing to do" in capsys.readouterr().out
