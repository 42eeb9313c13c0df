"""Every decision that changes what a data-parallel run does next is taken by all ranks together.

A rank that acts alone leaves the others waiting in a collective that never completes: with NCCL they hang
until the watchdog kills the job, with gloo they time out. Two CPU processes (gloo) stand in for two GPUs here,
each joining the process group with a 60 s timeout, so a hang shows as a timeout error, never as a stuck suite:

* a NaN loss on rank 0 only, with ``trainer.nonfinite=skip``: every rank skips that step and the run ends with
  the weights of a single process that skipped it, and its last checkpoint;
* a pause signal to rank 1 only: every rank stops at the same step, rank 0 writes the checkpoint (and the others
  wait until it has), every rank raises ``Preempted``; the same two ranks resume from it and end bit-equal to an
  uninterrupted two-rank run;
* a model that draws random numbers (dropout), each rank with a stream of its own: paused and resumed, the two
  ranks end bit-equal to the uninterrupted run, because each rank gets its own stream back from rank 0's
  checkpoint (a rank restarting rank 0's stream would take other dropout masks);
* ``train`` on two ranks: one log stream (``run.log`` and the table from rank 0 only); a run that another
  process finished after the ranks looked at its directory: every rank returns the finished run's metrics,
  none is left waiting in DDP's setup; and a run another process holds: rank 0 is refused, every rank with it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import traceback
import warnings
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from swalab import faults
from swalab.checkpoint import CheckpointStore
from swalab.data import ResidentLoader
from swalab.methods import SGD
from swalab.optim import OptimizerSpec
from swalab.schedules import Constant
from swalab.pausing import Preempted
from swalab.trainer import Trainer, TrainerOptions
from test_distributed import free_port, toy_data, toy_model

GLOBAL_BATCH, EPOCHS = 32, 2  # 160 images: 5 steps an epoch
GLOO_TIMEOUT_S, JOIN_TIMEOUT_S = 60, 300
DEVICE = torch.device("cpu")  # each rank's device: its GPU under NCCL (tests/test_gpu.py)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available in this build")


def dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), nn.Linear(4 * 64, 4))


def toy_trainer(run_dir: Path, rank: int, world_size: int, model: nn.Module | None = None, **options) -> Trainer:
    data = toy_data()
    common = dict(device=DEVICE, mean=[0.5], std=[0.25])
    train = ResidentLoader(data, GLOBAL_BATCH // world_size, train=True, pad=1, flip=False, seed=3,
                           rank=rank, world_size=world_size, **common)
    test = ResidentLoader(data, 64, train=False, **common)
    opts = TrainerOptions(epochs=EPOCHS, progress=False, **{"handle_signals": False, **options})
    return Trainer(model or toy_model(), SGD(Constant(lr=0.05), EPOCHS), train, test, test, DEVICE, run_dir, opts,
                   optimizer=OptimizerSpec(settings={"momentum": 0.9, "weight_decay": 1e-4}))


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))


def poison_training_loss(call: int) -> Callable[[], None]:
    """The ``call``-th training loss of this process (evaluation passes not counted) becomes NaN; returns the undo."""
    real, count = torch.nn.functional.cross_entropy, [0]

    def cross_entropy(*args, **kwargs):
        loss = real(*args, **kwargs)
        if torch.is_grad_enabled():
            count[0] += 1
            if count[0] == call:
                return loss * float("nan")
        return loss
    torch.nn.functional.cross_entropy = cross_entropy

    def undo() -> None:
        torch.nn.functional.cross_entropy = real
    return undo


# -- what each rank does ------------------------------------------------------------------------------------------
def nan_on_rank_0(rank: int, world_size: int, root: Path) -> dict:
    if rank == 0:
        poison_training_loss(3)
    trainer = toy_trainer(root / "run", rank, world_size, nonfinite="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    return {"weights": weights(trainer), "warnings": [str(w.message) for w in caught if "skipped" in str(w.message)]}


def pause_then_resume(rank: int, world_size: int, root: Path, model_fn=toy_model) -> dict:
    """An uninterrupted run, then the same run paused by SIGTERM to rank 1 at its 3rd step and resumed."""
    model = model_fn()
    torch.manual_seed(100 + rank)  # each rank's own stream (every device's), as a data-parallel run seeds them
    straight = toy_trainer(root / "straight", rank, world_size, model)
    straight.fit()
    model = model_fn()
    torch.manual_seed(100 + rank)
    if rank == 1:
        os.environ[faults.ENV] = "train_step:3:TERM"
    paused = toy_trainer(root / "paused", rank, world_size, model, handle_signals=True)
    try:
        paused.fit()
        stopped = None
    except Preempted as exc:
        stopped = str(exc)
    os.environ.pop(faults.ENV, None)
    faults.reset()
    written = checkpoints(root / "paused")  # what each rank finds on disk once it has left the loop
    dist.barrier()
    torch.manual_seed(12345)  # whatever the RNG holds when the run is launched again
    resumed = toy_trainer(root / "paused", rank, world_size, model_fn())
    resumed.fit(CheckpointStore(root / "paused").latest())
    return {"straight": weights(straight), "resumed": weights(resumed), "stopped": stopped, "written": written}


def pause_a_dropout_model(rank: int, world_size: int, root: Path) -> dict:
    return pause_then_resume(rank, world_size, root, dropout_model)


TINY = ["logger=none", "run.progress=false", "trainer.epochs=2", "model.swa.start_epoch=1", "dataset.train_size=256",
        "trainer.batch_size=64", "model.arch.depth=8"]


def train_then_find_finished(rank: int, world_size: int, root: Path) -> dict:
    """``train`` into ``a`` on both ranks; then both plan a run into ``b``, which rank 0 fills with ``a``'s finished
    files before either executes (another process finished it meanwhile)."""
    from hydra import compose, initialize_config_dir

    from swalab.train import execute, prepare

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("swalab").addHandler(handler)
    logging.getLogger("swalab").setLevel(logging.INFO)
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=TINY)
    trained = execute(prepare(cfg, root / "a"))
    plan = prepare(cfg, root / "b")
    dist.barrier()
    if rank == 0:
        shutil.copytree(root / "a", root / "b", dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lock"))
    dist.barrier()
    found = execute(plan)
    try:  # c is locked by the test's own process: rank 0 is refused, and so is every rank
        execute(prepare(cfg, root / "c"))
        refused = None
    except Exception as exc:  # noqa: BLE001 - the test reads it
        refused = f"{type(exc).__name__}: {exc}"
    return {"trained": trained, "found": found, "lines": lines, "refused": refused}


# -- two processes ------------------------------------------------------------------------------------------------
def _worker(rank: int, world_size: int, port: int, root: str, scenario: str, backend: str) -> None:
    global DEVICE
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    if backend == "nccl":
        DEVICE = torch.device("cuda", rank)
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        result = globals()[scenario](rank, world_size, Path(root))
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    torch.save(result, Path(root) / f"out{rank}.pt")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a group broken by a timeout
        pass


def two_ranks(root: Path, scenario: str, backend: str = "gloo") -> dict[int, dict]:
    """Run ``scenario`` on two ranks (gloo on the CPU, or NCCL on two GPUs); each rank's result (or its error),
    failing the test on a hang."""
    port = free_port()
    procs = [mp.get_context("spawn").Process(target=_worker, args=(r, 2, port, str(root), scenario, backend))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=JOIN_TIMEOUT_S)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} still running after {JOIN_TIMEOUT_S} s"
    results = {r: torch.load(root / f"out{r}.pt", weights_only=False) for r in range(2)}
    for r, result in results.items():
        assert "error" not in result, f"rank {r}: {result['error']}\n{result['traceback']}"
    return results


# -- the tests ------------------------------------------------------------------------------------------------------
def test_a_nan_loss_on_one_rank_is_skipped_by_every_rank(tmp_path, one_thread):
    ranks = two_ranks(tmp_path, "nan_on_rank_0")
    undo = poison_training_loss(3)
    try:
        alone = toy_trainer(tmp_path / "single", 0, 1, nonfinite="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone.fit()
    finally:
        undo()
    for name, value in weights(alone).items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name
        torch.testing.assert_close(ranks[0]["weights"][name], value, rtol=1e-4, atol=1e-5)
    assert ranks[0]["warnings"] == ["non-finite loss at epoch 1, step 3: step skipped"]
    assert ranks[1]["warnings"] == []  # one log stream: rank 0 says it
    assert checkpoints(tmp_path / "run")[-1] == f"epoch{EPOCHS:04d}.pt"


def test_a_signal_to_one_rank_pauses_every_rank_at_the_same_step_and_the_resume_ends_equal(tmp_path):
    ranks = two_ranks(tmp_path, "pause_then_resume")
    for r in (0, 1):
        assert ranks[r]["stopped"] == ("SIGTERM received: checkpoint epoch0000_step000003.pt written (after epoch 0 "
                                       "and 3 steps of epoch 1); re-run the same command to continue")
        assert ranks[r]["written"] == ["epoch0000_step000003.pt"]  # on disk before any rank went on
        for name, value in ranks[r]["straight"].items():
            assert torch.equal(ranks[r]["resumed"][name], value), (r, name)


def test_a_two_rank_run_whose_model_draws_random_numbers_resumes_bit_equal(tmp_path):
    ranks = two_ranks(tmp_path, "pause_a_dropout_model")
    for r in (0, 1):
        for name, value in ranks[r]["straight"].items():
            assert torch.equal(ranks[r]["resumed"][name], value), (r, name)


def test_two_ranks_log_once_and_return_together_when_the_run_was_finished_meanwhile(tmp_path):
    from swalab.runlock import RunLock

    with RunLock(tmp_path / "c"):
        ranks = two_ranks(tmp_path, "train_then_find_finished")
    finished = json.loads((tmp_path / "a" / "metrics.json").read_text())
    for r in (0, 1):
        assert ranks[r]["trained"] == finished and ranks[r]["found"] == finished
    log = (tmp_path / "a" / "run.log").read_text()
    assert log.count("epoch 1/2") == log.count("epoch 2/2") == log.count("predictor") == 1
    assert any("epoch 2/2" in line for line in ranks[0]["lines"])
    assert ranks[1]["lines"] == []
    assert ranks[0]["refused"].startswith("RunLocked: ") and "is being trained by another process" in ranks[0]["refused"]
    assert ranks[1]["refused"].startswith(f"RuntimeError: rank 0 could not start {tmp_path / 'c'}: RunLocked: ")


# -- in one process -------------------------------------------------------------------------------------------------
def test_a_checkpoint_keeps_the_training_devices_generator_only(tmp_path):
    from swalab.checkpoint import rng_state

    assert set(rng_state(torch.device("cpu"))) == {"torch", "python", "numpy"}  # no list of every visible GPU
    trainer = toy_trainer(tmp_path, 0, 1)
    state = torch.load(trainer.save(0, 1), weights_only=False)
    assert set(state["rng"]) == {"torch", "python", "numpy"} and "rng_ranks" not in state  # one process: its own


def test_each_rank_restores_its_own_generator_states():
    from swalab.checkpoint import rank_rng_state

    written = {"rng": "rank 0", "rng_ranks": ["rank 0", "rank 1"]}
    assert [rank_rng_state(written, r, 2) for r in (0, 1)] == ["rank 0", "rank 1"]
    assert rank_rng_state(written, 2, 3) is None  # more ranks than wrote it: a fresh stream (and a warning)
    assert rank_rng_state({"rng": "rank 0"}, 1, 2) == "rank 0"  # one process, or an earlier swalab: one stream


def test_each_rank_draws_its_own_stream_and_rank_0_the_runs_seed():
    from swalab.train.records import rank_seed, seed_everything

    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) == rank_seed(7, 1) != 7 and rank_seed(7, 1) != rank_seed(7, 2)
    draws = []
    for rank in (0, 1, 0):
        seed_everything(7, rank)
        draws.append(torch.rand(3))
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])
    torch.manual_seed(7)
    assert torch.equal(torch.rand(3), draws[0])  # rank 0 draws what one process draws


def test_run_device_cuda_n_becomes_the_current_cuda_device(monkeypatch):
    from swalab import distributed

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert distributed.local_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert distributed.local_device(torch.device("cpu")) == torch.device("cpu")
    assert chosen == [torch.device("cuda", 1)]


def test_run_device_auto_trains_on_the_current_gpu_named_by_its_index_as_its_tensors_report_it(monkeypatch):
    """run.device=auto selects ``cuda`` (no index), while a tensor on that GPU reports ``cuda:N``: the training
    device is the indexed one, so a model's device compares equal to it (an SWA average living there is then scored
    as it is, not copied). GPU 1 stands in for the current GPU, so the check runs without one."""
    from swalab import distributed

    chosen = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    device = distributed.local_device(torch.device("cuda"))
    assert device == torch.device("cuda", 1) and device != torch.device("cuda", 0)
    assert chosen == [torch.device("cuda", 1)]
