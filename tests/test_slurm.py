"""What a job learns from SLURM, without a cluster: why a stop signal came, which task it is, and how the
launcher follows jobs where SLURM keeps no accounting (``swalab.slurm``, ``swalab.slurm_launcher``).

The ``scontrol show job`` records below are the ones a job read on a real one-node cluster
(tests/cluster/slurm-up) in the second after the signal; the live cluster tests are tests/test_cluster_*.py.
"""

from __future__ import annotations

import signal

import pytest

from swalab import distributed, slurm

IN_JOB = {"SLURM_JOB_ID": "42"}
# scontrol show job, read in the SIGTERM handler
REQUEUE = {"JobState": "COMPLETING", "Reason": "None", "Restarts": "1", "EndTime": "Unknown", "ExitCode": "0:0"}
SCANCEL = {"JobState": "COMPLETING", "Reason": "None", "Restarts": "0", "EndTime": "2026-11-24T01:24:45",
           "ExitCode": "0:15"}
TIME_LIMIT = {"JobState": "COMPLETING", "Reason": "TimeLimit", "Restarts": "0", "EndTime": "2026-11-24T01:26:21",
              "ExitCode": "0:15"}
RUNNING = {"JobState": "RUNNING", "Reason": "None", "Restarts": "0", "EndTime": "2026-11-24T02:26:21"}


@pytest.mark.parametrize("record, env, status", [
    (REQUEUE, IN_JOB, "requeued"),                                        # scontrol requeue: the count went up
    ({**REQUEUE, "Restarts": "2"}, {**IN_JOB, "SLURM_RESTART_COUNT": "1"}, "requeued"),
    ({**REQUEUE, "Restarts": "1"}, {**IN_JOB, "SLURM_RESTART_COUNT": "1"}, "preempted"),  # not by this signal
    (SCANCEL, IN_JOB, "cancelled"),
    ({**SCANCEL, "JobState": "CANCELLED"}, IN_JOB, "cancelled"),
    (TIME_LIMIT, IN_JOB, "preempted"),                                    # the time limit of a plain sbatch job
    (RUNNING, IN_JOB, "preempted"),                                       # e.g. a preemption's grace time
    ({}, IN_JOB, "preempted"),                                            # scontrol did not answer
    (SCANCEL, {}, "preempted"),                                           # not a SLURM job at all
])
def test_a_stop_signal_is_named_from_what_scontrol_says(record, env, status):
    assert slurm.stop_status(signal.SIGTERM, "preempted", env=env, record=record) == status


def test_a_signal_that_submitits_handler_answers_means_requeued(monkeypatch):
    class SignalHandler:
        def checkpoint_and_try_requeue(self, signum, frame):
            pass

    SignalHandler.__module__ = "submitit.core.job_environment"
    monkeypatch.setattr(signal, "getsignal", lambda signum: SignalHandler().checkpoint_and_try_requeue)
    assert slurm.stop_status(signal.SIGUSR2, "preempted", env={}) == "requeued"
    monkeypatch.setattr(signal, "getsignal", lambda signum: lambda s, f: None)  # some other handler
    assert slurm.stop_status(signal.SIGUSR2, "preempted", env={}) == "preempted"


STEP = {"SLURM_JOB_ID": "1234", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "vm", "SLURM_JOB_NODELIST": "vm"}


def test_an_srun_task_knows_its_rank_and_where_rank_0_listens():
    task = slurm.task_env(STEP)
    assert (task.rank, task.world_size, task.local_rank, task.master_addr) == (1, 2, 1, "vm")
    assert task.master_port == slurm.task_env({**STEP, "SLURM_PROCID": "0"}).master_port  # every task agrees
    assert 20000 <= task.master_port <= 60000
    assert slurm.task_env({**STEP, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}).master_addr == "10.0.0.1"
    assert slurm.task_env({**STEP, "MASTER_PORT": "29500"}).master_port == 29500
    assert distributed.launch_info(STEP) == distributed.DistInfo(rank=1, world_size=2, local_rank=1)


def test_a_batch_script_or_a_one_task_step_is_one_process():
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}  # sbatch -n 2: the script runs once
    assert slurm.task_env(batch) is None and not distributed.launch_info(batch).enabled
    assert slurm.task_env({**STEP, "SLURM_STEP_NUM_TASKS": "1"}) is None


def test_torchruns_variables_come_before_slurms():
    torchrun = {**STEP, "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "0"}  # srun ... torchrun --nproc_per_node=4
    assert distributed.launch_info(torchrun) == distributed.DistInfo(rank=3, world_size=4, local_rank=0)


def test_a_plain_node_list_needs_no_scontrol():
    assert slurm.first_host("gpu7,gpu8") == "gpu7"
    assert slurm.first_host("") == "127.0.0.1"


def test_without_accounting_jobs_are_followed_with_squeue():
    launcher = pytest.importorskip("swalab.slurm_launcher", reason="hydra-submitit-launcher is optional: "
                                   "pip install -e .[slurm]")
    watcher = launcher.SqueueWatcher(delay_s=60)
    for job in ("7_0", "7_1", "7_2", "8"):
        watcher.register_job(job)
    assert watcher._make_command()[0] == "squeue"
    info = watcher.read_info("7_1|RUNNING|vm\n7_2|PENDING|\n")
    assert info["7_1"]["State"] == "RUNNING" and info["7_2"]["State"] == "PENDING"
    assert info["7_0"]["State"] == info["8"]["State"] == launcher.GONE  # left the queue: finished
    watcher._info_dict.update(info)
    assert watcher.is_done("7_0", mode="cache") and not watcher.is_done("7_2", mode="cache")


def test_a_slow_fault_sleeps_at_every_step_while_its_file_exists(tmp_path, monkeypatch):
    import time

    from swalab import faults

    gate = tmp_path / "slow"
    gate.touch()
    monkeypatch.setenv(faults.ENV, f"train_step:slow:0.2:{gate}")

    def seconds() -> float:
        start = time.perf_counter()
        faults.hit("train_step")
        return time.perf_counter() - start

    assert seconds() >= 0.2 and seconds() >= 0.2
    gate.unlink()
    assert seconds() < 0.1
    monkeypatch.setenv(faults.ENV, "train_step:slow:0.2")  # no file named: always
    assert seconds() >= 0.2
