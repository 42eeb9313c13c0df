"""A run directory is a swalab run or it is left alone: ``run.dir`` pointing at a folder of the user's that holds a file
with a name a run writes (``history.jsonl``, ``metrics.json``, ``config.yaml``) is refused, naming the files, before
anything is written; the refusal of a folder that was never a run never speaks of the run it is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from swalab.config import ConfigError
from swalab.runlock import LOCK_FILE
from swalab.train import prepare, train
from swalab.rundir import RunDir

QUIET = ["logger=none", "run.progress=false"]
TINY = [*QUIET, "dataset.train_size=128", "trainer.batch_size=64", "trainer.epochs=2", "model.arch.depth=8",
        "run.eval_every=0", "method=sgd"]


def contents(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name, text", [
    ("history.jsonl", '{"my own": "line"}\n'),        # a user's own log lines
    ("metrics.json", "{not json"),                    # a metrics file that does not parse
    ("metrics.json", '{"mine": {"acc": 1}}'),         # one that parses
    ("run.log", "my notes\n"),
])
def test_a_folder_that_is_no_run_but_holds_a_file_a_run_writes_is_refused_and_left_as_it_was(
        tmp_path, make_cfg, name, text):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / name).write_text(text)
    (folder / "notes.txt").write_text("kept")
    before = contents(folder)
    with pytest.raises(ConfigError, match=rf"{folder} is not a swalab run .* holds {name}, which a run writes"):
        train(make_cfg(*TINY), run_dir=folder)
    assert contents(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted([name, "notes.txt"])


def test_a_folder_holding_only_a_foreign_config_yaml_is_refused_as_no_run_without_speaking_of_fingerprints(
        tmp_path, make_cfg, caplog):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.yaml").write_text("lr: 3\nname: my project\n")
    with pytest.raises(ConfigError) as refused:
        prepare(make_cfg(*TINY), run_dir=folder)
    assert str(refused.value).startswith(f"{folder} is not a swalab run")
    assert "holds config.yaml, which a run writes" in str(refused.value)
    assert "fingerprint" not in caplog.text and "another config" not in str(refused.value)


def test_an_outputs_folder_of_other_runs_given_as_run_dir_is_refused_naming_paths_output_dir(tmp_path, make_cfg):
    """run.dir=outputs/short (typed for paths.output_dir=outputs/short) trained a run into the grid's outputs folder,
    its files beside the runs' own folders: the refusal names a run it holds and the key that places runs under it."""
    outputs = tmp_path / "short"
    inner = outputs / "digits" / "preresnet20" / "sgd" / "seed0"
    inner.mkdir(parents=True)
    (inner / RunDir.IDENTITY).write_text("{}")
    before = contents(outputs)
    with pytest.raises(ConfigError, match=rf"{outputs} is not a swalab run but holds runs "
                                          rf"\(digits/preresnet20/sgd/seed0\).*paths.output_dir={outputs}"):
        prepare(make_cfg(*TINY), run_dir=outputs)
    assert contents(outputs) == before and sorted(p.name for p in outputs.iterdir()) == ["digits"]


def test_a_folder_of_the_users_without_a_file_a_run_writes_takes_the_run(tmp_path, make_cfg):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept")
    train(make_cfg(*TINY), run_dir=folder)
    assert (folder / "metrics.json").exists() and (folder / "notes.txt").read_text() == "kept"


def test_every_file_a_finished_run_writes_is_among_the_names_that_mark_a_clash(tmp_path, make_cfg):
    run = tmp_path / "run"
    train(make_cfg(*TINY, "method=swa", "logger=wandb", "logger.mode=disabled"), run_dir=run)
    assert {p.name for p in run.iterdir()} <= {*RunDir.FILES, LOCK_FILE}  # the lock is the lock's business (runlock)


def old_run_without_fingerprint(run):
    """``run`` as an earlier swalab left it: no data fingerprint in its identity."""
    stored = json.loads((run / "identity.json").read_text())
    stored["identity"].pop("data.fingerprint")
    (run / "identity.json").write_text(json.dumps(stored))


def test_a_new_config_in_an_old_runs_folder_is_refused_without_the_line_that_promises_to_fingerprint_it(
        tmp_path, make_cfg, caplog):
    run = tmp_path / "run"
    train(make_cfg(*TINY), run_dir=run)
    old_run_without_fingerprint(run)
    caplog.clear()
    with pytest.raises(ConfigError, match="holds a run of another config"):
        prepare(make_cfg(*TINY, "seed=1"), run_dir=run)
    assert "fingerprint" not in caplog.text


def test_an_old_run_continued_says_its_data_are_fingerprinted_from_now_on_and_a_finished_one_does_not(
        tmp_path, make_cfg, caplog):
    run = tmp_path / "run"
    train(make_cfg(*TINY), run_dir=run)
    old_run_without_fingerprint(run)
    caplog.clear()
    assert prepare(make_cfg(*TINY), run_dir=run).finished is not None
    assert "did not fingerprint its data" in caplog.text and "from now on" not in caplog.text
    (run / "metrics.json").unlink()
    caplog.clear()
    assert prepare(make_cfg(*TINY), run_dir=run).finished is None
    assert "from now on they are (data.json)" in caplog.text


def test_the_cli_refuses_a_folder_that_is_no_run_in_one_line_with_exit_2(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "history.jsonl").write_text('{"mine": 1}\n')
    done = subprocess.run([sys.executable, str(REPO / "run.py"), *TINY, f"run.dir={folder}"], cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a swalab run" in lines[0] and "run.dir=" in lines[0]
    assert sorted(p.name for p in folder.iterdir()) == ["history.jsonl"]
    assert (folder / "history.jsonl").read_text() == '{"mine": 1}\n'


def test_every_reader_of_a_history_skips_a_line_cut_short_and_keeps_the_other_epochs(tmp_path):
    """The report, a row's cost and the error curves read a run's history through one reader: a line cut short (a
    copy interrupted, an edit by hand) is skipped, never the run's whole history refused or read differently."""
    from swalab.analysis.curves import read_history
    from swalab.results.row import trained_epochs
    from swalab.results.runs import Run

    (tmp_path / RunDir.HISTORY).write_text(
        '{"epoch": 1, "test_acc": 10.0, "seconds": 1.0}\n{"epoch": 2, "test_a\n'
        '{"epoch": 3, "test_acc": 30.0, "seconds": 2.0}\n\n')
    rows = [{"epoch": 1, "test_acc": 10.0, "seconds": 1.0}, {"epoch": 3, "test_acc": 30.0, "seconds": 2.0}]
    assert RunDir(tmp_path).history() == rows
    assert Run(tmp_path).history == rows
    assert read_history(tmp_path) == rows
    assert trained_epochs(tmp_path, after=1) == rows[1:]
