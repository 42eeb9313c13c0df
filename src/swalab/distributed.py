"""Data-parallel training over several processes: ``torchrun --nproc_per_node=N run.py ...``, or the tasks of
one SLURM job (``hydra.launcher.tasks_per_node=N``, docs/cluster.md).

:func:`init_distributed` joins the process group when it finds several processes: torchrun's ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK`` first, else an ``srun`` step's ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` and
``SLURM_LOCALID`` (``swalab.slurm.task_env``: rank 0 on the step's first node, the port drawn from the job
id). NCCL on CUDA, gloo on CPU. Everything else follows from these rules:

* ``trainer.batch_size`` is the *global* batch: each rank takes ``batch_size / world_size`` samples,
  its own slice of the same seeded permutation (``ResidentLoader(rank=, world_size=)``), so the
  ranks together train on exactly the batches of one process.
* The model is wrapped in ``DistributedDataParallel``: gradients are averaged across ranks in
  ``backward``, so after every optimizer step the weights are identical on all ranks. SWA, FGE and EMA
  therefore average identical weights on every rank and need no communication of their own.
* BatchNorm buffers are not gradients: during training each rank normalises with the statistics of its
  own slice of the batch and updates its running statistics from it (DDP broadcasts rank 0's at the start
  of each forward), so after the last step they differ between ranks. Every scoring pass therefore first
  broadcasts rank 0's buffers (:func:`sync_buffers`), and every rank scores the same network.
* Scoring and the BN update of an averaged model are sharded: each rank takes every ``world_size``-th batch
  (:func:`shard_batches`); predictions are gathered back in the loader's order (:func:`gather_batches`),
  BN statistics are summed over the ranks (:func:`reduce_bn_statistics`). N ranks do 1/N of the work each
  and all return the metrics one process would, up to the order of float sums.
* Only rank 0 writes files (run directory, checkpoints, history), talks to W&B and logs (:func:`is_main`).
* Every decision that changes what happens next (skip a step whose loss is not finite, pause for a signal, skip a
  run another process finished) is taken by all ranks together (:func:`agree`, :func:`from_rank_0`): a rank that
  acted alone would leave the others waiting in a collective that never completes (NCCL hangs until its
  watchdog, gloo times out). Agreements travel on a gloo group on the CPU (:func:`_control_group`), so they
  never wait for the GPU's queue; a single process makes none.
* Each rank draws its own random numbers (dropout masks, Shake-Shake coefficients: ``swalab.train.records
  .seed_everything``); a checkpoint holds every rank's generator states, each restored on its own rank."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from swalab import slurm
from swalab.config import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launch_info(env: Mapping[str, str] = os.environ) -> DistInfo:
    """Rank, world size and local rank the launcher gave this process, before any process group exists:
    torchrun's variables, else an ``srun`` step's (``swalab.slurm.task_env``), else one process."""
    if int(env.get("WORLD_SIZE") or 1) > 1:
        return DistInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK") or 0))
    task = slurm.task_env(env)
    if task is not None:
        return DistInfo(task.rank, task.world_size, task.local_rank)
    return DistInfo()


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group torchrun or an ``srun`` step describes in the environment; a no-op for one process.

    Under SLURM it exports torchrun's variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``; those already set are kept) and joins with ``env://`` as torchrun's processes do."""
    launched = launch_info()
    if not launched.enabled:
        return DistInfo()
    if "WORLD_SIZE" not in os.environ:  # an srun task: torchrun's variables from SLURM's
        task = slurm.task_env()
        for key, value in {"MASTER_ADDR": task.master_addr, "MASTER_PORT": task.master_port, "RANK": task.rank,
                           "WORLD_SIZE": task.world_size, "LOCAL_RANK": task.local_rank}.items():
            os.environ.setdefault(key, str(value))
    cuda = device != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(launched.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    return launched


def info() -> DistInfo:
    """Rank and world size of this process (``DistInfo()`` when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo()


def is_main() -> bool:
    """Whether this process writes files and logs (rank 0, or the only process). Before the process group is
    joined, the launcher's rank decides (:func:`launch_info`)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return launch_info().rank == 0


def local_device(device: torch.device) -> torch.device:
    """The device this process trains on, made CUDA's current device: each rank's own GPU (``cuda:LOCAL_RANK``), or
    ``run.device=cuda:N`` for one process (without ``set_device``, pinned-memory copies, NCCL and every tensor made
    with ``device="cuda"`` would go to GPU 0); CPU stays CPU. ``cuda`` without an index (``run.device=auto``) becomes
    the current GPU by its index, as its tensors report it (``cuda:0``): a model's device then compares equal to the
    training device (``torch.device("cuda") != torch.device("cuda", 0)``)."""
    current = info()
    if device.type == "cuda" and current.enabled:
        device = torch.device("cuda", current.local_rank)
    elif device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when distributed, else unchanged."""
    if not info().enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


# -- every rank scores the same network, each on its share of the batches ------------------------------------
def _collective_device() -> torch.device:
    """Where tensors must live for this process group's collectives (NCCL: this rank's GPU)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sync_buffers(model: nn.Module) -> None:
    """Broadcast rank 0's buffers (BatchNorm running statistics) to every rank; a no-op for one process.

    Weights agree after every DDP step, buffers do not: each rank's BN statistics follow its own slice of the
    batch. Scoring after this gives every rank rank 0's network, the one rank 0 writes to ``final.pt``."""
    if not info().enabled:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for buffer in model.buffers():
        by_dtype.setdefault(buffer.dtype, []).append(buffer)
    device = _collective_device()
    for buffers in by_dtype.values():
        flat = torch.cat([b.detach().reshape(-1).to(device) for b in buffers])
        dist.broadcast(flat, src=0)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def shard_batches(batches: Iterable) -> Iterator:
    """This rank's share of ``batches``: batch ``i`` goes to rank ``i % world_size`` (all of them for one
    process). Skipped batches are still drawn from the loader, but nothing is computed on them."""
    current = info()
    for i, batch in enumerate(batches):
        if i % current.world_size == current.rank:
            yield batch


def gather_batches(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The per-batch outputs of every rank's :func:`shard_batches` share, concatenated in the loader's order,
    on the CPU, on every rank (for one process: ``torch.cat(outputs)``)."""
    current = info()
    if not current.enabled:
        return torch.cat(outputs).cpu()
    device = _collective_device()
    width = outputs[0].shape[1:] if outputs else None
    # each rank's batch sizes and row width, padded to the longest list
    sizes = torch.tensor([len(o) for o in outputs], dtype=torch.long, device=device)
    counts = _all_gather_padded(sizes.view(-1, 1)).squeeze(-1)  # [world, max batches]
    shapes = [None] * current.world_size
    dist.all_gather_object(shapes, None if width is None else tuple(width))
    width = next(s for s in shapes if s is not None)
    local = (torch.cat(outputs) if outputs else torch.zeros((0, *width))).to(device)
    rows = _all_gather_padded(local)  # [world, max rows, *width]
    per_rank = [list(torch.split(rows[r][: int(counts[r].sum())], counts[r][counts[r] > 0].tolist()))
                if int(counts[r].sum()) else [] for r in range(current.world_size)]
    total = sum(len(p) for p in per_rank)
    ordered = [per_rank[i % current.world_size][i // current.world_size] for i in range(total)]
    return torch.cat(ordered).cpu()


def _all_gather_padded(local: torch.Tensor) -> torch.Tensor:
    """``[world, max rows, ...]``: every rank's ``local`` (rows may differ), zero-padded to the longest."""
    world = info().world_size
    n = torch.tensor([len(local)], dtype=torch.long, device=local.device)
    lengths = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(lengths, n)
    longest = int(max(int(x) for x in lengths))
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[: len(local)] = local
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.stack(parts)


def reduce_bn_statistics(batches: Mapping[_BatchNorm, int]) -> None:
    """After each rank ran the BN update over its share of the batches (``swalab.evaluate.recompute_bn``, which
    counted each layer's ``batches`` in Python): every rank's BatchNorm statistics become the average over all
    batches (sums of ``running_mean * batches`` and ``running_var * batches`` over the ranks, divided by all the
    batches), as one process averaging every batch would compute them."""
    if not info().enabled:
        return
    layers = [m for m in batches if m.running_mean is not None]
    if not layers:
        return
    counts = torch.tensor([batches[m] for m in layers], dtype=torch.float64)
    dist.all_reduce(counts, group=_control_group())  # on the CPU: the totals are read by Python below
    totals = counts.tolist()
    device = _collective_device()
    sums = torch.cat([torch.cat([m.running_mean.double().reshape(-1), m.running_var.double().reshape(-1)]).to(device)
                      * batches[m] for m in layers])
    dist.all_reduce(sums)
    offset = 0
    for m, total in zip(layers, totals):
        n = m.running_mean.numel()
        if total:
            m.running_mean.copy_((sums[offset:offset + n] / total).view_as(m.running_mean))
            m.running_var.copy_((sums[offset + n:offset + 2 * n] / total).view_as(m.running_var))
            m.num_batches_tracked.fill_(int(total))
        offset += 2 * n


# -- decisions every rank takes together ------------------------------------------------------------------------
_control: dict = {}


def _control_group():
    """The group agreements travel on: the default group when it is gloo, else a gloo group over the same ranks made
    on first use (every rank makes its first agreement at the same point), so that agreeing on a flag is a CPU
    all-reduce that never waits for the GPU's queue (reading back an NCCL result would)."""
    if dist.get_backend() == "gloo":
        return None
    world = dist.group.WORLD
    if _control.get("world") is not world:  # a new process group (tests join and leave several)
        _control.update(world=world, group=dist.new_group(backend="gloo"))
    return _control["group"]


def agree(value: int, op: str = "max") -> int:
    """The largest (``op="max"``) or smallest (``"min"``) of every rank's ``value``; ``value`` itself for one
    process, with no collective. Call it at the same point on every rank."""
    if not info().enabled:
        return value
    tensor = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN, group=_control_group())
    return int(tensor[0])


def agree_any(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
    return bool(agree(int(bool(flag)), "max"))


def from_rank_0(obj):
    """Rank 0's ``obj`` on every rank (a picklable object); ``obj`` itself for one process."""
    if not info().enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group())
    return box[0]


def gather_objects(obj) -> list:
    """Every rank's ``obj`` in rank order, on every rank (``[obj]`` for one process)."""
    current = info()
    if not current.enabled:
        return [obj]
    out = [None] * current.world_size
    dist.all_gather_object(out, obj, group=_control_group())
    return out


def barrier() -> None:
    """Wait until every rank is here (nothing for one process): a rank leaves only once rank 0's files are written."""
    if info().enabled:
        dist.barrier(group=_control_group())


def select_device(name: str, key: str = "run.device") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; ``cuda`` without a GPU is a clear error, naming ``key`` (the
    setting or flag the device was given by)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"{key}={name!r} must be auto, cpu or cuda[:N]")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}={name} but no CUDA device is visible; use {key}=auto or cpu")
    return torch.device(name)
