"""Several processes per job (docs/cluster.md, "Several GPUs per job"): the same data-parallel run, however its
processes are started, ends with the same weights.

The reference is ``torchrun --standalone --nproc_per_node=2`` on this machine. The same config then runs as
one SLURM job of two tasks (``hydra.launcher.tasks_per_node=2``: ``swalab.distributed`` joins the process
group from ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``/``SLURM_LOCALID`` and the step's node list), and as
``torchrun --nnodes=2 --nproc_per_node=1`` launched twice with a c10d rendezvous on localhost, as on two
machines. All run on CPU with gloo, one thread per process.
"""

from __future__ import annotations

import pytest

from slurm_jobs import (PYTHON, SLURM, TINY, TORCHRUN, assert_same_weights, env, only_run_dir, run, start, text)
from test_distributed import free_port

pytestmark = pytest.mark.cluster
CFG = ["method=swa", "trainer.epochs=3", *TINY]


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("torchrun") / "run"
    done = run(*TORCHRUN, "--standalone", "--nproc_per_node=2", "run.py", *CFG, f"run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("predictor") == 1  # one log stream: rank 0 prints the table (both ranks score it)
    return run_dir


def test_a_slurm_job_of_two_tasks_trains_like_torchrun(slurm_cluster, torchrun_reference, tmp_path):
    grid = run(PYTHON, "run.py", "-m", *SLURM, "hydra.launcher.tasks_per_node=2", *CFG,
               f"paths.output_dir={tmp_path}")
    assert grid.returncode == 0 and "1 of 1 jobs finished" in grid.stdout, grid.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    logs = sorted(tmp_path.glob("grids/*/.submitit/*/*_log.out"))
    assert len(logs) == 2  # one per task
    assert sorted("predictor" in text(log) for log in logs) == [False, True]  # one log stream, rank 0's
    assert_same_weights(run_dir, torchrun_reference)


def test_torchrun_on_two_nodes_of_one_process_trains_like_one_node_of_two(torchrun_reference, tmp_path):
    """Two torchrun launches on this machine, no SLURM: it runs wherever the multi-process tests are asked for."""
    rendezvous = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                  "--rdzv_id=swalab-two-nodes"]
    run_dir = tmp_path / "run"
    nodes = [start(*TORCHRUN, *rendezvous, "run.py", *CFG, f"run.dir={run_dir}", log=tmp_path / f"node{n}.log",
                   env=env()) for n in range(2)]
    try:
        for node in nodes:
            node.wait(timeout=300)
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [text(tmp_path / f"node{n}.log")[-2000:] for n in range(2)]
    assert_same_weights(run_dir, torchrun_reference)
