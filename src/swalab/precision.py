"""Numerics of a run: in what precision it trains, that it scores in float32, and whether the GPU must repeat
itself bit for bit.

Three decisions live here, each in one function, so a change to one (another training precision, say) is a
change to one place:

* :func:`training_autocast`: the autocast context of a training step's forward pass and loss. bf16 on CUDA
  when ``trainer.amp`` is on; none elsewhere (``AUTOCAST_DEVICES``). A CPU without bf16 instructions would
  emulate it, and the tests use it there on purpose, by adding ``"cpu"`` to ``AUTOCAST_DEVICES``.
* :func:`scoring_precision`: every number a run reports (test passes, the BN update of an averaged model) is
  computed in float32, whatever the training precision: a logit rounded to bf16 moves NLL, ECE and even
  predictions by as much as the differences the paper's tables compare (issue 31: 12 of 800 ImageNet
  predictions changed), and the analyses, which score in float32 too, would disagree with ``metrics.json``.
* :func:`deterministic`: ``run.deterministic``, what makes a GPU run repeat itself bit for bit (cuDNN's
  deterministic algorithms, torch's deterministic algorithms, a fixed cuBLAS workspace), so that a resumed
  run ends with the weights of one that ran straight through. It changes nothing on a CPU, whose kernels are
  deterministic already.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

# Device types on which trainer.amp turns bf16 autocast on for training steps.
AUTOCAST_DEVICES: tuple[str, ...] = ("cuda",)
# cuBLAS reuses one workspace per stream only with this setting; torch refuses deterministic matmuls without it.
CUBLAS_WORKSPACE = ":4096:8"


def training_autocast(device: torch.device, amp: bool):
    """The autocast context of a training step: bf16 on ``AUTOCAST_DEVICES`` when ``amp``, else a no-op."""
    if amp and device.type in AUTOCAST_DEVICES:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def scoring_precision(device: torch.device):
    """Float32 for what is scored (test passes, BN updates), even inside a caller's autocast region."""
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def deterministic(device: torch.device, enabled: bool) -> Iterator[None]:
    """While the block runs on a CUDA ``device``: with ``enabled``, cuDNN's deterministic algorithms (no
    autotuning), ``torch.use_deterministic_algorithms(True, warn_only=True)`` and ``CUBLAS_WORKSPACE_CONFIG``;
    without it, cuDNN autotuning (``cudnn.benchmark``), the fastest and not repeatable. Previous settings are
    restored afterwards. On other devices nothing changes.

    What it costs (``run.deterministic``, conf/run/default.yaml): cuDNN may not pick its fastest convolution and
    no autotuning runs, and some kernels (scatter-adds, index-adds) take slower deterministic paths; an op that has
    no deterministic CUDA kernel (the backward of adaptive average pooling, which timm's ImageNet models use)
    warns once and stays nondeterministic. ``bench/models.py --nondeterministic`` measures the difference.
    ``CUBLAS_WORKSPACE_CONFIG`` must be set before the process's first cuBLAS call to take effect; swalab sets it
    here, before training, unless it is set already.
    """
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = (cudnn.deterministic, cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    cudnn.deterministic, cudnn.benchmark = enabled, not enabled
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = before[0], before[1]
        torch.use_deterministic_algorithms(before[2], warn_only=before[3])
