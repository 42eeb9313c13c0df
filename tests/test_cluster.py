"""Grids on SLURM (``hydra/launcher=slurm``), on the local cluster of tests/cluster/slurm-up (docs/cluster.md).

The first test needs only the launcher plugin; the others submit real jobs and are marked ``cluster``: they
run when a cluster answers (CI brings one up) and are skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from swalab.grid import read_jobs
from hydra import compose, initialize_config_dir

from conftest import CONF_DIR
from slurm_jobs import PYTHON, SLURM, TINY, env, only_run_dir, run, slurm_job_ids, start, text, wait_for


def test_the_slurm_launcher_config_composes_over_the_plugins_own(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is optional: pip install -e .[slurm]")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "logger=none"])
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.swalab_slurm.SlurmLauncher"  # the plugin's, quiet without sacct
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min) == ("gpu", 1, 720)
    assert launcher.max_num_timeout > 0  # a job that reaches its time limit is requeued and resumes


GRID = ["method=sgd,swa", "seed=0,1", "trainer.epochs=3", *TINY]


def log_span(run_dir: Path) -> tuple[datetime, datetime]:
    """When a run's first and last run.log lines were written."""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ", text(run_dir / "run.log"), flags=re.M)
    return datetime.fromisoformat(stamps[0]), datetime.fromisoformat(stamps[-1])


@pytest.mark.cluster
def test_a_grid_on_slurm_finishes_with_the_same_summary_and_table_as_on_one_machine(slurm_cluster, tmp_path):
    local = run(PYTHON, "run.py", "-m", *GRID, f"paths.output_dir={tmp_path / 'local'}")
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm = run(PYTHON, "run.py", "-m", *SLURM, "hydra.launcher.array_parallelism=1", *GRID,
                   f"paths.output_dir={tmp_path / 'slurm'}")
    assert on_slurm.returncode == 0, on_slurm.stderr[-3000:]
    summaries = [re.sub(r"/\S+/(local|slurm)/", "<out>/", p.stdout[p.stdout.index("[swalab] grid summary"):])
                 for p in (local, on_slurm)]
    assert summaries[0] == summaries[1] and "4 of 4 jobs finished" in summaries[0]
    assert "sacct" not in on_slurm.stdout + on_slurm.stderr  # no accounting here: followed with squeue, quietly

    tables = []
    for where in ("local", "slurm"):
        grid = next((tmp_path / where / "grids").iterdir())
        report = run(PYTHON, "-m", "swalab.results.report", str(grid), "--out", str(tmp_path / f"report_{where}"))
        assert report.returncode == 0, report.stderr[-3000:]
        tables.append((tmp_path / f"report_{where}" / "table.md").read_text())
    assert tables[0] == tables[1]  # the same table, digit for digit (one thread in both: see docs/cluster.md)

    # array_parallelism=1: one array of 4 tasks, throttled to 1, and no two jobs ever ran at once
    jobs = slurm_job_ids(tmp_path / "slurm")
    assert len(jobs) == 4 and len({j.split("_")[0] for j in jobs}) == 1
    sbatch = next((tmp_path / "slurm").glob("grids/*/.submitit/*/*submission.sh")).read_text()
    assert "#SBATCH --array=0-3%1" in sbatch
    [grid] = (tmp_path / "slurm" / "grids").iterdir()
    spans = sorted(log_span(Path(j["run_dir"])) for j in read_jobs(grid))  # the record names its runs relative to it
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans


@pytest.mark.cluster
def test_scancel_marks_the_run_cancelled_and_launching_the_grid_again_resumes_it(slurm_cluster, tmp_path):
    grid = [PYTHON, "run.py", "-m", *SLURM, "method=swa", "trainer.epochs=4", *TINY, f"paths.output_dir={tmp_path}"]
    launcher = start(*grid, log=tmp_path / "grid.log", env=env("train_step:slow:0.3"))
    try:
        wait_for(lambda: (tmp_path / "grids").is_dir() and slurm_job_ids(tmp_path), "the job's submission", 120)
        run_dir = wait_for(lambda: "epoch 1/4" in text(next(tmp_path.rglob("run.log"), tmp_path / "x"))
                           and only_run_dir(tmp_path), "the first epoch", 180)
        (job,) = slurm_job_ids(tmp_path)
        assert run("scancel", job).returncode == 0
        launcher.wait(timeout=180)
    finally:
        launcher.kill()
    summary = text(tmp_path / "grid.log")
    assert launcher.returncode == 1 and "0 of 1 jobs finished; 1 did not: cancelled" in summary, summary[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "cancelled" and "re-run the same command" in status["message"]
    assert re.search(r"cancelled: SIGTERM received: checkpoint epoch\d+(_step\d+)?\.pt written \(after epoch", text(run_dir / "run.log"))

    again = run(*grid)
    assert again.returncode == 0 and "1 of 1 jobs finished" in again.stdout, again.stderr[-3000:]
    assert f"resuming {run_dir} from" in text(run_dir / "run.log")
    assert json.loads((run_dir / "status.json").read_text())["status"] == "complete"
