"""Time limits, requeues and preemption on SLURM lose nothing (docs/cluster.md, "Time limits and preemption").

A job is stopped by its time limit (submitit's USR2, sent ``signal_delay_s`` before it), by
``SUBMITIT_PREEMPT_SIGNAL=USR1``, by ``scontrol requeue`` (SIGTERM) and by a job of a higher partition that
preempts it. Each time the trainer writes a checkpoint at the signal, the run reads ``requeued`` (never
``failed``), the job comes back and resumes, and the run ends bit-equal to one never interrupted.

The jobs sleep after every step while a file exists (``SWALAB_FAULT=train_step:slow:<s>:<file>``, which
changes no number), so that they last in wall-clock time until they were interrupted as often as the test
wants, without using the CPU; then the file goes and the job finishes at full speed. On the test cluster a
requeued job waits ``cred_expire`` = 10 s before it starts again (SLURM's default is 120 s), and slurmctld
looks at time limits every 30 s: each requeue costs 20-40 s here.
"""

from __future__ import annotations

import json
import re

import pytest

from slurm_jobs import (PYTHON, SLURM, TINY, assert_same_run, env, only_run_dir, restarts, run, slurm_job_ids,
                        squeue_line, start, text, wait_for)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # about 5 minutes: .ci/run runs them after `make test`
RUN = ["method=swa", *TINY]


def reference(tmp_path, *cfg: str):
    """The same config trained here at once, never interrupted."""
    done = run(PYTHON, "run.py", *cfg, f"run.dir={tmp_path / 'reference'}")
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "reference"


def test_a_job_longer_than_its_time_limit_is_requeued_and_ends_bit_equal(slurm_cluster, tmp_path):
    cfg = [*RUN, "trainer.epochs=30"]
    slow = tmp_path / "slow"
    slow.touch()
    launcher = start(PYTHON, "run.py", "-m", *SLURM, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=15",
                     *cfg, f"paths.output_dir={tmp_path / 'slurm'}", log=tmp_path / "grid.log",
                     env=env(f"train_step:slow:0.4:{slow}"))
    try:
        run_dir = wait_for(lambda: list((tmp_path / "slurm").rglob("run.log")) and only_run_dir(tmp_path / "slurm"),
                           "the run to start", 180)
        wait_for(lambda: text(run_dir / "run.log").count(" requeued: ") >= 2, "two requeues at the time limit", 300)
        slow.unlink()  # the rest at full speed
        launcher.wait(timeout=300)
    finally:
        launcher.kill()
    grid = text(tmp_path / "grid.log")
    assert launcher.returncode == 0 and "1 of 1 jobs finished" in grid, grid[-3000:]
    log = text(run_dir / "run.log")
    stops = re.findall(r"requeued: SIGUSR2 received: checkpoint epoch\d+(?:_step\d+)?\.pt written \(after epoch \d+.*", log)
    assert len(stops) >= 2 and log.count("resuming ") == len(stops) and "failed" not in log, log
    (job,) = slurm_job_ids(tmp_path / "slurm")
    assert restarts(job) == len(stops)
    print(f"\n{squeue_line(job)}  Restarts={restarts(job)}\n" + "\n".join(
        line for line in log.splitlines() if "requeued" in line or "resuming" in line))
    assert_same_run(run_dir, reference(tmp_path, *cfg))


def test_usr1_scontrol_requeue_and_a_preemption_each_requeue_the_job_from_a_checkpoint(slurm_cluster, tmp_path):
    cfg = [*RUN, "trainer.epochs=30"]
    slow = tmp_path / "slow"
    slow.touch()
    launcher = start(PYTHON, "run.py", "-m", *SLURM, "hydra.launcher.timeout_min=30", *cfg,
                     f"paths.output_dir={tmp_path / 'slurm'}", log=tmp_path / "grid.log",
                     env=env(f"train_step:slow:0.3:{slow}", SUBMITIT_PREEMPT_SIGNAL="USR1"))
    try:
        job = wait_for(lambda: slurm_job_ids(tmp_path / "slurm"), "the job's submission", 120)[0]
        run_dir = wait_for(lambda: list((tmp_path / "slurm").rglob("run.log")) and only_run_dir(tmp_path / "slurm"),
                           "the run to start", 180)

        def after_epochs(n: int):
            return lambda: len(re.findall(r"^\S+ \S+ epoch \d+/30", text(run_dir / "run.log"), flags=re.M)) >= n

        def stopped(n: int):
            return lambda: text(run_dir / "run.log").count(" requeued: ") >= n

        interruptions = [
            ["scancel", "--signal=USR1", job],                        # what SLURM sends signal_delay_s before the limit
            ["scontrol", "requeue", job],                              # SIGTERM; SLURM requeues the job
            ["sbatch", "--partition=urgent", "--cpus-per-task=2", f"--output={tmp_path}/urgent-%j.out", "--wrap=sleep 1"],  # preempts the job (USR1, then requeue)
        ]
        for n, command in enumerate(interruptions, start=1):
            wait_for(after_epochs(2 * n), f"epoch {2 * n}", 240)
            assert run(*command, timeout=60).returncode == 0, command
            wait_for(stopped(n), f"the job to be requeued by {command[0]}", 120)
            assert json.loads((run_dir / "status.json").read_text())["status"] == "requeued"
        slow.unlink()  # the rest at full speed
        launcher.wait(timeout=300)
    finally:
        launcher.kill()
    grid = text(tmp_path / "grid.log")
    assert launcher.returncode == 0 and "1 of 1 jobs finished" in grid, grid[-3000:]
    log = text(run_dir / "run.log")
    stops = [line for line in log.splitlines() if " requeued: " in line]
    assert [s.split(" received")[0].rsplit(" ", 1)[1] for s in stops] == ["SIGUSR1", "SIGTERM", "SIGUSR1"], stops
    assert log.count("resuming ") == 3 and "failed" not in log
    assert restarts(job) >= 3
    print(f"\n{squeue_line(job)}  Restarts={restarts(job)}\n" + "\n".join(
        line for line in log.splitlines() if "requeued" in line or "resuming" in line))
    assert_same_run(run_dir, reference(tmp_path, *cfg))
