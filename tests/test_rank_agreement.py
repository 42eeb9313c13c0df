"""Every rank of a data-parallel run scores the same network and returns the same metrics, and scoring is
sharded: each of N ranks forwards 1/N of the batches (``swalab.distributed``, docs/cluster.md).

Two CPU processes (gloo) train a small network *with BatchNorm* with every method. Under DDP each rank's BN
running statistics follow its own half-batch, so before scoring they differ; the ranks must nevertheless
report identical metrics for every predictor. Separately, the sharded test pass and BN update must equal one
process doing all the work (the logits bit for bit: the same batches through the same network; the BN
statistics up to the order of float sums).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from swalab.data import ResidentLoader
from swalab.data.splits import DataSplit
from swalab.evaluate import predict_logits, recompute_bn
from swalab.methods import EMA, FGE, SGD, SWA, SWAG
from swalab.optim import OptimizerSpec
from swalab.schedules import Constant
from swalab.trainer import Trainer, TrainerOptions
from test_distributed import free_port

GLOBAL_BATCH, EPOCHS = 32, 4


def toy_data(n: int = 160) -> DataSplit:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = (images.float().mean(dim=(1, 2, 3)) > 127.5).long() + 2 * (images[:, 0, 0, 0] > 127).long()
    return DataSplit(images, labels)


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 64, 4))


def methods() -> dict:
    lr = Constant(lr=0.05)
    return {"sgd": SGD(lr, EPOCHS),
            "swa": SWA(lr, EPOCHS, lr=0.02, start_epoch=2),  # its BN update is sharded
            "ema": EMA(lr, EPOCHS, decay=0.9),                       # averages each rank's own BN buffers
            "fge": FGE(lr, EPOCHS, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=2, bn_update=True),
            "swag": SWAG(lr, EPOCHS, lr=0.02, start_epoch=2, rank=2, samples=2)}  # every rank draws rank 0's samples


def loaders(rank: int, world_size: int):
    data, common = toy_data(), dict(device="cpu", mean=[0.5], std=[0.25])
    train = ResidentLoader(data, GLOBAL_BATCH // world_size, train=True, pad=1, flip=False, seed=3, rank=rank,
                           world_size=world_size, **common)
    test = ResidentLoader(toy_data(150), 32, train=False, **common)  # 5 batches, the last of 22: uneven shares
    bn = ResidentLoader(data, 24, train=True, pad=1, flip=False, seed=4, drop_last=False, **common)  # 7 batches
    return train, test, bn


def train_all(run_dir: Path, rank: int, world_size: int) -> dict[str, dict]:
    """Each method's final metrics, trained as this rank of ``world_size``."""
    metrics = {}
    for name, method in methods().items():
        train, test, bn = loaders(rank, world_size)
        trainer = Trainer(bn_model(), method, train, test, bn, torch.device("cpu"), run_dir / name,
                          TrainerOptions(epochs=EPOCHS, progress=False, handle_signals=False),
                          optimizer=OptimizerSpec(settings={"momentum": 0.9, "weight_decay": 1e-4}))
        torch.manual_seed(100 + rank)  # each rank its own stream, as the ranks of a run have
        metrics[name] = trainer.fit().metrics
    return metrics


def diverged_model(rank: int) -> nn.Module:
    """The toy network with BN buffers that differ by rank, as after DDP training."""
    model = bn_model()
    bn = model[1]
    bn.running_mean.fill_(0.1 * (rank + 1))
    bn.running_var.fill_(1.0 + rank)
    return model


def score_sharded(rank: int) -> dict:
    """What one rank computes and forwards in a sharded test pass and a sharded BN update."""
    _, test, bn_loader = loaders(0, 1)
    model = diverged_model(rank)
    forwarded = []
    model.register_forward_hook(lambda module, args, out: forwarded.append(len(args[0])))
    logits = predict_logits(model, test, torch.device("cpu"))
    test_rows = sum(forwarded)
    forwarded.clear()
    recompute_bn(model, bn_loader, torch.device("cpu"))
    return {"logits": logits, "test_rows": test_rows, "bn_rows": sum(forwarded),
            "bn": {k: v.clone() for k, v in model[1].state_dict().items()}}


def _worker(rank: int, world_size: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = {"metrics": train_all(Path(root) / f"rank{rank}", rank, world_size), "sharded": score_sharded(rank)}
        torch.save(result, Path(root) / f"out{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[int, dict]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this build")
    root = tmp_path_factory.mktemp("ranks")
    port = free_port()
    procs = [mp.get_context("spawn").Process(target=_worker, args=(r, 2, port, str(root))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    return {r: torch.load(root / f"out{r}.pt", weights_only=False) for r in range(2)}


def test_every_rank_returns_the_same_metrics_for_every_predictor(two_ranks):
    per_rank = [two_ranks[r]["metrics"] for r in (0, 1)]
    predictors = {(m, p) for m, scored in per_rank[0].items() for p in scored}
    assert {("sgd", "sgd"), ("swa", "swa"), ("swa", "sgd"), ("ema", "ema"), ("ema", "sgd"), ("fge", "fge"),
            ("swag", "swag"), ("swag", "swag_diag")} <= predictors
    for method, predictor in sorted(predictors):
        assert per_rank[0][method][predictor] == per_rank[1][method][predictor], (method, predictor)


def test_a_sharded_test_pass_and_bn_update_equal_one_process_doing_all_the_work(two_ranks, one_thread):
    _, test, bn_loader = loaders(0, 1)
    alone = diverged_model(0)  # rank 0's buffers are the ones every rank scores with
    logits = predict_logits(alone, test, torch.device("cpu"))
    recompute_bn(alone, bn_loader, torch.device("cpu"))
    for rank in (0, 1):
        sharded = two_ranks[rank]["sharded"]
        assert torch.equal(sharded["logits"], logits)  # same batches, same network, gathered in order
        for key, value in alone[1].state_dict().items():
            torch.testing.assert_close(sharded["bn"][key], value, rtol=1e-6, atol=1e-7)
    # each rank forwarded its share only: test batches 0, 2, 4 (32 + 32 + 22) and 1, 3; BN batches 0, 2, 4, 6
    assert [two_ranks[r]["sharded"]["test_rows"] for r in (0, 1)] == [86, 64]
    assert [two_ranks[r]["sharded"]["bn_rows"] for r in (0, 1)] == [24 * 3 + 16, 24 * 3]
