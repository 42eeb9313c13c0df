"""One optimizer step of the training loop, and what the loop does when its loss is not finite.

:class:`TrainingStep` owns what happens between a batch and updated weights: the forward pass and loss under the
run's training autocast (``trainer.precision``; ``swalab.precision``), the backward pass over ``trainer.accumulate``
micro-batches, gradient clipping (``trainer.clip_grad_norm``), the fp16 loss scaler and the optimizer's update. The
loop (``swalab.trainer``) calls it eagerly, or replays it from a CUDA graph (``swalab.graphed``), which captures
:meth:`TrainingStep.whole`.

A NaN or Inf loss: with ``trainer.nonfinite=stop`` (the default) the loop records the first bad step on the device and
reads it once per epoch (:func:`first_bad_step`), then stops with :class:`NonFiniteLossError`; with ``skip`` it reads
the loss every step and drops the bad ones (:func:`skip_nonfinite`), up to ``trainer.max_skips``. Under data
parallelism every rank takes the same decision (``swalab.distributed.agree``)."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from swalab import distributed
from swalab.losses import TrainingLoss
from swalab.precision import grad_scaler, training_autocast


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss; the last good checkpoint and the history are kept."""


class TrainingStep:
    """Forward, loss, backward and update for one batch (module doc). ``model`` is the bare network (its parameters
    are clipped); ``forward_model`` what the batch goes through (the same, or its DDP or compiled wrapper)."""

    def __init__(self, model: nn.Module, forward_model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss: TrainingLoss, device: torch.device, precision: str, accumulate: int = 1,
                 clip_grad_norm: float | None = None):
        self.model, self.forward_model, self.optimizer, self.loss = model, forward_model, optimizer, loss
        self.device, self.precision, self.accumulate, self.clip_grad_norm = device, precision, accumulate, clip_grad_norm
        self.scaler = grad_scaler(device, precision)  # fp16 only

    def forward_backward(self, x: torch.Tensor, target: torch.Tensor,
                         autocast_cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's loss (detached: the mean over the batch) and its count of right predictions, with the gradients
        of the whole batch accumulated: in ``accumulate`` micro-batches, each loss weighted by its share of the batch
        (so that the gradient is the batch mean's, up to float order), all but the last without the data-parallel
        gradient all-reduce. Under fp16 the loss is scaled before backward (:meth:`update` unscales).
        ``autocast_cache=False`` for a step captured as a CUDA graph: autocast's cache of cast weights must not
        outlive the capture (the same casts, recomputed; the same numbers)."""
        chunks = list(zip(x.chunk(self.accumulate), target.chunk(self.accumulate)))
        total, correct = None, None
        for i, (xi, ti) in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.forward_model, "no_sync") \
                else self.forward_model.no_sync()
            with sync:
                with training_autocast(self.device, self.precision, cache=autocast_cache):
                    out = self.forward_model(xi)
                    loss = self.loss(out, ti)
                weighted = loss if len(chunks) == 1 else loss * (len(xi) / len(x))
                (weighted if self.scaler is None else self.scaler.scale(weighted)).backward()
            total = weighted.detach() if total is None else total + weighted.detach()
            right = self.loss.correct(out, ti)
            correct = right if correct is None else correct + right
        return total, correct

    def update(self) -> None:
        """The optimizer's update, after clipping the gradients' global norm (``trainer.clip_grad_norm``); under fp16
        the scaler unscales first and skips the update when the gradients overflowed (``precision.grad_scaler``)."""
        if self.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def whole(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero the gradients, forward, loss, backward, update: the step a CUDA graph captures."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, correct = self.forward_backward(x, target, autocast_cache=False)
        self.update()
        return loss, correct


def skip_nonfinite(loss: torch.Tensor, epoch: int, step: int, skips: int, max_skips: int, data_parallel: bool,
                   main: bool, kept: Callable[[], str]) -> bool:
    """With ``trainer.nonfinite=skip``: whether to drop this step, because its loss is not finite here or on any other
    rank (a rank that skipped alone would leave the others' gradient all-reduce waiting). Reads the loss every step
    (a host sync), which ``stop`` spares by checking once per epoch (:func:`first_bad_step`). ``kept()``: what the run
    keeps when it stops, for the message (asked only then)."""
    bad = not bool(torch.isfinite(loss.detach()))
    if data_parallel:
        bad = distributed.agree_any(bad)
    if not bad:
        return False
    if skips >= max_skips:
        raise NonFiniteLossError(f"non-finite loss at epoch {epoch + 1}, step {step + 1}, after {skips} skipped steps "
                                 f"(trainer.max_skips={max_skips}); {kept()}")
    if main:
        warnings.warn(f"non-finite loss at epoch {epoch + 1}, step {step + 1}: step skipped", RuntimeWarning)
    return True


def first_bad_step(bad_step: torch.Tensor, data_parallel: bool) -> int | None:
    """The first step of the epoch whose loss was not finite on any rank, or None (``bad_step``: -1 or that step, kept
    on the device; one read per epoch). Under data parallelism every rank names the same step and stops there."""
    first = int(bad_step)
    if data_parallel:
        never = 2**62
        first = distributed.agree(first if first >= 0 else never, "min")
        first = -1 if first == never else first
    return first if first >= 0 else None


@dataclass
class EpochTally:
    """The running sums of one epoch's training steps (what a mid-epoch checkpoint carries as ``partial``)."""

    t0: float
    loss_sum: torch.Tensor
    correct: torch.Tensor
    seen: int
    skips: int
    lr: float

    def accuracy(self) -> float:
        return 100.0 * float(self.correct) / max(self.seen, 1)

    def partial(self) -> dict:
        return {"loss_sum": float(self.loss_sum), "correct": float(self.correct), "seen": self.seen,
                "skips": self.skips, "seconds": time.perf_counter() - self.t0}
