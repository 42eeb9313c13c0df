"""W&B is a mirror, never a reason for a run to fail: offline runs, broken W&B, checkpoint artifacts;
and a mirror a W&B user can read: names, groups, tags, epoch axes, one W&B run per swalab run however
often it is resumed, and a bounded wait for a server that does not answer."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import CONF_DIR, REPO
from swalab import faults
from swalab.tracking import RECORD_FILE, WandbTracker, run_labels
from swalab.train import prepare, train
from swalab.train.execute import wandb_run
from swalab.pausing import Preempted
from wandb_records import complete_records, read_runs

import wandb  # a dependency of swalab (pyproject.toml): its absence is a broken install, not a reason to skip

TINY = ["dataset=digits", "dataset.train_size=128", "trainer.batch_size=64", "trainer.epochs=1", "method=sgd",
        "run.eval_every=0", "run.progress=false", "logger=wandb"]


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

    def __init__(self, starting_step=0):
        self.logged, self.steps, self.artifacts, self.summary, self.finished = [], [], [], {}, []
        self.axes, self.starting_step = {}, starting_step

    def define_metric(self, name, step_metric=None, **kwargs):
        self.axes[name] = step_metric

    def log(self, row, step=None):
        self.logged.append(row)
        self.steps.append(step)

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


# -- what a W&B user reads --------------------------------------------------------------------------

GRID = "2026-11-23_15-00-00"


def labels_of(tmp_path, *overrides, grid=GRID):
    """What the W&B run of ``python run.py -m <overrides>`` would be called, decided without training."""
    overrides = [*overrides, "logger=wandb", f"paths.output_dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):  # run.py's Hydra application
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        plan = prepare(task, overrides=overrides, choices=choices, grid=tmp_path / "grids" / grid if grid else None)
    return wandb_run(plan)


def test_the_runs_of_a_2x2_grid_are_named_by_method_overrides_and_seed_and_grouped_by_config(tmp_path):
    runs = {(method, seed): labels_of(tmp_path, f"method={method}", f"seed={seed}", "trainer.epochs=2")
            for method in ("sgd", "swa") for seed in (0, 1)}
    assert [r["name"] for r in runs.values()] == ["sgd trainer.epochs-2 seed0", "sgd trainer.epochs-2 seed1",
                                                 "swa trainer.epochs-2 seed0", "swa trainer.epochs-2 seed1"]
    sgd, swa = runs["sgd", 0]["group"], runs["swa", 0]["group"]
    assert runs["sgd", 1]["group"] == sgd and runs["swa", 1]["group"] == swa and sgd != swa  # seeds share a group
    assert sgd.startswith("digits-preresnet20-sgd-trainer.epochs-2-") and swa.startswith("digits-preresnet20-swa-")
    assert [r["job_type"] for r in runs.values()] == ["sgd", "sgd", "swa", "swa"]
    assert runs["swa", 1]["tags"] == ["swa-lab", "dataset:digits", "model:preresnet20", "method:swa", f"grid:{GRID}"]
    assert len({r["id"] for r in runs.values()}) == 4


def test_a_config_override_makes_another_group_and_a_single_run_carries_no_grid_tag(tmp_path):
    plain = labels_of(tmp_path, "method=sgd", "trainer.epochs=2", grid=None)
    longer = labels_of(tmp_path, "method=sgd", "trainer.epochs=3", grid=None)
    assert plain["group"] != longer["group"] and longer["name"] == "sgd trainer.epochs-3 seed0"
    assert not any(t.startswith("grid:") for t in plain["tags"])


def test_a_default_run_is_called_by_its_method_and_seed_and_long_labels_end_after_a_whole_item():
    labels = run_labels("cifar100", "vgg16", "swa", 2, [], "0123abcd4567")
    assert labels["name"] == "swa seed2" and labels["group"] == "cifar100-vgg16-swa-0123abcd"
    long = run_labels("d", "m", "swa", 0, ["a.b-" + "x" * 50, "c.d-" + "y" * 50, "e.f-" + "z" * 10], "0" * 12)
    assert long["name"] == f"swa a.b-{'x' * 50} c.d-{'y' * 50} … seed0" and len(long["name"]) <= 128
    assert long["group"] == f"d-m-swa-a.b-{'x' * 50}+c.d-{'y' * 50}+…-00000000" and len(long["group"]) <= 128


def test_a_run_relaunched_in_another_grid_keeps_its_id_and_both_grid_tags(tmp_path):
    first = labels_of(tmp_path, "method=sgd")
    run_dir = tmp_path / "digits/preresnet20/sgd/default/seed0"
    run_dir.mkdir(parents=True)
    (run_dir / RECORD_FILE).write_text(json.dumps(first))
    again = labels_of(tmp_path, "method=sgd", grid="2026-11-24_09-00-00")
    assert again["id"] == first["id"]
    assert again["tags"][-2:] == ["grid:2026-11-24_09-00-00", f"grid:{GRID}"]


def test_every_epoch_metric_is_plotted_against_epoch_with_test_error_beside_accuracy(tmp_path, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={})
    tracker.log_epoch({"epoch": 1, "train_loss": 2.0, "test_acc": 60.0, "swa_test_acc": 70.0})
    assert run.axes == {"epoch": None, "*": "epoch"} and run.steps == [1]
    assert run.logged[0]["test_error"] == 40.0 and run.logged[0]["swa_test_error"] == 30.0


def test_final_metrics_are_numbers_in_the_summary_and_curves_are_tables(tmp_path, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={})
    bins = [{"lo": 0.9, "hi": 1.0, "count": 3, "acc": 0.66, "conf": 0.95}, {"lo": 0.0, "hi": 0.1, "count": 0,
                                                                           "acc": None, "conf": None}]
    tracker.results({"fge": {"acc": 91.5, "nll": 0.3, "ece": 0.02, "curve": [{"members": 1, "acc": 90.0},
                                                                             {"members": 2, "acc": 91.5}]}},
                    {"fge": bins})
    assert run.summary == {"fge/acc": 91.5, "fge/nll": 0.3, "fge/ece": 0.02}
    [charts] = run.logged
    assert charts["fge/curve"].table.data == [[1, 90.0, None, None, None], [2, 91.5, None, None, None]]
    assert charts["reliability"].table.data == [["fge", 0.9, 1.0, 0.95, 0.66, 3]]  # empty bins left out


def test_a_resumed_online_run_skips_the_epochs_wandb_already_holds(tmp_path, monkeypatch):
    run = FakeRun(starting_step=3)  # W&B holds steps 1 and 2
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={}, run_id="abc", logged_through=1)
    for epoch in (1, 2, 3, 4):
        tracker.log_epoch({"epoch": epoch})
    assert run.steps == [3, 4]


def preempt_then_resume(run_dir, resume_dir, monkeypatch, cfg):
    faults.reset()
    monkeypatch.setenv(faults.ENV, "train_step:5:TERM")  # epoch 3, step 1 of 2
    with pytest.raises(Preempted):
        train(cfg, run_dir=run_dir)
    monkeypatch.delenv(faults.ENV)
    if resume_dir != run_dir:  # another machine: the directory was copied there, once W&B had written it all
        for path in (run_dir / "wandb").glob("offline-run-*/*.wandb"):
            complete_records(path, wait=15)
        shutil.copytree(run_dir, resume_dir)
    train(cfg, run_dir=resume_dir)
    return read_runs(resume_dir / "wandb")


@pytest.mark.parametrize("where", ["same directory", "copied to another machine"])
def test_a_preempted_and_resumed_run_is_one_wandb_run_with_each_epoch_once(tmp_path, offline_wandb, monkeypatch,
                                                                           where):
    run_dir = tmp_path / "run"
    resume_dir = run_dir if where == "same directory" else tmp_path / "elsewhere" / "run"
    runs = preempt_then_resume(run_dir, resume_dir, monkeypatch, tiny_cfg("trainer.epochs=4", "model.arch.depth=8"))
    [(run_id, run)] = runs.items()
    assert run_id == json.loads((resume_dir / RECORD_FILE).read_text())["id"]
    assert len(run.segments) == 2 and run.epochs == [1, 2, 3, 4]
    assert run.summary["sgd/acc"] == json.loads((resume_dir / "metrics.json").read_text())["sgd"]["acc"]


def child_env() -> dict:
    """This environment for a ``run.py`` subprocess, without W&B's: an in-process test's ``wandb.init`` leaves
    ``WANDB_SERVICE`` set, which would make the child share this process's W&B service."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "OMP_NUM_THREADS": "1"}


GRID_2X2 = ["dataset.train_size=128", "trainer.batch_size=64", "trainer.epochs=2", "model.arch.depth=8",
            "run.eval_every=0", "run.progress=false", "logger=wandb", "method=sgd,swa", "seed=0,1"]


@pytest.mark.slow
def test_a_2x2_grid_read_back_from_its_offline_files(tmp_path):
    env = {**child_env(), "WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, str(REPO / "run.py"), "-m", *GRID_2X2, f"paths.output_dir={tmp_path}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [grid] = (tmp_path / "grids").iterdir()
    runs = {}
    for record in tmp_path.rglob(RECORD_FILE):
        [(run_id, run)] = read_runs(record.parent / "wandb").items()
        assert run_id == json.loads(record.read_text())["id"]
        runs[run.name] = run
    rest = "dataset.train_size-128 model.arch.depth-8 trainer.batch_size-64 trainer.epochs-2"  # run.*: no result
    assert sorted(runs) == [f"{method} {rest} seed{seed}" for method in ("sgd", "swa") for seed in (0, 1)]
    assert len({r.group for r in runs.values()}) == 2
    assert all(r.tags[-1] == f"grid:{grid.name}" and r.job_type == r.name.split()[0] for r in runs.values())
    swa = runs[f"swa {rest} seed0"]
    assert swa.step_metrics == {"*": "epoch"} and swa.epochs == [1, 2]
    assert isinstance(swa.summary["swa/acc"], float) and swa.summary["reliability_table/_type"] == "table-file"


# -- an unreachable server ----------------------------------------------------------------------------

@pytest.fixture
def silent_server():
    """A local endpoint that accepts connections and never answers (a server that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.slow
def test_an_unanswering_server_costs_at_most_init_timeout_and_the_run_is_mirrored_offline(tmp_path, silent_server):
    env = {**child_env(), "WANDB_BASE_URL": silent_server, "WANDB_API_KEY": "x" * 40, "HOME": str(tmp_path),
           "WANDB_SILENT": "true"}
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(REPO / "run.py"), *TINY, "model.arch.depth=8", "logger.mode=online",
                           "logger.init_timeout=5", f"run.dir={run_dir}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "W&B could not start online" in done.stderr and "logger.init_timeout=5 s" in done.stderr
    stamps = [line[:19] for line in (run_dir / "run.log").read_text().splitlines()
              if "[swalab] training" in line or line[20:].startswith("epoch 1/")]
    waited = time.mktime(time.strptime(stamps[1], "%Y-%m-%d %H:%M:%S")) - \
        time.mktime(time.strptime(stamps[0], "%Y-%m-%d %H:%M:%S"))
    assert waited <= 5 + 3  # the timeout, W&B's own start and one tiny epoch
    assert ended - (run_dir / "status.json").stat().st_mtime < 8  # no wait for the server at exit either
    [(run_id, run)] = read_runs(run_dir / "wandb").items()
    assert run_id == json.loads((run_dir / RECORD_FILE).read_text())["id"] and run.epochs == [1]
