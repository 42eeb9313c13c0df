"""Numerics of a run: in what precision it trains, that it scores in float32, and whether the GPU must repeat
itself bit for bit.

Four decisions live here, each in one function, so a change to one is a change to one place:

* :func:`training_dtype` / :func:`training_autocast`: the autocast of a training step's forward pass and loss,
  from ``trainer.precision`` (``PRECISIONS``): ``auto`` is bf16 on CUDA and float32 elsewhere (what swalab always
  did); ``bf16`` and ``fp16`` autocast on any device, the CPU included (torch runs both there, slowly, which is how
  the tests exercise them); ``fp32`` never. ``fp16`` is for GPUs without bf16 (V100, T4) and needs a gradient scaler.
* :func:`grad_scaler`: ``torch.amp.GradScaler`` for ``fp16`` (None otherwise). fp16 gradients underflow to zero
  unless the loss is scaled up first; the scaler does that, unscales before the optimizer step, and *skips* a step
  whose gradients overflowed (and lowers its scale): such a step is the scaler's to skip, not a failure of the run.
  Its state (the scale and its growth tracker) goes into every checkpoint, so a resumed run scales as one that ran
  straight through.
* :func:`scoring_precision`: every number a run reports (test passes, the BN update of an averaged model) is
  computed in float32, whatever the training precision: a logit rounded to bf16 moves NLL, ECE and even
  predictions by as much as the differences the paper's tables compare (issue 31: 12 of 800 ImageNet
  predictions changed), and the analyses, which score in float32 too, would disagree with ``metrics.json``.
* :func:`deterministic`: ``run.deterministic``, what makes a GPU run repeat itself bit for bit (cuDNN's
  deterministic algorithms, torch's deterministic algorithms, a fixed cuBLAS workspace), so that a resumed
  run ends with the weights of one that ran straight through. It changes nothing on a CPU, whose kernels are
  deterministic already."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from swalab.config import ConfigError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# cuBLAS reuses one workspace per stream only with this setting; torch refuses deterministic matmuls without it.
CUBLAS_WORKSPACE = ":4096:8"


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} must be one of {', '.join(PRECISIONS)}")
    return precision


def slow_precision(device: torch.device, precision: str) -> str | None:
    """A line for run.log when the training precision is one the device only emulates: fp16 on a CPU runs many times
    slower than float32 (CPUs have no half-precision arithmetic of use to torch's kernels) and is meant for GPUs
    without bf16. None otherwise."""
    if device.type == "cpu" and precision == "fp16":
        return ("trainer.precision=fp16 on the CPU: torch emulates half precision there, many times slower than "
                "float32; fp16 is for GPUs without bf16. On a CPU set trainer.precision=auto (float32)")
    return None


def training_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype of a training step on ``device``, or None for float32 (module doc)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[check_precision(precision)]


def training_autocast(device: torch.device, precision: str, cache: bool = True):
    """The autocast context of a training step (:func:`training_dtype`), or a no-op in float32; ``cache=False``
    inside a CUDA graph's capture (``swalab.graphed``), where cached casts must not outlive the step."""
    dtype = training_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """The gradient scaler of an ``fp16`` run (module doc), None for the others (bf16 has float32's range)."""
    if training_dtype(device, precision) != torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def scoring_precision(device: torch.device):
    """Float32 for what is scored (test passes, BN updates), even inside a caller's autocast region."""
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def deterministic(device: torch.device, enabled: bool) -> Iterator[None]:
    """While the block runs on a CUDA ``device``: with ``enabled``, cuDNN's deterministic algorithms (no
    autotuning), ``torch.use_deterministic_algorithms(True, warn_only=True)`` and ``CUBLAS_WORKSPACE_CONFIG``;
    without it, cuDNN autotuning (``cudnn.benchmark``), the fastest and not repeatable. Previous settings are
    restored afterwards. On other devices nothing changes.

    What it costs (``run.deterministic``, ``swalab.settings``): cuDNN may not pick its fastest convolution and
    no autotuning runs, and some kernels (scatter-adds, index-adds) take slower deterministic paths; an op that has
    no deterministic CUDA kernel (the backward of adaptive average pooling, which timm's ImageNet models use)
    warns once and stays nondeterministic. ``bench/models.py --nondeterministic`` measures the difference.
    ``CUBLAS_WORKSPACE_CONFIG`` must be set before the process's first cuBLAS call to take effect; swalab sets it
    here, before training, unless it is set already.

    ``torch.utils.deterministic.fill_uninitialized_memory`` is turned off while the block runs: by default
    deterministic mode fills every new allocation with NaN (a ``fill_`` kernel per ``empty``; a third more
    operations in a PreResNet-164 step) so that a program reading memory it never wrote reads the same NaN each
    time. swalab's step never reads uninitialised memory, so the fill buys nothing; torch documents that turning it
    off keeps the run deterministic for such programs, and the GPU bit-repeat tests (tests/test_gpu.py) are the guard.
    """
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    fill = torch.utils.deterministic
    before = (cudnn.deterministic, cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), fill.fill_uninitialized_memory)
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    cudnn.deterministic, cudnn.benchmark = enabled, not enabled
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    fill.fill_uninitialized_memory = False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = before[0], before[1]
        torch.use_deterministic_algorithms(before[2], warn_only=before[3])
        fill.fill_uninitialized_memory = before[4]
