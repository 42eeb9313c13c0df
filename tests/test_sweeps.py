"""Grids (``python run.py -m``): one directory per job, re-launching skips finished jobs, a failing job
is recorded as failed and the grid goes on.

Each test launches ``run.py -m`` in a subprocess, exactly as a user would, on tiny digits runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

TINY = ["logger=none", "trainer.progress=false", "dataset=digits", "dataset.train_size=128",
        "trainer.batch_size=64", "trainer.epochs=1", "trainer.eval_every=0", "trainer.eval_batch_size=512"]


def multirun(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "run.py", "-m", *TINY, f"paths.output_dir={tmp_path / 'outputs'}",
           f"hydra.sweep.dir={tmp_path / 'grid'}", *overrides]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_grid_jobs_get_their_own_directories_and_a_relaunch_skips_them(tmp_path):
    first = multirun(tmp_path, "method=sgd", "seed=0,1")
    assert first.returncode == 0, first.stderr[-3000:]
    runs = sorted(p.parent for p in (tmp_path / "grid").rglob("metrics.json"))
    assert [r.relative_to(tmp_path / "grid").as_posix() for r in runs] == [
        "digits/preresnet20/sgd/dataset.train_size=128,trainer.batch_size=64,trainer.epochs=1,"
        "trainer.eval_every=0/seed0",
        "digits/preresnet20/sgd/dataset.train_size=128,trainer.batch_size=64,trainer.epochs=1,"
        "trainer.eval_every=0/seed1"]
    for run in runs:
        assert json.loads((run / "status.json").read_text())["status"] == "complete"
        assert (run / "config.yaml").exists() and (run / "history.jsonl").exists()
        assert "sgd" in json.loads((run / "reliability.json").read_text())
    mtimes = {r: (r / "metrics.json").stat().st_mtime_ns for r in runs}

    second = multirun(tmp_path, "method=sgd", "seed=0,1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("already holds a finished run") == 2
    assert {r: (r / "metrics.json").stat().st_mtime_ns for r in runs} == mtimes


@pytest.mark.slow
def test_a_job_that_fails_at_run_time_is_recorded_and_the_grid_goes_on(tmp_path):
    missing = tmp_path / "no_such_weights.pt"
    result = multirun(tmp_path, "method=sgd", "seed=0", f"run.init_from=null,{missing}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "job failed, the grid goes on: FileNotFoundError" in result.stderr
    statuses = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "grid").rglob("status.json")}
    failed = [s for name, s in statuses.items() if "no_such_weights" in name]
    done = [s for name, s in statuses.items() if "no_such_weights" not in name]
    assert len(failed) == 1 and failed[0]["status"] == "failed" and "no_such_weights.pt" in failed[0]["error"]
    assert len(done) == 1 and done[0]["status"] == "complete"
