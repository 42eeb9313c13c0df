"""Data-parallel training over several processes (``torchrun --nproc_per_node=N run.py ...``).

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; with ``WORLD_SIZE > 1``
:func:`init_distributed` joins the process group (NCCL on CUDA, gloo on CPU) and everything else
follows from these rules:

* ``trainer.batch_size`` is the *global* batch: each rank takes ``batch_size / world_size`` samples,
  its own slice of the same seeded permutation (``ResidentLoader(rank=, world_size=)``), so the
  ranks together train on exactly the batches of one process.
* The model is wrapped in ``DistributedDataParallel``: gradients are averaged across ranks in
  ``backward``, so after every optimizer step the weights are identical on all ranks. SWA, FGE and EMA
  therefore average identical weights on every rank and need no communication of their own.
* BatchNorm: during training each rank normalises with the statistics of its own slice of the batch
  (as any DDP run without SyncBatchNorm), and DDP broadcasts rank 0's running statistics at each
  forward. The BN update of an averaged model (``update_bn``) runs on every rank over the *whole*
  training set, so every rank computes the same statistics without communication, in the time rank 0
  alone would need.
* Only rank 0 writes files (run directory, checkpoints, history) and talks to W&B
  (:func:`is_main`); every rank evaluates the whole test set, so all return the same metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group ``torchrun`` describes in the environment; a no-op for one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistInfo(rank, world_size, local_rank)


def info() -> DistInfo:
    """Rank and world size of this process (``DistInfo()`` when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo()


def is_main() -> bool:
    """Whether this process writes files and logs (rank 0, or the only process)."""
    return info().rank == 0


def local_device(device: torch.device) -> torch.device:
    """Each rank's own GPU (``cuda:LOCAL_RANK``); CPU stays CPU."""
    current = info()
    if device.type == "cuda" and current.enabled:
        return torch.device("cuda", current.local_rank)
    return device


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when distributed, else unchanged."""
    if not info().enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
