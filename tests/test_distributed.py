"""Data-parallel training (torchrun + DDP) equals one process with the same global batch.

Two CPU processes (gloo) each train on their half of every global batch; DDP averages the
gradients, so the weights, and with them the SWA average, must match a single process that sees
the whole global batch. The model has no BatchNorm: with BN each rank normalises with the statistics
of its own half-batch, which (as in any DDP run without SyncBatchNorm) is not the single-process run.

Both loaders follow one rule: ``trainer.batch_size`` is the global batch, and each rank takes its slice of every
global batch of one seeded permutation, the resident loader (CIFAR) and the streaming loader (ImageNet) alike.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from swalab.data import ResidentLoader
from swalab.data.splits import DataSplit
from swalab.methods import SWA
from swalab.optim import OptimizerSpec
from swalab.schedules import Constant
from swalab.trainer import Trainer, TrainerOptions
from test_imagenet import tiny_imagenet  # noqa: F401  (a fixture)

GLOBAL_BATCH, EPOCHS = 32, 4


def toy_data() -> DataSplit:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (160, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = (images.float().mean(dim=(1, 2, 3)) > 127.5).long() + 2 * (images[:, 0, 0, 0] > 127).long()
    return DataSplit(images, labels)


def toy_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 4))


def train_swa(run_dir, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
    data, cpu = toy_data(), torch.device("cpu")
    common = dict(device=cpu, mean=[0.5], std=[0.25])
    train = ResidentLoader(data, GLOBAL_BATCH // world_size, train=True, pad=1, flip=False, seed=3,
                           rank=rank, world_size=world_size, **common)
    test = ResidentLoader(data, 64, train=False, **common)
    method = SWA(Constant(lr=0.05), EPOCHS, start_epoch=2, lr=0.02, bn_update=False)
    trainer = Trainer(toy_model(), method, train, test, test, cpu, run_dir,
                      TrainerOptions(epochs=EPOCHS, progress=False, handle_signals=False),
                          optimizer=OptimizerSpec(settings={"momentum": 0.9, "weight_decay": 1e-4}))
    trainer.fit()
    return {k: v.detach().clone() for k, v in method.final_weights()["swa"].items()}


def _worker(rank: int, world_size: int, port: int, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        swa = train_swa(run_dir, rank, world_size)
        files = sorted(p.name for p in Path(run_dir).rglob("*") if p.is_file())
        torch.save({"swa": swa, "files": files}, out)  # tensors through a file: the worker may exit first
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_average_the_same_swa_weights_as_one_process(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this build")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, str(tmp_path / f"rank{r}"), str(tmp_path / f"out{r}.pt")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    results = {r: tuple(torch.load(tmp_path / f"out{r}.pt").values()) for r in range(2)}

    single = train_swa(tmp_path / "single")
    for rank in (0, 1):
        for name, value in single.items():
            torch.testing.assert_close(results[rank][0][name], value, rtol=1e-4, atol=1e-5)
    # only rank 0 writes: each rank got its own directory here, and rank 1's stays empty
    assert "history.jsonl" in results[0][1] and any(f.startswith("epoch") for f in results[0][1])
    assert results[1][1] == []


def test_ranks_take_disjoint_slices_that_rebuild_the_single_process_batches():
    data = toy_data()
    common = dict(device="cpu", mean=[0.5], std=[0.25], train=True, pad=1, flip=True, seed=5)
    whole = ResidentLoader(data, GLOBAL_BATCH, **common)
    halves = [ResidentLoader(data, GLOBAL_BATCH // 2, rank=r, world_size=2, **common) for r in range(2)]
    for loader in (whole, *halves):
        loader.set_epoch(3)
    assert len(halves[0]) == len(halves[1]) == len(whole)
    for (x, y), (x0, y0), (x1, y1) in zip(whole, *halves):
        torch.testing.assert_close(torch.cat([x0, x1]), x)
        assert torch.equal(torch.cat([y0, y1]), y)


def test_sharding_refuses_what_would_leave_a_rank_without_a_batch():
    with pytest.raises(ValueError, match="global batch"):
        ResidentLoader(toy_data(), 100, device="cpu", mean=[0.5], std=[0.25], train=True, rank=1, world_size=2)
    with pytest.raises(ValueError, match="training batches only"):
        ResidentLoader(toy_data(), 16, device="cpu", mean=[0.5], std=[0.25], train=False, rank=0, world_size=2)


# -- streaming (ImageNet) loaders: the same global-batch rule ------------------------------------------------------
def stream_cfg(root: Path):
    from hydra import compose, initialize_config_dir

    from conftest import CONF_DIR, QUIET

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[
            *QUIET, "dataset=imagenet", f"dataset.root={root}", "dataset.image_size=32", "run.num_workers=0",
            "model=timm", "model.name=test_resnet", "trainer.batch_size=4", "run.device=cpu"])


def stream_epoch(root: Path, epoch: int = 1) -> dict:
    """This process's training batches of ``epoch`` from ``build_stream_loaders``, and the items they hold."""
    from swalab.data.imagenet import load_imagenet
    from swalab.train.build import build_stream_loaders

    train, _, _ = build_stream_loaders(stream_cfg(root), load_imagenet(root), torch.device("cpu"))
    train.set_epoch(epoch)
    batches = [(x.clone(), y.clone()) for x, y in train]
    train.set_epoch(epoch)
    trained = len(batches) * train.loader.batch_size  # a last incomplete batch is dropped
    return {"batches": batches, "items": [i for i, _ in train.sampler][:trained], "batch_size": train.loader.batch_size}


def _stream_worker(rank: int, world_size: int, port: int, root: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.save(stream_epoch(Path(root)), out)
    finally:
        dist.destroy_process_group()


def test_two_ranks_stream_disjoint_halves_of_every_global_batch_that_rebuild_the_single_process_epoch(
        tmp_path, tiny_imagenet):
    """18 images, trainer.batch_size=4 (the global batch): 4 global batches, each rank decodes 2 images of each."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_stream_worker, args=(r, 2, port, str(tiny_imagenet), str(tmp_path / f"out{r}.pt")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    ranks = [torch.load(tmp_path / f"out{r}.pt", weights_only=False) for r in range(2)]
    alone = stream_epoch(tiny_imagenet)
    assert [r["batch_size"] for r in ranks] == [2, 2] and alone["batch_size"] == 4
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == len(alone["batches"]) == 4
    assert not set(ranks[0]["items"]) & set(ranks[1]["items"])
    assert sorted(ranks[0]["items"] + ranks[1]["items"]) == sorted(alone["items"])
    for (x, y), (x0, y0), (x1, y1) in zip(alone["batches"], ranks[0]["batches"], ranks[1]["batches"]):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)  # same images, same crops
