"""What a killed run or report leaves behind is cleaned by the next one, and a run says what is true of itself
(issue 44): temp files of a killed write, a report's work folder, what a NaN loss keeps, a typo in
run.avg_device, fp16 on a CPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.config import ConfigError
from swalab.train import train, validate

REPO = Path(__file__).resolve().parents[1]
TINY = ["logger=none", "run.progress=false", "dataset.train_size=128", "trainer.batch_size=64", "model.arch.depth=8",
        "trainer.epochs=1", "run.eval_every=0"]


def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


def test_a_run_removes_the_temp_files_a_killed_run_left_and_keeps_what_is_not_its_own(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    left = [run_dir / "status.json.k3x_9q2a.tmp", run_dir / "metrics.json.a1b2c3d4.tmp",
            run_dir / "final.pt.zz00zz00.tmp"]
    for path in left:
        path.write_text("cut short by a kill -9")
    theirs = [run_dir / "notes.tmp", run_dir / "mine.txt"]
    for path in theirs:
        path.write_text("a user's")
    train(make_cfg("method=sgd"), run_dir=run_dir)
    assert not any(path.exists() for path in left)
    assert all(path.exists() for path in theirs)
    assert not list(run_dir.glob("*.tmp")) or [p.name for p in run_dir.glob("*.tmp")] == ["notes.tmp"]


def test_a_report_stopped_by_sigterm_removes_its_work_folder(tmp_path):
    out = tmp_path / "rep_live"
    runs = tmp_path / "runs"
    train(make_cfg("method=sgd"), run_dir=runs / "sgd")
    script = textwrap.dedent(f"""
        import os, signal
        import swalab.results.report as report
        def stopped(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
        report.write_csv = stopped
        report.main([{str(runs)!r}, "--out", {str(out)!r}])
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep_live", "runs"]  # no .rep_live.<pid>.<random>


@pytest.fixture
def nan_at_the_first_step(monkeypatch):
    """The run's first training loss is NaN."""
    real = torch.nn.functional.cross_entropy

    def cross_entropy(*args, **kwargs):
        loss = real(*args, **kwargs)
        return loss * float("nan") if torch.is_grad_enabled() else loss
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)


@pytest.mark.parametrize("nonfinite", ["stop", "skip"])
def test_a_nan_loss_in_the_first_epoch_says_no_checkpoint_is_kept_rather_than_a_last_good_one(
        tmp_path, nan_at_the_first_step, nonfinite):
    from swalab.step import NonFiniteLossError

    with pytest.raises(NonFiniteLossError) as stopped:
        train(make_cfg("method=sgd", f"trainer.nonfinite={nonfinite}", "trainer.max_skips=0"), run_dir=tmp_path)
    assert not list((tmp_path / "checkpoints").glob("epoch*.pt"))
    assert "last good checkpoint" not in str(stopped.value)
    assert "no checkpoint" in str(stopped.value)


@pytest.mark.parametrize("method", ["sgd", "swa", "fge", "ema", "swag"])
def test_a_typo_in_run_avg_device_is_refused_for_every_method(method):
    with pytest.raises(ConfigError, match=r"run\.avg_device='gpu' must be 'train'"):
        validate(make_cfg(f"method={method}", "run.avg_device=gpu"))


def test_fp16_on_a_cpu_says_once_in_run_log_that_it_trains_slower_than_fp32(tmp_path):
    train(make_cfg("method=sgd", "trainer.precision=fp16", "run.device=cpu"), run_dir=tmp_path / "fp16")
    log = (tmp_path / "fp16" / "run.log").read_text()
    assert log.count("trainer.precision=fp16 on the CPU") == 1
    train(make_cfg("method=sgd", "trainer.precision=fp32", "run.device=cpu"), run_dir=tmp_path / "fp32")
    assert "trainer.precision" not in (tmp_path / "fp32" / "run.log").read_text()
