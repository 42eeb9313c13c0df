"""Runs survive kills, preemption, bad input and flaky services without losing work (docs/reliability.md).

Every test trains the same tiny SWA run on the bundled digits (PreResNet-8, 256 training images, batch
64: 4 steps per epoch, 4 epochs, averaging from epoch 2) and compares against one uninterrupted run of
it. Faults are placed exactly with the test-only hook ``SWALAB_FAULT=<point>:<n>[:<signal>]``
(``swalab.faults``). Kills must happen in a child process (``python run.py ...``); everything that can
run in-process does, to keep the default suite short.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from PIL import Image

import swalab  # noqa: F401  (registers the config resolvers)
from swalab import faults
from swalab.checkpoint import CheckpointError, CheckpointStore, checkpoint_paths, load_latest, save_checkpoint
from swalab.config import ConfigError
from swalab.data.cache import CACHE_FORMAT_VERSION, cache_path, load_cache
from swalab.train import train
from swalab.runweights import load_init_weights
from swalab.pausing import PREEMPTED_EXIT_CODE, Preempted
from swalab.step import NonFiniteLossError

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# The tests here pretend a finished run died after its last checkpoint (its metrics.json removed or damaged), so they
# keep the checkpoints a finished run deletes (run.keep_finished_checkpoints; what it deletes: the tests at the end).
TINY = ["logger=none", "run.progress=false", "trainer.epochs=4", "model.swa.start_epoch=2",
        "dataset.train_size=256", "trainer.batch_size=64", "model.arch.depth=8", "run.keep_finished_checkpoints=true"]
STEPS_PER_EPOCH = 4
# What a pause at step 2 of epoch 2 says: the checkpoint's file and the same epochs (swalab.checkpoint.checkpoint_words)
PAUSED_AT_STEP_2_OF_EPOCH_2 = "checkpoint epoch0001_step000002.pt written (after epoch 1 and 2 steps of epoch 2)"
# The number of threads changes the order of float sums: the in-process runs and the `python run.py` children of
# this file use one thread each, so that a resumed run can be compared bit for bit with the reference on any machine.
THREADS = 1


# -- helpers -----------------------------------------------------------------------------------
def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


def run_cli(run_dir: Path, *overrides: str, fault: str | None = None, timeout: int = 300,
            python: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python run.py <TINY> run.dir=<run_dir>``, optionally with a planned fault."""
    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, "OMP_NUM_THREADS": str(THREADS)}
    if fault:
        env[faults.ENV] = fault
    cmd = [*(python or [PYTHON, "run.py"]), *TINY, *overrides, f"run.dir={run_dir}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=ctrl_c_as_in_a_terminal)


def ctrl_c_as_in_a_terminal() -> None:
    """SIGINT back to its default in the child, so that Python turns it into KeyboardInterrupt as in a terminal
    (a suite started in the background, ``nohup ... &``, hands its children SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def history(run_dir: Path) -> list[dict]:
    """history.jsonl without the wall-clock column (the only thing a resume may change)."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def assert_same_run(run: Path, reference: Path) -> None:
    """Final weights (live and SWA average), metrics and history equal bit for bit."""
    a = torch.load(run / "final.pt", weights_only=False)
    b = torch.load(reference / "final.pt", weights_only=False)
    for name, ref_state in [("model", b["model"]), *(("methods." + k, v) for k, v in b["methods"].items())]:
        state = a["model"] if name == "model" else a["methods"][name.split(".", 1)[1]]
        assert state.keys() == ref_state.keys()
        unequal = [k for k in ref_state if not torch.equal(state[k], ref_state[k])]
        assert not unequal, f"{name} differs from the uninterrupted run in {unequal[:5]}"
    assert json.loads((run / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())
    assert history(run) == history(reference)
    assert json.loads((run / "status.json").read_text())["status"] == "complete"


@pytest.fixture(scope="module", autouse=True)
def same_threads_as_the_children():
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_planned_fault(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, same_threads_as_the_children) -> Path:
    """The uninterrupted run every interrupted one must end equal to."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(make_cfg(), run_dir=run_dir)
    return run_dir


# -- 1. kill anywhere, resume exactly ---------------------------------------------------------------
def test_sigkill_mid_epoch_then_resume_ends_equal_to_uninterrupted_run(tmp_path, reference):
    run = tmp_path / "run"
    killed = run_cli(run, fault="train_step:6")  # step 2 of epoch 2
    assert killed.returncode == -signal.SIGKILL
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch0001.pt"]
    assert len(history(run)) == 1
    train(make_cfg(), run_dir=run)  # what re-launching the same command does, in-process
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.parametrize("fault, newest_before_resume", [
    ("train_step:6", "epoch0001.pt"),        # mid-epoch 2
    ("swa_average:1", "epoch0001.pt"),       # while SWA folds the epoch-2 model into its average
    ("bn_update:2", "epoch0004.pt"),         # during the final BN re-estimation of the average
    ("checkpoint_write:3", "epoch0002.pt"),  # epoch-3 checkpoint written to its temp file, not yet renamed
])
def test_sigkill_at_each_point_then_same_command_resumes_exactly(tmp_path, reference, fault, newest_before_resume):
    run = tmp_path / "run"
    killed = run_cli(run, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert load_latest(run / "checkpoints")["path"].endswith(newest_before_resume)
    resumed = run_cli(run)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming {run} from {run / 'checkpoints' / newest_before_resume}" in resumed.stdout
    assert not list((run / "checkpoints").glob("*.tmp")), "a temp file of the killed write was left behind"
    assert_same_run(run, reference)


def test_a_kill_right_after_the_final_record_leaves_a_finished_run_that_reports_and_skips(tmp_path, reference):
    from swalab.results.report import report

    run = tmp_path / "out" / "run"
    killed = run_cli(run, fault="final_record:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert json.loads((run / "status.json").read_text())["status"] == "running"  # the kill came before this rename
    again = run_cli(run)
    assert again.returncode == 0 and "already holds a finished run" in again.stdout
    assert json.loads((run / "status.json").read_text())["status"] == "complete"  # the file no longer says running
    found = report([tmp_path / "out"], tmp_path / "report")
    assert [r.path for r in found["finished"]] == [run]  # not left out as 'running' for good
    assert json.loads((run / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())


def test_sigterm_during_the_final_bn_update_ends_in_one_line_and_status_says_so(tmp_path, reference):
    """SIGTERM outside the training steps (the average's final BN re-estimation) is said as Ctrl-C there is: one
    line, exit 143, status.json naming SIGTERM, the lock released; the same command then finishes the run."""
    run = tmp_path / "run"
    stopped = run_cli(run, fault="bn_update:2:TERM")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "[swalab] stopped by SIGTERM: nothing of the run is lost; re-run the same command to continue" \
        in stopped.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and status["message"].startswith("SIGTERM received outside"), status
    again = run_cli(run)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "took over the lock" not in again.stdout
    assert_same_run(run, reference)


def test_a_run_killed_mid_training_reads_stopped_not_running_and_says_how_to_continue(tmp_path, reference):
    """status.json says running until the process writes otherwise; a kill -9 never does. The run's lock names the
    dead process, so a report, compare and init_from say the run stopped and that its command continues it."""
    from swalab.results.report import report
    from swalab.results.runs import Run
    from swalab.runweights import unfinished

    run = tmp_path / "out" / "run"
    killed = run_cli(run, fault="train_step:6")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert json.loads((run / "status.json").read_text())["status"] == "running"
    assert Run(run).status == "stopped"
    assert "re-run its command to continue" in Run(run).error
    found = report([tmp_path / "out"], tmp_path / "report")
    assert any(n.startswith(f"stopped: {run}: ") for n in found["notes"]), found["notes"]
    assert "re-run its own command" in unfinished(run) and "wait for it" not in unfinished(run)
    (run / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": 0}))
    assert Run(run).status == "running" and "wait for it to finish" in unfinished(run)  # a live holder: it trains


@pytest.mark.parametrize("damage", [b"", b'{"swa": {"acc": 5'])
def test_a_damaged_metrics_file_is_named_and_the_same_command_scores_the_run_again(tmp_path, reference, damage):
    from swalab.results.runs import Run

    run = tmp_path / "run"
    train(make_cfg(), run_dir=run)
    (run / "metrics.json").write_bytes(damage)
    assert Run(run).status == "damaged" and "metrics.json cannot be read" in Run(run).error
    again = run_cli(run)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "metrics.json cannot be read" in again.stdout + again.stderr
    assert f"resuming {run} from {run / 'checkpoints' / 'epoch0004.pt'}" in again.stdout  # no epoch trained again
    assert_same_run(run, reference)


def test_truncated_newest_checkpoint_falls_back_to_previous_with_warning(tmp_path, reference):
    run = tmp_path / "run"
    train(make_cfg(), run_dir=run)
    (run / "metrics.json").unlink()  # pretend the run died after its last checkpoint
    newest = run / "checkpoints" / "epoch0004.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    with pytest.warns(RuntimeWarning, match=r"cannot read checkpoint .*epoch0004\.pt.*falling back"):
        train(make_cfg(), run_dir=run)
    assert_same_run(run, reference)  # epoch 4 was recomputed from epoch 3
    assert "warning: RuntimeWarning: cannot read checkpoint" in (run / "run.log").read_text()  # kept for nohup/SLURM


def test_every_checkpoint_corrupt_is_a_clear_error(tmp_path):
    for epoch in (1, 2):
        save_checkpoint({"epoch": epoch}, tmp_path, epoch)
        (tmp_path / f"epoch{epoch:04d}.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError, match="every one is corrupt"):
        load_latest(tmp_path)


def test_only_the_newest_two_checkpoints_are_kept(tmp_path):
    for epoch in range(1, 6):
        save_checkpoint({"epoch": epoch}, tmp_path, epoch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch0004.pt", "epoch0005.pt"]


# -- 2. preemption --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", ["TERM", pytest.param("USR1", marks=pytest.mark.slow), "USR2"])  # USR2: submitit's
def test_preemption_signal_checkpoints_mid_epoch_and_relaunch_ends_equal(tmp_path, reference, monkeypatch, sig):
    run = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, f"train_step:6:{sig}")  # arrives during step 2 of epoch 2
    with pytest.raises(Preempted, match=re.escape(PAUSED_AT_STEP_2_OF_EPOCH_2)) as info:
        train(make_cfg(), run_dir=run)
    assert info.value.signum == signal.Signals["SIG" + sig]
    assert json.loads((run / "status.json").read_text())["status"] == "preempted"
    assert load_latest(run / "checkpoints")["path"].endswith("epoch0001_step000002.pt")
    monkeypatch.delenv(faults.ENV)
    train(make_cfg(), run_dir=run)
    assert_same_run(run, reference)


def test_a_signal_in_the_last_step_of_the_run_pauses_it_and_the_relaunch_only_scores_it(tmp_path, reference,
                                                                                         monkeypatch):
    """A signal that arrives in the run's last step is not dropped: the run pauses at the end of that epoch, whose
    checkpoint is written, instead of going on into the final scoring (minutes for a big network) as if unasked."""
    run = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "train_step:16:TERM")  # during step 4 of epoch 4, the run's last
    with pytest.raises(Preempted, match=re.escape("checkpoint epoch0004.pt written (after epoch 4)")):
        train(make_cfg(), run_dir=run)
    assert json.loads((run / "status.json").read_text())["status"] == "preempted"
    assert not (run / "metrics.json").exists()
    monkeypatch.delenv(faults.ENV)
    train(make_cfg(), run_dir=run)
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["TERM", "USR1"])
def test_preempted_command_exits_75_and_the_same_command_continues(tmp_path, reference, sig):
    run = tmp_path / "run"
    preempted = run_cli(run, fault=f"train_step:9:{sig}")  # step 1 of epoch 3, during averaging
    assert preempted.returncode == PREEMPTED_EXIT_CODE, preempted.stderr[-2000:]
    assert "re-run the same command to continue" in preempted.stderr
    resumed = run_cli(run)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "epoch0002_step000001.pt" in resumed.stdout
    assert_same_run(run, reference)


def test_ctrl_c_is_a_pause_one_line_exit_130_and_the_same_command_continues_exactly(tmp_path, reference):
    run = tmp_path / "run"
    paused = run_cli(run, fault="train_step:6:INT")  # Ctrl-C during step 2 of epoch 2
    assert paused.returncode == 130, paused.stderr[-2000:]
    assert "Traceback" not in paused.stderr
    assert paused.stderr.strip().splitlines()[-1] == ("[swalab] Ctrl-C (SIGINT) received: " + PAUSED_AT_STEP_2_OF_EPOCH_2
                                                      + "; re-run the same command to continue")
    assert json.loads((run / "status.json").read_text())["status"] == "interrupted"
    resumed = run_cli(run)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "epoch0001_step000002.pt" in resumed.stdout
    assert "took over the lock" not in resumed.stdout  # the paused process handed its lock over in order
    assert_same_run(run, reference)


def test_a_pause_is_said_once_on_the_terminal_and_kept_in_run_log(tmp_path):
    run = tmp_path / "run"
    paused = run_cli(run, fault="train_step:6:INT")
    assert paused.returncode == 130, paused.stderr[-2000:]
    said = (paused.stdout + paused.stderr).count("Ctrl-C (SIGINT) received")
    assert said == 1, paused.stdout + paused.stderr
    assert "Ctrl-C (SIGINT) received" in paused.stderr.strip().splitlines()[-1]
    assert "Ctrl-C (SIGINT) received" in (run / "run.log").read_text()


def test_the_pause_and_the_resume_name_a_mid_epoch_checkpoint_by_its_file_and_the_same_epochs(tmp_path):
    run = tmp_path / "run"
    paused = run_cli(run, fault="train_step:6:INT")  # step 2 of epoch 2: one epoch done, two steps into the second
    [name] = [p.name for p in (run / "checkpoints").glob("*_step*.pt")]
    words = "after epoch 1 and 2 steps of epoch 2"
    assert name == "epoch0001_step000002.pt"
    assert f"checkpoint {name} written ({words})" in paused.stderr, paused.stderr
    resumed = run_cli(run, "trainer.epochs=4")
    resume_line = next(line for line in resumed.stdout.splitlines() if "resuming" in line)
    assert resume_line.endswith(f"{name} ({words})"), resume_line


def test_ctrl_c_before_the_first_step_is_said_once_on_the_terminal_and_kept_in_run_log(tmp_path):
    run = tmp_path / "run"
    paused = run_cli(run, fault="run_start:1:INT")
    assert paused.returncode == 130, paused.stderr[-2000:]
    said = (paused.stdout + paused.stderr).count("interrupted")
    assert said == 1, paused.stdout + paused.stderr
    assert "interrupted" in (run / "run.log").read_text()


def test_ctrl_c_before_the_first_step_reads_interrupted_and_the_same_command_trains_the_run(tmp_path, reference):
    run = tmp_path / "run"
    paused = run_cli(run, fault="run_start:1:INT")  # the run's first line is out, no step taken, no checkpoint
    assert paused.returncode == 130, paused.stderr[-2000:]
    assert "Traceback" not in paused.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and "re-run the same command" in status["message"]
    assert not (run / "checkpoints").exists()
    again = run_cli(run)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_same_run(run, reference)


def test_ctrl_c_in_a_grid_prints_its_summary_closes_its_records_and_exits_130(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, faults.ENV: "train_step:6:INT"}
    done = subprocess.run([PYTHON, "run.py", "-m", *TINY, "method=sgd,swa", f"paths.output_dir={tmp_path}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "grid summary: 0 of 1 jobs started before the grid stopped finished; 1 did not: interrupted" in done.stdout
    assert "re-run the same command to continue it" in done.stdout
    [grid] = (tmp_path / "grids").iterdir()
    [job] = [json.loads(p.read_text()) for p in (grid / "jobs").glob("*.json")]
    assert job["state"] == "interrupted" and job["run_dir"] is not None
    assert (grid / "summary.txt").read_text().startswith("[swalab] grid summary: 0 of 1")


@pytest.mark.slow
def test_a_launchers_own_signal_handler_runs_after_the_checkpoint(tmp_path):
    """Under submitit the SIGUSR1 handler (checkpoint() + requeue) must still run, but only once the
    checkpoint is on disk; here a stand-in handler records what it found."""
    run, seen = tmp_path / "run", tmp_path / "seen.json"
    launcher = textwrap.dedent(f"""
        import json, os, runpy, signal, sys
        def requeue(signum, frame):  # what submitit's checkpoint_and_try_requeue is to the job
            names = sorted(os.listdir({str(run / 'checkpoints')!r}))
            open({str(seen)!r}, "w").write(json.dumps({{"signal": signum, "checkpoints": names}}))
        signal.signal(signal.SIGUSR1, requeue)
        sys.argv = ["run.py", *sys.argv[1:]]
        runpy.run_path("run.py", run_name="__main__")
    """)
    done = run_cli(run, fault="train_step:6:USR1", python=[PYTHON, "-c", launcher])
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stderr[-2000:]
    record = json.loads(seen.read_text())
    assert record == {"signal": signal.SIGUSR1, "checkpoints": ["epoch0001.pt", "epoch0001_step000002.pt"]}


def test_submitits_requeue_handler_runs_after_the_checkpoint_and_the_run_reads_requeued(tmp_path):
    """submitit answers its time-limit signal (USR2 by default) by requeueing the job and calling
    ``sys.exit(-1)``. The trainer catches the signal itself, writes the mid-epoch checkpoint, records the run
    as ``requeued``, and only then hands the signal on; the exit is never recorded as a failure."""
    run, seen = tmp_path / "run", tmp_path / "seen.json"
    launcher = textwrap.dedent(f"""
        import json, os, runpy, signal, sys
        class SignalHandler:  # stands in for submitit.core.job_environment.SignalHandler
            def checkpoint_and_try_requeue(self, signum, frame):
                names = sorted(os.listdir({str(run / 'checkpoints')!r}))
                status = json.load(open({str(run / 'status.json')!r}))["status"]
                open({str(seen)!r}, "w").write(json.dumps({{"checkpoints": names, "status": status}}))
                sys.exit(-1)  # what submitit does once the job is requeued
        SignalHandler.__module__ = "submitit.core.job_environment"
        signal.signal(signal.SIGUSR2, SignalHandler().checkpoint_and_try_requeue)
        sys.argv = ["run.py", *sys.argv[1:]]
        runpy.run_path("run.py", run_name="__main__")
    """)
    done = run_cli(run, fault="train_step:6:USR2", python=[PYTHON, "-c", launcher])
    assert done.returncode == 255, done.stderr[-2000:]
    assert json.loads(seen.read_text()) == {"checkpoints": ["epoch0001.pt", "epoch0001_step000002.pt"],
                                            "status": "requeued"}
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "requeued" and "requeued and resumes" in status["message"]
    assert "requeued: SIGUSR2 received: " + PAUSED_AT_STEP_2_OF_EPOCH_2 in (run / "run.log").read_text()


# -- 3. bad config values, caught before anything is written -------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["schedule.lr=0"], "schedule.lr=0 must be > 0"),
    (["schedule.lr=-0.1"], "schedule.lr=-0.1 must be > 0"),
    (["model.swa.lr=-1"], "model.swa.lr=-1 must be > 0"),
    (["schedule.lr=fast"], "schedule.lr='fast' must be a finite number"),
    (["trainer.epochs=-1"], "trainer.epochs=-1 must be >= 0"),
    (["trainer.epochs=2.5"], "trainer.epochs=2.5 must be an integer"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["dataset.train_size=2.5"], "dataset.train_size=2.5 must be an integer or null"),
    (["model.swa.start_epoch=4"], "SWA would start averaging at epoch 4 (model.swa.start_epoch) but the run has "
                                  "trainer.epochs=4"),
    (["model.swa.start_epoch=9"], "set model.swa.start, a fraction of the budget"),
    (["trainer.batch_size=300"], "trainer.batch_size=300 is larger than the 256 training images"),
    (["trainer.batch_size=0"], "trainer.batch_size=0 must be >= 1"),
    (["trainer.nonfinite=ignore"], "trainer.nonfinite='ignore' must be 'stop' or 'skip'"),
    (["run.device=tpu"], "run.device='tpu' must be auto, cpu or cuda[:N]"),
    (["run.resume=sometimes"], "run.resume='sometimes' must be auto, true or false"),
    (["run.heartbeat_minutes=-1"], "run.heartbeat_minutes=-1 must be >= 0"),
])
def test_bad_values_are_refused_before_anything_is_written(tmp_path, overrides, message):
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        train(make_cfg(*overrides), run_dir=run)
    assert message in str(info.value)
    assert not run.exists()


@pytest.mark.parametrize("typed", ["model.budget_epochs=0", "method.budget=0"])
def test_a_run_of_no_epochs_made_by_the_budget_is_refused_naming_the_keys_that_make_trainer_epochs(tmp_path, typed):
    """``trainer.epochs`` is method.budget x model.budget_epochs unless set: a user who typed one of those and got 0
    epochs is told which keys make it, not only a key they never typed."""
    run = tmp_path / "run"
    untimed = [o for o in TINY if not o.startswith("trainer.epochs=")]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*untimed, typed])
    with pytest.raises(ConfigError) as info:
        train(cfg, run_dir=run)
    assert "trainer.epochs=0 trains nothing" in str(info.value)
    assert "method.budget x model.budget_epochs" in str(info.value)
    assert not run.exists()


def test_batch_larger_than_the_whole_training_set_fails_before_any_epoch(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"trainer.batch_size=5000 is larger than the 1437 training images"):
        train(make_cfg("dataset.train_size=null", "trainer.batch_size=5000"), run_dir=run)
    assert not run.exists()  # refused once the data were loaded: the directory it had created is gone


def test_a_batch_larger_than_every_training_image_is_not_told_to_raise_train_size(tmp_path):
    with pytest.raises(ConfigError) as info:
        train(make_cfg("dataset.train_size=null", "trainer.batch_size=5000"), run_dir=tmp_path / "run")
    assert "dataset.train_size" not in str(info.value)
    assert "lower trainer.batch_size" in str(info.value) and "every training image" in str(info.value)


def test_a_batch_larger_than_a_capped_training_set_is_told_to_lower_it_or_raise_train_size(tmp_path):
    with pytest.raises(ConfigError, match=r"lower it, or raise dataset.train_size=256"):
        train(make_cfg("trainer.batch_size=300"), run_dir=tmp_path / "run")


@pytest.mark.parametrize("override, exception, fragments", [
    ("trainer.foo=1", ConfigCompositionException, ["Could not override 'trainer.foo'", "+trainer.foo=1"]),
    ("model=resnet9", MissingConfigException, ["Could not find 'model/resnet9'", "Available options in 'model'",
                                               "preresnet20", "wrn28_10"]),
    ("dataset=svhn", MissingConfigException, ["Could not find 'dataset/svhn'", "cifar10", "digits"]),
    ("method=sam", MissingConfigException, ["Could not find 'method/sam'", "ema", "fge", "sgd", "swa"]),
    ("schedule=step", MissingConfigException, ["Could not find 'schedule/step'", "paper_sgd", "cosine"]),
    ("experiment=table9", MissingConfigException, ["Could not find 'experiment/table9'",
                                                   "Available options in 'experiment'"]),
])
def test_unknown_keys_and_names_are_refused_with_the_valid_options(override, exception, fragments):
    with pytest.raises(exception) as info:
        make_cfg(override)
    text = str(info.value) + str(info.value.__cause__ or "")
    for fragment in fragments:
        assert fragment in text


@pytest.mark.parametrize("override, named", [
    ("model.swa.strat=0.5", ["model.swa.strat=0.5", "model.swa has no key 'strat'", "model.swa.start"]),
    ("trainer.epcohs=3", ["trainer.epcohs=3", "trainer has no key 'epcohs'", "trainer.epochs"]),
])
def test_a_misspelt_key_on_the_command_line_is_refused_in_one_line_naming_it_and_the_key_meant(tmp_path, override,
                                                                                              named):
    """Hydra says a key it cannot override in seven lines, exit 1, and tells the user to append it with ``+``; run.py
    says it in one line, exit 2, with the key of that block the user most likely meant, and writes nothing."""
    done = run_cli(tmp_path / "run", override)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[swalab] "), done.stderr
    for fragment in named:
        assert fragment in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_run_py_prints_the_valid_options_for_an_unknown_model(tmp_path):
    done = run_cli(tmp_path / "run", "model=resnet9")
    assert done.returncode != 0
    assert "Could not find 'model/resnet9'" in done.stderr and "preresnet20" in done.stderr
    assert not (tmp_path / "run").exists()


# -- 4. bad data ------------------------------------------------------------------------------------
def image_folder(root: Path, classes: int = 10, train: int = 3, test: int = 1) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def folder_cfg(root: Path, *overrides: str):
    return make_cfg("dataset=cifar10", f"dataset.root={root}", "run.download=false", "dataset.train_size=null",
                    "trainer.batch_size=10", "trainer.epochs=2", "model.swa.start_epoch=1", *overrides)


def write_cifar_pickles(root: Path, labels: list[int]) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    data = np.zeros((len(labels), 3072), dtype=np.uint8)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return root


def assert_refused_leaving_nothing(run: Path) -> None:
    assert not run.exists(), f"a refused run left {sorted(p.name for p in run.iterdir())}"


@pytest.mark.parametrize("damage, exception, message", [
    (lambda r: __import__("shutil").rmtree(r / "test"), FileNotFoundError, r"no test/"),
    (lambda r: [p.unlink() for p in (r / "train" / "class3").iterdir()], ValueError,
     r"class folder .*train/class3 is empty"),
    (lambda r: (r / "train" / "class5" / "1.png").write_bytes(b"\x89PNG broken"), ValueError,
     r"cannot decode image .*train/class5/1\.png"),
    (lambda r: (r / "test" / "class2").rename(r / "test" / "other"), ValueError,
     r"different class folders: only in train/: \['class2'\]; only in test/: \['other'\]"),
])
def test_broken_image_folder_is_a_clear_error_naming_the_file(tmp_path, damage, exception, message):
    root = image_folder(tmp_path / "data")
    damage(root)
    run = tmp_path / "run"
    with pytest.raises(exception, match=message):  # the loader's own error, not wrapped
        train(folder_cfg(root), run_dir=run)
    assert_refused_leaving_nothing(run)


def test_labels_out_of_range_are_a_clear_error(tmp_path):
    root = write_cifar_pickles(tmp_path / "data", labels=[0, 3, 10, 9])
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"data_batch_1: labels range over \[0, 10\] but CIFAR-10 has classes 0..9"):
        train(folder_cfg(root, "trainer.batch_size=2"), run_dir=run)
    assert_refused_leaving_nothing(run)


def test_cache_written_by_another_version_is_rebuilt(tmp_path):
    root = image_folder(tmp_path / "data")
    cache = cache_path(root, "cifar10", "folder")
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format_version": CACHE_FORMAT_VERSION + 1, "train_images": "from the future"}, cache)
    with pytest.warns(UserWarning, match="format_version .* rebuilding it"):
        train(folder_cfg(root), run_dir=tmp_path / "run")
    assert torch.load(cache, weights_only=True)["format_version"] == CACHE_FORMAT_VERSION
    assert (tmp_path / "run" / "metrics.json").exists()


# -- 5. numerical faults --------------------------------------------------------------------------
@pytest.fixture
def poison_losses(monkeypatch):
    """``poison_losses({7, 9})``: the 7th and 9th training losses (counted over the run) become NaN."""
    def install(calls: set[int]):
        real, count = torch.nn.functional.cross_entropy, [0]

        def cross_entropy(*args, **kwargs):
            loss = real(*args, **kwargs)
            if not torch.is_grad_enabled():  # evaluation passes are not training steps
                return loss
            count[0] += 1
            return loss * float("nan") if count[0] in calls else loss
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)
    return install


def test_a_failure_once_training_started_is_told_from_a_refusal_by_its_type(tmp_path, poison_losses):
    """run.py exits 2 ("refused", nothing written) or 1 ("failed", status.json says why) by the type of what
    ``execute`` raises; the plan it runs is never changed on the way."""
    from swalab.runlock import RunLock, RunLocked
    from swalab.train import TrainingFailed, execute, prepare

    locked = tmp_path / "locked"
    holder = RunLock(locked).acquire()  # as if another process trained it
    try:
        with pytest.raises(RunLocked):  # refused before anything was written: raised as it is
            execute(prepare(make_cfg(), run_dir=locked))
    finally:
        holder.release()
    assert sorted(p.name for p in locked.iterdir()) == [".lock"]

    plan = prepare(make_cfg("trainer.nonfinite=stop"), run_dir=tmp_path / "run")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.finished = {}
    poison_losses({7})
    with pytest.raises(TrainingFailed) as failed:
        execute(plan)
    assert isinstance(failed.value.__cause__, NonFiniteLossError)
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"
    assert plan.finished is None and plan.run_dir == tmp_path / "run"


def test_a_run_finished_by_another_process_after_the_plan_is_found_finished_not_trained(tmp_path):
    """Two grids over one config: the second planned the run before the first finished it. It takes the lock, finds
    the run finished and trains nothing; what it returns says so (a grid records the job as skipped)."""
    import shutil

    from swalab.train import execute, prepare
    from swalab.train.execute import FoundFinished

    cfg = make_cfg("method=sgd", "trainer.epochs=1")
    trained = execute(prepare(cfg, run_dir=tmp_path / "a"))
    assert not isinstance(trained, FoundFinished)
    plan = prepare(cfg, run_dir=tmp_path / "b")  # planned while nothing is there
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns(".lock"))  # finished meanwhile
    written = (tmp_path / "b" / "metrics.json").stat().st_mtime_ns
    found = execute(plan)
    assert isinstance(found, FoundFinished) and found == trained
    assert (tmp_path / "b" / "metrics.json").stat().st_mtime_ns == written
    assert isinstance(execute(prepare(cfg, run_dir=tmp_path / "a")), FoundFinished)  # planned as finished


def test_nan_loss_stops_naming_epoch_and_step_and_keeps_the_good_checkpoint(tmp_path, reference, poison_losses,
                                                                             monkeypatch):
    run = tmp_path / "run"
    poison_losses({7})  # epoch 2, step 3
    with pytest.raises(NonFiniteLossError, match=r"NaN/Inf at epoch 2, step 3"):
        train(make_cfg("trainer.nonfinite=stop"), run_dir=run)
    assert len(history(run)) == 1
    kept = load_latest(run / "checkpoints")
    assert kept["path"].endswith("epoch0001.pt")
    assert all(torch.isfinite(t).all() for t in kept["model"].values() if t.is_floating_point())
    assert json.loads((run / "status.json").read_text())["status"] == "failed"
    monkeypatch.undo()  # the cause is gone: re-launching continues from the good checkpoint
    train(make_cfg("trainer.nonfinite=stop"), run_dir=run)
    assert_same_run(run, reference)


def test_nonfinite_skip_drops_bad_steps_up_to_max_skips(tmp_path, poison_losses):
    poison_losses({5, 10})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(make_cfg("trainer.nonfinite=skip", "trainer.max_skips=2"), run_dir=tmp_path / "run")
    skipped = [str(w.message) for w in caught if "step skipped" in str(w.message)]
    assert skipped == ["non-finite loss at epoch 2, step 1: step skipped",
                       "non-finite loss at epoch 3, step 2: step skipped"]
    assert all(np.isfinite(m["nll"]) for m in json.loads((tmp_path / "run" / "metrics.json").read_text()).values())


def test_nonfinite_skip_stops_after_max_skips(tmp_path, poison_losses):
    poison_losses({2, 3, 4})
    with pytest.warns(RuntimeWarning, match="step skipped"), \
            pytest.raises(NonFiniteLossError, match=r"epoch 1, step 4, after 2 skipped steps \(trainer.max_skips=2\)"):
        train(make_cfg("trainer.nonfinite=skip", "trainer.max_skips=2"), run_dir=tmp_path / "run")


# -- 6. services ----------------------------------------------------------------------------------
class FakeWandb:
    """Stands in for the ``wandb`` module: ``init`` fails, or ``log`` fails from its ``fail_at``-th call."""

    class Settings:
        def __init__(self, **kwargs):
            pass

    def __init__(self, init_error: Exception | None = None, fail_at: int | None = None):
        self.init_error, self.fail_at, self.logged = init_error, fail_at, []

    def init(self, **kwargs):
        if self.init_error is not None:
            raise self.init_error
        fake = self

        class Run:
            summary: dict = {}

            def log(self, row, step=None):
                if fake.fail_at is not None and len(fake.logged) + 1 >= fake.fail_at:
                    raise ConnectionError("wandb.ai unreachable")
                fake.logged.append(row)

            def define_metric(self, name, **kwargs):
                pass

            def finish(self, exit_code=0):
                pass
        return Run()


@pytest.mark.parametrize("fake, logged", [
    (FakeWandb(init_error=ConnectionError("cannot reach api.wandb.ai")), 0),  # unreachable from the start
    (FakeWandb(fail_at=3), 2),                                                # fails mid-run
])
def test_wandb_failure_never_stops_training_and_warns_once(tmp_path, reference, monkeypatch, fake, logged):
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(make_cfg("logger=wandb"), run_dir=run)
    about_wandb = [str(w.message) for w in caught if "W&B" in str(w.message)]
    assert len(about_wandb) == 1 and "not sent to W&B" in about_wandb[0]
    assert "ConnectionError" in about_wandb[0]
    assert len(fake.logged) == logged
    assert history(run) == history(reference)
    assert json.loads((run / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())


def test_two_processes_writing_one_data_cache_never_corrupt_it(tmp_path):
    """Two jobs decode the same data set at once: each rewrites the cache 15 times and reads it back
    after every write; every read must be a whole, valid cache written by one of them."""
    path = tmp_path / ".swalab_cache" / "cifar10-folder-v1.pt"
    job = textwrap.dedent(f"""
        import sys, torch
        from swalab.data.cache import load_cache, save_cache
        me, source = int(sys.argv[1]), {{"fingerprint": "same files"}}
        path = __import__("pathlib").Path({str(path)!r})
        for _ in range(15):
            images = torch.full((2000, 3, 32, 32), me, dtype=torch.uint8)  # 6 MB: writes take a while
            assert save_cache(path, {{"source": source, "train_images": images, "train_labels": torch.zeros(2000),
                                     "test_images": images[:10], "test_labels": torch.zeros(10), "classes": []}})
            got = load_cache(path, source)
            assert got is not None, "cache unreadable"
            value = int(got["train_images"][0, 0, 0, 0])
            assert value in (1, 2) and bool((got["train_images"] == value).all()), "torn cache"
        print("ok")
    """)
    jobs = [subprocess.Popen([PYTHON, "-W", "error", "-c", job, str(me)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for me in (1, 2)]
    results = [j.communicate(timeout=300) for j in jobs]
    for j, (out, err) in zip(jobs, results):
        assert j.returncode == 0 and out.strip() == "ok", err[-2000:]
    assert load_cache(path, {"fingerprint": "same files"}) is not None
    assert not list(path.parent.glob("*.tmp"))


# -- 7. disk --------------------------------------------------------------------------------------
def test_unwritable_output_directory_is_a_clear_error_at_start(tmp_path, monkeypatch):
    blocker = tmp_path / "outputs"
    blocker.write_text("a file where the output directory should be")
    loaded = []
    monkeypatch.setattr("swalab.data.load_digits", lambda *a, **k: loaded.append(1))
    run = blocker / "digits" / "run"
    with pytest.raises(PermissionError) as info:
        train(make_cfg(), run_dir=run)
    message = str(info.value)
    assert str(run) in message and "paths.output_dir=" in message and "run.dir=" in message
    assert not loaded, "data were loaded before the output directory was checked"


def test_full_disk_at_checkpoint_time_keeps_the_previous_checkpoint(tmp_path, reference, monkeypatch):
    real_save, calls = torch.save, [0]

    def save_until_disk_full(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:  # the epoch-3 checkpoint: half written, then the disk is full
            f.write(b"PK\x03\x04" + b"\0" * 4096)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save_until_disk_full)
    run = tmp_path / "run"
    with pytest.raises(OSError, match=r"cannot write .*epoch0003\.pt \(No space left on device\); nothing was "
                                      r"replaced, so the earlier files in .* are intact") as info:
        train(make_cfg(), run_dir=run)
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch0001.pt", "epoch0002.pt"]
    assert load_latest(run / "checkpoints")["epoch"] == 2
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["error"].startswith("OSError: cannot write")
    assert "\n" not in status["error"]  # one line, naming the file and the cause
    monkeypatch.undo()  # space freed: the same command continues from epoch 2
    train(make_cfg(), run_dir=run)
    assert_same_run(run, reference)


def test_a_grid_summary_the_disk_cannot_hold_leaves_the_earlier_summary_whole(tmp_path, monkeypatch):
    import io

    from swalab.grid import close_grid, record_job

    grid = tmp_path / "grid"
    record_job(grid, 0, ["method=sgd"], tmp_path / "runs" / "sgd", "complete")
    close_grid(grid)
    before = (grid / "summary.txt").read_text()
    record_job(grid, 1, ["method=swa"], tmp_path / "runs" / "swa", "failed", "RuntimeError: boom")
    real_open = io.open

    def disk_full_after_a_few_bytes(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode:
            f.write(b"[swa" if "b" in mode else "[swa")
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return f
    monkeypatch.setattr(io, "open", disk_full_after_a_few_bytes)
    close_grid(grid)  # prints the summary; writing it fails
    monkeypatch.undo()
    assert (grid / "summary.txt").read_text() == before
    assert sorted(p.name for p in grid.iterdir()) == ["jobs", "summary.txt"]  # no temp file left


# -- a resume restores every random number generator -----------------------------------------------
RANDOM_MODELS = {  # networks that draw from torch's global RNG in every training step
    "shake-shake": ["model=shakeshake26_2x64d", "model.arch.depth=8", "model.arch.base_width=4"],
    "dropout": ["model=wrn28_10", "model.arch.depth=10", "model.arch.widen_factor=1", "model.arch.dropout=0.3"],
}


@pytest.mark.parametrize("model", list(RANDOM_MODELS))
def test_a_run_whose_model_draws_random_numbers_resumes_bit_equal(tmp_path, monkeypatch, model):
    """Shake-Shake's branch weights and dropout masks come from the global RNG after the restore, and the random
    crops and flips from the loader's (seed, epoch) stream: a resume must restore the RNG state to end equal."""
    overrides = ["dataset=digits", "method=sgd", "trainer.epochs=3", "run.channels_last=false", *RANDOM_MODELS[model]]
    straight, paused = tmp_path / "straight", tmp_path / "paused"
    train(make_cfg(*overrides), run_dir=straight)
    monkeypatch.setenv(faults.ENV, "train_step:6:TERM")  # a checkpoint at step 2 of epoch 2
    faults.reset()
    with pytest.raises(Preempted):
        train(make_cfg(*overrides), run_dir=paused)
    monkeypatch.delenv(faults.ENV)
    torch.manual_seed(12345)  # whatever the RNG holds when the run is launched again
    train(make_cfg(*overrides), run_dir=paused)
    assert_same_run(paused, straight)


def test_a_run_and_checkpoints_of_the_earlier_layout_are_refused_then_upgraded_and_resume_to_the_same_end(
        tmp_path, reference):
    """A run interrupted under an earlier swalab (SWA's settings in method.* with its own spellings, init_from in run,
    the scored budget marks inside the method state as probabilities, no prediction files) is refused in one line
    naming the upgrade; once upgraded (``python -m swalab.upgrade <run> --write``) it resumes and ends equal to
    today's run."""
    from swalab.checkpoint import checkpoint_paths
    from swalab.compat import RENAMED

    run = tmp_path / "run"
    killed = run_cli(run, fault="train_step:13")  # after epoch 3's checkpoint
    assert killed.returncode == -signal.SIGKILL

    def earlier(identity: dict) -> dict:
        spelled = {"model.init_from": "run.init_from"} | {new: o for o, new in RENAMED.items() if o.startswith("method.swa_")}
        return {spelled.get(k, k): v for k, v in identity.items()}

    record = json.loads((run / "identity.json").read_text())
    (run / "identity.json").write_text(json.dumps({"hash": record["hash"], "group": record["group"],
                                                   "identity": earlier(record["identity"])}))
    for path in checkpoint_paths(run / "checkpoints"):
        state = torch.load(path, weights_only=False)
        state["identity"] = earlier(state["identity"])
        names = state["method"].pop("budget_files")
        state["method"]["budget_probs"] = {k: torch.load(path.parent / "predictions" / f"{k}.pt").exp() for k in names}
        torch.save(state, path)
    shutil.rmtree(run / "checkpoints" / "predictions", ignore_errors=True)
    refused = run_cli(run)
    assert refused.returncode != 0 and f"python -m swalab.upgrade {run} --write" in refused.stderr
    upgraded = subprocess.run([PYTHON, "-m", "swalab.upgrade", str(run), "--write"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert upgraded.returncode == 0 and "upgraded 1 of 1 run(s)" in upgraded.stdout, upgraded.stderr[-2000:]
    resumed = run_cli(run)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout
    assert_same_run(run, reference)


def test_a_run_records_the_thread_count_of_each_start_and_resume(tmp_path):
    """A CPU run is reproduced bit for bit only at the same thread count: each start says which it used."""
    run, threads = tmp_path / "run", torch.get_num_threads()
    train(make_cfg(), run_dir=run)
    (run / "metrics.json").unlink()  # as if interrupted after its last epoch: the same command scores it again
    torch.set_num_threads(threads + 1)
    try:
        train(make_cfg(), run_dir=run)
    finally:
        torch.set_num_threads(threads)
    entries = json.loads((run / "environment.json").read_text())
    assert [e["threads"] for e in entries] == [threads, threads + 1]
    assert entries[0]["torch"] == torch.__version__ and entries[0]["device"] == "cpu" and "commit" in entries[0]


# -- what a finished run keeps (docs/reliability.md, "What a run directory holds") ------------------------------------
AT_DEFAULTS = "run.keep_finished_checkpoints=false"


def test_a_finished_run_keeps_final_pt_and_its_branch_points_but_not_its_resume_checkpoints(tmp_path, reference):
    """Once metrics.json is written, the rolling checkpoints (and the predictions only they name) go: final.pt holds
    the finished weights. The epochs of run.save_at stay, and a branch and an init_from still start from the run."""
    run = tmp_path / "run"
    train(make_cfg(AT_DEFAULTS, "run.save_at=[2]"), run_dir=run)
    assert sorted(p.relative_to(run).as_posix() for p in (run / "checkpoints").rglob("*")) == [
        "checkpoints/saved", "checkpoints/saved/epoch0002.pt"]
    assert_same_run(run, reference)  # the same weights, metrics and history as a run that keeps them
    assert CheckpointStore(run).find(2) == run / "checkpoints" / "saved" / "epoch0002.pt"  # a branch point
    weights, lineage = load_init_weights(str(run))  # model.init_from=<run dir>: its final.pt
    assert lineage["checkpoint"] == str(run / "final.pt") and lineage["epoch"] == 4
    final = torch.load(run / "final.pt", weights_only=False)["model"]
    assert all(torch.equal(weights[k], v) for k, v in final.items())


def test_a_kill_before_the_resume_checkpoints_go_leaves_them_to_the_next_launch_which_skips_and_removes_them(tmp_path):
    run = tmp_path / "out" / "run"
    killed = run_cli(run, AT_DEFAULTS, fault="final_record:1")  # metrics.json written, nothing removed yet
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run / "metrics.json").exists() and checkpoint_paths(run / "checkpoints")
    again = run_cli(run, AT_DEFAULTS)
    assert again.returncode == 0 and "already holds a finished run" in again.stdout
    assert not checkpoint_paths(run / "checkpoints") and (run / "final.pt").exists()
    assert json.loads((run / "status.json").read_text())["status"] == "complete"


def test_the_report_tells_a_damaged_run_that_kept_no_checkpoint_that_its_command_trains_it_again(tmp_path):
    """The report names what re-running does: scoring from the last checkpoint where there is one, else training the
    run again from the start (at the default a finished run keeps no resume checkpoint)."""
    from swalab.results.runs import Run

    run = tmp_path / "run"
    train(make_cfg(AT_DEFAULTS), run_dir=run)
    (run / "metrics.json").write_bytes(b"")
    error = Run(run).error
    assert "metrics.json cannot be read" in error and "trains it again from the start" in error
    assert "from its last checkpoint" not in error


def test_a_damaged_metrics_file_of_a_run_that_kept_no_checkpoint_says_it_trains_again_and_does(tmp_path, reference):
    run = tmp_path / "run"
    train(make_cfg(AT_DEFAULTS), run_dir=run)
    (run / "metrics.json").write_bytes(b"")
    again = run_cli(run, AT_DEFAULTS)
    assert again.returncode == 0, again.stderr[-2000:]
    said = (again.stdout + again.stderr).count("its resume checkpoints were deleted when it finished "
                                               "(run.keep_finished_checkpoints=false), so it trains again from the start")
    assert said == 1, again.stdout + again.stderr  # once: not again when the run is looked at under its lock
    assert_same_run(run, reference)


def test_ctrl_c_while_run_py_still_imports_is_one_line_exit_130_and_writes_nothing(tmp_path):
    """On a busy machine the imports before a run starts take seconds: Ctrl-C there says so in one line, not in an
    import's traceback. The signal is sent once hydra has been imported (``-X importtime`` says when), while torch
    and swalab still load."""
    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}}
    child = subprocess.Popen([PYTHON, "-X", "importtime", "run.py", *TINY, f"paths.output_dir={tmp_path / 'out'}"],
                             cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in child.stderr:
        if line.rstrip().endswith("| hydra"):
            child.send_signal(signal.SIGINT)
            break
    rest = child.stderr.read()
    assert child.wait(timeout=120) == 130
    said = [line for line in rest.splitlines() if not line.startswith("import time:")]
    assert said == ["[swalab] interrupted (Ctrl-C) while starting: nothing was written"], said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["run.py"], ["-m", "swalab.posthoc", "RUN", "--lawa", "2"],
                                     ["-m", "swalab.results.score", "RUN", "--ood", "noise:gaussian"],
                                     ["-m", "swalab.results.report", "RUN", "--out", "report"],
                                     ["-m", "swalab.analysis", "curves", "RUN", "--out", "curves.png"]],
                         ids=lambda command: command[0] if command[0] == "run.py" else command[1])
def test_ctrl_c_while_a_command_still_imports_is_one_line_exit_130_and_writes_nothing(tmp_path, command):
    """Ctrl-C while ``import swalab`` runs (``swalab.faults``' ``starting``: the imports of ``run.py`` and of every
    ``python -m swalab.<tool>``, seconds on a busy machine): one line, exit 130, no import's traceback."""
    run = tmp_path / "run"
    run.mkdir()
    args = ([*command, *TINY, f"paths.output_dir={tmp_path / 'out'}"] if command == ["run.py"] else
            [str(run) if arg == "RUN" else arg for arg in command])
    env = {**os.environ, faults.ENV: "starting:1:INT"}
    done = subprocess.run([PYTHON, *args], cwd=tmp_path if command[0] == "-m" else REPO, env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["[swalab] interrupted (Ctrl-C) while starting: nothing was written"], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and list(run.iterdir()) == []


def test_a_program_of_ones_own_run_with_dash_m_that_imports_swalab_keeps_its_own_ctrl_c(tmp_path):
    """The one-line Ctrl-C of a tool that is still importing is installed for ``python -m swalab.<tool>`` alone: a
    researcher's package started with ``python -m`` that imports swalab keeps Python's KeyboardInterrupt (its own
    cleanup runs)."""
    package = tmp_path / "theirs"
    package.mkdir()
    (package / "__init__.py").write_text("import swalab\n")
    (package / "main.py").write_text("import signal\nprint(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(tmp_path)])}
    done = subprocess.run([PYTHON, "-m", "theirs.main"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
