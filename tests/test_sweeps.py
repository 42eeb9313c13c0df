"""Grids (``python run.py -m``): one directory per job, re-launching skips finished jobs, a failing job
is recorded as failed and the grid goes on.

Each test launches ``run.py -m`` in a subprocess, exactly as a user would, on tiny digits runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from swalab.grid import read_jobs

TINY = ["logger=none", "run.progress=false", "dataset=digits", "dataset.train_size=128",
        "trainer.batch_size=64", "trainer.epochs=1", "run.eval_every=0", "run.eval_batch_size=512"]


def multirun(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "run.py", "-m", *TINY, f"paths.output_dir={tmp_path / 'outputs'}",
           f"hydra.sweep.dir={tmp_path / 'grid'}", *overrides]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_grid_jobs_get_their_own_directories_and_a_relaunch_skips_them(tmp_path):
    first = multirun(tmp_path, "method=sgd", "seed=0,1")
    assert first.returncode == 0, first.stderr[-3000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").rglob("metrics.json"))
    assert [r.relative_to(tmp_path / "outputs").as_posix() for r in runs] == [
        "digits/preresnet20/sgd/dataset.train_size-128+trainer.batch_size-64+trainer.epochs-1/seed0",
        "digits/preresnet20/sgd/dataset.train_size-128+trainer.batch_size-64+trainer.epochs-1/seed1"]  # run.*: no result
    for run in runs:
        assert json.loads((run / "status.json").read_text())["status"] == "complete"
        assert (run / "config.yaml").exists() and (run / "history.jsonl").exists()
        assert "sgd" in json.loads((run / "reliability.json").read_text())
    assert [job["state"] for job in read_jobs(tmp_path / "grid")] == ["complete", "complete"]
    mtimes = {r: (r / "metrics.json").stat().st_mtime_ns for r in runs}

    second = multirun(tmp_path, "method=sgd", "seed=0,1", "run.keep_checkpoints=5")  # how it runs: the same runs
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("already holds a finished run") == 2
    assert {r: (r / "metrics.json").stat().st_mtime_ns for r in runs} == mtimes
    assert [job["state"] for job in read_jobs(tmp_path / "grid")] == ["skipped", "skipped"]


@pytest.mark.slow
def test_a_job_that_fails_at_run_time_is_recorded_and_the_grid_goes_on(tmp_path):
    """A learning rate of 1e30 makes the loss non-finite in the first epoch: that job fails after it
    started (its run directory records why), the other one trains, and the grid exits 1."""
    result = multirun(tmp_path, "method=sgd", "seed=0", "model.lr=0.05,1e30")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "job failed, the grid goes on: NonFiniteLossError" in result.stderr
    assert "grid summary: 1 of 2 jobs finished; 1 did not: failed" in result.stdout
    jobs = read_jobs(tmp_path / "grid")
    assert [job["state"] for job in jobs] == ["complete", "failed"]
    failed = json.loads((Path(jobs[1]["run_dir"]) / "status.json").read_text())
    assert failed["status"] == "failed" and "NaN/Inf" in failed["error"]


def test_the_grid_summary_keeps_its_run_directories_in_one_column_whatever_the_state():
    from swalab.grid import summary_lines

    lines = summary_lines([{"job": 0, "state": "complete", "run_dir": "out/a", "error": None},
                           {"job": 1, "state": "interrupted", "run_dir": "out/b", "error": "Ctrl-C (SIGINT) received"}])
    assert len({line.index("out/") for line in lines[1:]}) == 1, lines


def test_a_grid_job_refused_for_its_data_says_what_a_single_run_says_with_the_resolved_path(tmp_path):
    missing = tmp_path / "no-cifar"
    data = ["method=sgd", "dataset=cifar10", f"dataset.root={missing}", "run.download=false"]
    single = subprocess.run([sys.executable, "run.py", *TINY, *data, f"paths.output_dir={tmp_path / 'single'}"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert single.returncode == 2, single.stderr[-3000:]
    said = single.stderr.strip().removeprefix("[swalab] ")
    assert f"(resolved: {missing})" in said
    grid = multirun(tmp_path, *data)
    assert grid.returncode == 1, grid.stderr[-3000:]
    assert said in grid.stderr
