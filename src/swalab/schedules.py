"""Learning-rate schedules as pure functions of training progress.

Every formula here is the paper's (Izmailov et al. 2018, section 3 and its appendix) or its reference code's
(``schedule(epoch)`` of the authors' ``train.py``, FGE's cyclic lr, Shake-Shake's cosine cycle), and is tested
alone against a transcription of it. Two layers:

* plain functions (``paper_sgd_factor``, ``cyclic_swa_lr``, ``fge_cyclic_lr`` ...) that take
  numbers and return numbers, one per formula;
* small callable schedule objects (``PaperSGD``, ``Constant``, ``Cosine`` ...) that Hydra
  instantiates from ``conf/schedule/*.yaml``. Each maps a (fractional) epoch to a learning
  rate and says whether it changes within an epoch (``per_iteration``).

Methods combine a base schedule with their own phase (SWA's constant or cyclic phase, FGE's
triangular cycles); the trainer only ever asks a method for "the learning rate of step s of
epoch e"."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from swalab.config import require


# ----------------------------------------------------------------------------- formulas


def paper_sgd_factor(t: float, final_ratio: float) -> float:
    """Conventional SGD schedule of the paper (appendix), as a multiple of the initial lr.

    ``t`` is training progress in [0, 1]: factor 1 up to t = 0.5, a linear decay to
    ``final_ratio`` between t = 0.5 and 0.9, then ``final_ratio`` to the end. With
    ``final_ratio = swa_lr / lr_init`` this is also the reference code's pre-SWA schedule."""
    if t <= 0.5:
        return 1.0
    if t <= 0.9:
        return 1.0 - (1.0 - final_ratio) * (t - 0.5) / 0.4
    return final_ratio


def cyclic_swa_lr(iteration: int, a1: float, a2: float, cycle: int) -> float:
    """The paper's cyclic SWA schedule (section 3.1), per iteration ``i = 1, 2, ...``.

    ``a(i) = (1 - t(i)) a1 + t(i) a2`` with ``t(i) = (mod(i - 1, c) + 1) / c``: a sawtooth
    that decays linearly from near ``a1`` to exactly ``a2`` at the end of each cycle and then
    jumps back. Models are captured where ``mod(i, c) == 0`` (the lr minimum)."""
    if iteration < 1:
        raise ValueError(f"cyclic_swa_lr counts iterations from 1, got {iteration}")
    t = ((iteration - 1) % cycle + 1) / cycle
    return (1.0 - t) * a1 + t * a2


def fge_cyclic_lr(epoch: int, iter_fraction: float, a1: float, a2: float, cycle: int) -> float:
    """FGE's triangular cyclic learning rate (Garipov et al. 2018), per iteration.

    ``t = ((epoch % c) + iter_fraction) / c``; the lr goes linearly ``a1 -> a2`` over the first
    half of a cycle and ``a2 -> a1`` over the second. ``iter_fraction`` is the position in the
    epoch in [0, 1)."""
    t = ((epoch % cycle) + iter_fraction) / cycle
    if t < 0.5:
        return a1 * (1.0 - 2.0 * t) + a2 * 2.0 * t
    return a1 * (2.0 * t - 1.0) + a2 * (2.0 - 2.0 * t)


def cosine_lr(t: float, lr: float, lr_min: float = 0.0) -> float:
    """Cosine annealing from ``lr`` at t = 0 to ``lr_min`` at t = 1 (Loshchilov & Hutter)."""
    t = min(max(t, 0.0), 1.0)
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos(math.pi * t))


def piecewise_lr(epoch: float, lr: float, milestones: Sequence[float], gamma: float) -> float:
    """Step decay: ``lr * gamma**k`` where k milestones (in epochs) have been passed."""
    return lr * gamma ** sum(1 for m in milestones if epoch >= m)


def shake_shake_swa_lr(epoch: int) -> float:
    """The paper's SWA schedule for Shake-Shake (appendix), a 100-epoch cosine cycle.

    ``a(i) = 0.1 (1 + cos(pi (1600 + epoch mod 100) / 1800))``: the tail of the 1800-epoch
    cosine schedule from epoch 1600, repeated every 100 epochs."""
    return 0.1 * (1.0 + math.cos(math.pi * (1600 + epoch % 100) / 1800))


def swalr_lr(step: int, swa_lr: float, lr_prev: float, anneal_epochs: int, strategy: str = "cos") -> float:
    """torch's ``SWALR`` rule: anneal from the lr in force to ``swa_lr`` over ``anneal_epochs``.

    ``lr = swa_lr a(t) + lr_prev (1 - a(t))``, ``t = min(1, step / anneal_epochs)``, with
    ``a(t) = t`` ("linear") or ``(1 - cos(pi t)) / 2`` ("cos"). ``step`` counts epochs since
    SWA started, from 0. This is torch's recipe, offered as an option next to the paper's."""
    if strategy not in ("cos", "linear"):
        raise ValueError(f"SWALR anneal strategy must be 'cos' or 'linear', got {strategy!r}")
    t = 1.0 if anneal_epochs <= 0 else min(1.0, step / anneal_epochs)
    alpha = t if strategy == "linear" else (1.0 - math.cos(math.pi * t)) / 2.0
    return swa_lr * alpha + lr_prev * (1.0 - alpha)


def warmup_factor(epoch: int, step: int, steps_per_epoch: int, warmup_epochs: float) -> float:
    """Linear warmup, per optimizer step, as a multiple of the lr in force: ``k / W`` at step ``k = 1 .. W`` of the
    run (``W = warmup_epochs x steps_per_epoch``, rounded up), then 1. The first step trains at ``lr / W``, never at
    0; ``warmup_epochs = 0`` is no warmup. It multiplies whatever lr the method asks for (the base schedule, SWA's
    or FGE's pre-schedule, an SWA phase that starts at epoch 0), so it composes with every schedule."""
    warmup_steps = math.ceil(warmup_epochs * steps_per_epoch)
    done = epoch * steps_per_epoch + step + 1  # optimizer steps taken once this one is
    return 1.0 if done >= warmup_steps else done / warmup_steps


# ----------------------------------------------------------------------------- schedule objects


@dataclass
class Schedule(ABC):
    """A learning rate as a function of fractional epoch (``epoch + step / steps_per_epoch``).

    ``per_iteration = False`` schedules are evaluated at the integer epoch only, as in the
    reference code, which sets the lr once at the start of each epoch."""

    lr: float
    per_iteration: bool = False
    warmup_epochs: float = 0.0  # linear warmup over the run's first epochs (:func:`warmup_factor`), applied by the method

    def __post_init__(self) -> None:
        require("schedule.lr", self.lr, "number", 0, low_open=True)
        require("schedule.per_iteration", self.per_iteration, "bool")
        require("schedule.warmup_epochs", self.warmup_epochs, "number", 0)

    @abstractmethod
    def __call__(self, epoch: float) -> float:
        """The learning rate at fractional ``epoch``."""

    def at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The lr for optimizer step ``step`` (0-based) of epoch ``epoch`` (0-based)."""
        return self(epoch + step / steps_per_epoch if self.per_iteration else float(epoch))


@dataclass
class Constant(Schedule):
    """The same lr throughout (the paper's Fig. 7 'constant lr from scratch' runs)."""

    def __call__(self, epoch: float) -> float:
        return self.lr


@dataclass
class PaperSGD(Schedule):
    """The paper's conventional SGD schedule over ``horizon`` epochs (appendix).

    ``final_lr`` defaults to ``0.01 * lr``. Used as SWA's pre-averaging schedule with
    ``horizon = swa_start`` and ``final_lr = swa_lr`` (reference code)."""

    horizon: float = 1.0
    final_lr: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require("schedule.horizon", self.horizon, "number", 0, low_open=True)
        require("schedule.final_lr", self.final_lr, "number?", 0, low_open=True)

    def __call__(self, epoch: float) -> float:
        final = 0.01 * self.lr if self.final_lr is None else self.final_lr
        return self.lr * paper_sgd_factor(epoch / self.horizon, final / self.lr)


@dataclass
class Cosine(Schedule):
    """Cosine annealing over ``horizon`` epochs (Shake-Shake's SGD schedule)."""

    horizon: float = 1.0
    lr_min: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require("schedule.horizon", self.horizon, "number", 0, low_open=True)
        require("schedule.lr_min", self.lr_min, "number", 0)

    def __call__(self, epoch: float) -> float:
        return cosine_lr(epoch / self.horizon, self.lr, self.lr_min)


@dataclass
class Piecewise(Schedule):
    """Step decay at ``milestones`` given as fractions of ``horizon`` (PyramidNet: 0.5, 0.75)."""

    horizon: float = 1.0
    milestones: Sequence[float] = (0.5, 0.75)
    gamma: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        require("schedule.horizon", self.horizon, "number", 0, low_open=True)
        require("schedule.gamma", self.gamma, "number", 0, low_open=True)

    def __call__(self, epoch: float) -> float:
        return piecewise_lr(epoch, self.lr, [m * self.horizon for m in self.milestones], self.gamma)
