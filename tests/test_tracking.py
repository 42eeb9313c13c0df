"""W&B is a mirror, never a reason for a run to fail: offline runs, broken W&B, checkpoint artifacts."""

from __future__ import annotations

import json
import warnings

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF_DIR
from swalab.tracking import WandbTracker, sweep_tags
from swalab.train import train

wandb = pytest.importorskip("wandb")

TINY = ["dataset=digits", "dataset.train_size=128", "trainer.batch_size=64", "trainer.epochs=1", "method=sgd",
        "trainer.eval_every=0", "trainer.progress=false", "logger=wandb"]


def tiny_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


class FakeRun:
    """Stands in for ``wandb.init``'s run: records what would have been sent."""

    id = "fake123"

    def __init__(self):
        self.logged, self.artifacts, self.summary, self.finished = [], [], {}, []

    def log(self, row, step=None):
        self.logged.append(row)

    def log_artifact(self, artifact):
        self.artifacts.append(artifact)

    def finish(self, exit_code=0):
        self.finished.append(exit_code)


@pytest.mark.slow
def test_an_offline_run_writes_an_offline_wandb_run_beside_its_metrics(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    train(tiny_cfg("logger.mode=offline"), run_dir=run_dir)
    assert (run_dir / "metrics.json").exists()
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))


@pytest.mark.slow
def test_a_wandb_that_cannot_start_warns_once_and_training_completes(tmp_path, monkeypatch, offline_wandb):
    def refuse(**kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(wandb, "init", refuse)
    run_dir = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = train(tiny_cfg(), run_dir=run_dir)
    ours = [w for w in caught if "W&B failed" in str(w.message)]
    assert len(ours) == 1 and "ConnectionError: no network" in str(ours[0].message)
    assert json.loads((run_dir / "metrics.json").read_text())["sgd"]["acc"] == pytest.approx(metrics["sgd"]["acc"])
    assert json.loads((run_dir / "status.json").read_text())["status"] == "complete"


def test_a_wandb_that_breaks_mid_run_stops_being_called_after_one_warning(tmp_path, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={})

    def broken(row, step=None):
        raise OSError("disk full")

    run.log = broken
    with pytest.warns(RuntimeWarning, match="disk full"):
        tracker.log({"loss": 1.0}, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker.log({"loss": 0.5}, step=2)
        tracker.summary({"sgd": {"acc": 1.0}})
    assert tracker.not_logged == ["log", "log", "summary"]


@pytest.mark.parametrize("log_checkpoint, uploads", [(False, 0), (True, 1)])
def test_the_final_checkpoint_is_an_artifact_only_when_asked(tmp_path, monkeypatch, log_checkpoint, uploads):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    weights = tmp_path / "final.pt"
    weights.write_bytes(b"weights")
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={}, log_checkpoint=log_checkpoint)
    tracker.final_checkpoint(weights)
    assert len(run.artifacts) == uploads
    if uploads:
        assert run.artifacts[0].type == "model" and run.artifacts[0].name.startswith("fake123-final")


@pytest.mark.slow
def test_a_run_that_fails_while_training_finishes_its_wandb_run_with_exit_code_1(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: runs.append(FakeRun()) or runs[-1])
    with pytest.raises(Exception, match="NaN"):
        train(tiny_cfg("schedule.lr=1e30"), run_dir=tmp_path / "r")
    assert json.loads((tmp_path / "r" / "status.json").read_text())["status"] == "failed"
    assert len(runs) == 1 and runs[0].finished == [1]  # a grid's next job starts a fresh W&B run


def test_runs_outside_a_multirun_carry_no_sweep_tag():
    assert sweep_tags() == []
