"""Stochastic Weight Averaging (Izmailov et al., UAI 2018).

Train with the usual schedule until ``swa_start``, then keep a high constant or cyclic learning
rate and average the weights the iterates pass through. The average lives in torch's
``AveragedModel`` (multi-tensor running mean, ``n_averaged`` kept as a buffer), so only the
capture rule and the schedules are written here.

When to use which phase schedule (``phase``):

* ``constant`` (the paper's default for VGG / PreResNet / WRN): lr ``swa_lr``, a capture at the
  end of every ``c_epochs``-th epoch from ``swa_start``, exactly the reference code's rule
  ``(e + 1) >= swa_start and (e + 1 - swa_start) % c_epochs == 0``.
* ``cyclic`` (PyramidNet, ImageNet): per-iteration sawtooth from ``swa_lr`` down to
  ``swa_lr_min`` over ``cycle`` epochs; a capture at the end of each cycle (lr minimum).
* ``swalr``: torch's ``SWALR`` anneal from the lr in force to ``swa_lr`` over ``anneal_epochs``,
  then constant; captures as for ``constant``. A different recipe from the paper's.
* ``shake_shake``: the paper's 100-epoch cosine cycle for Shake-Shake; a capture at the end of
  each 100-epoch cycle.

What goes wrong without care: the average's BatchNorm statistics are stale (they belong to no
single iterate). They are recomputed with one pass over the training data (``update_bn``
semantics) on the *average's own copy*, before it is scored or saved, so the live model's
statistics are never touched.

Before ``swa_start`` the lr follows ``pre_schedule``: ``reference`` is the reference code's
schedule (the paper's SGD shape over ``swa_start`` epochs ending at ``swa_lr``); ``base`` keeps
the base schedule untouched, i.e. SWA branches off the SGD run "without modifying the learning
rate schedule" (paper section 4.1).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch.optim.swa_utils import AveragedModel, get_swa_multi_avg_fn

from swalab import faults
from swalab.evaluate import CachedProbs, ModelPredictor, Predictor, metrics_from_probs
from swalab.methods.base import Method, TrainContext
from swalab.schedules import PaperSGD, Schedule, cyclic_swa_lr, shake_shake_swa_lr, swalr_lr

PHASES = ("constant", "cyclic", "swalr", "shake_shake")


class SWA(Method):
    name = "swa"

    def __init__(self, schedule: Schedule, swa_start: int, swa_lr: float, phase: str = "constant",
                 swa_lr_min: float | None = None, cycle: float = 1, c_epochs: int = 1,
                 anneal_epochs: int = 5, anneal_strategy: str = "cos", pre_schedule: str = "reference",
                 bn_update: bool = True, eval_every: int = 0, budget: float = 1.0, name: str | None = None,
                 budget_epochs: int | None = None, eval_at_budgets: Sequence[float] = ()):
        super().__init__(schedule, budget, name)
        self.swa_start, self.swa_lr, self.phase = int(swa_start), float(swa_lr), phase
        self.swa_lr_min, self.cycle, self.c_epochs = swa_lr_min, cycle, int(c_epochs)
        self.anneal_epochs, self.anneal_strategy = anneal_epochs, anneal_strategy
        self.pre_schedule_name, self.bn_update, self.eval_every = pre_schedule, bn_update, int(eval_every)
        self.budget_epochs, self.eval_at_budgets = budget_epochs, list(eval_at_budgets or [])
        self.pre_schedule = (PaperSGD(lr=schedule.lr, horizon=max(self.swa_start, 1), final_lr=self.swa_lr)
                             if pre_schedule == "reference" else schedule)
        self.averaged: AveragedModel | None = None
        self.budget_probs: dict[str, torch.Tensor] = {}
        self._steps_per_epoch = 1

    # -- checks ------------------------------------------------------------------------
    def validate(self, epochs: int, initialized: bool) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"method.phase={self.phase!r} is not one of {PHASES}")
        if self.pre_schedule_name not in ("reference", "base"):
            raise ValueError(f"method.pre_schedule={self.pre_schedule_name!r} must be 'reference' or 'base'")
        if not 0 <= self.swa_start < epochs:
            raise ValueError(f"method.swa_start={self.swa_start} must be in [0, trainer.epochs={epochs}): "
                             "SWA needs epochs after swa_start to average")
        if not self.swa_lr > 0:
            raise ValueError(f"method.swa_lr must be > 0, got {self.swa_lr}")
        if self.c_epochs < 1:
            raise ValueError(f"method.c_epochs must be >= 1, got {self.c_epochs}")
        if self.phase in ("constant", "swalr") and self.swa_start == 0 and self.c_epochs > epochs:
            raise ValueError(f"method.c_epochs={self.c_epochs} with method.swa_start=0 captures first after epoch "
                             f"{self.c_epochs}, beyond trainer.epochs={epochs}: no model to average")
        if self.phase == "cyclic":
            if self.swa_lr_min is None or not 0 < self.swa_lr_min <= self.swa_lr:
                raise ValueError(f"method.swa_lr_min must be in (0, method.swa_lr={self.swa_lr}] for a cyclic "
                                 f"schedule, got {self.swa_lr_min}")
            if not self.cycle > 0:
                raise ValueError(f"method.cycle must be > 0 epochs, got {self.cycle}")
            if self.cycle > epochs - self.swa_start:
                raise ValueError(f"method.cycle={self.cycle} epochs is longer than the {epochs - self.swa_start} "
                                 "epochs after method.swa_start: the schedule leaves no model to average")
        if self.phase == "shake_shake" and epochs - self.swa_start < 100:
            raise ValueError("phase=shake_shake captures once per 100-epoch cycle: trainer.epochs - "
                             f"method.swa_start = {epochs - self.swa_start} leaves no model to average")
        for b in self.eval_at_budgets:
            mark = self._budget_epoch(b)
            if not self.swa_start < mark <= epochs:
                raise ValueError(f"method.eval_at_budgets: budget {b} is epoch {mark}, outside (swa_start="
                                 f"{self.swa_start}, trainer.epochs={epochs}]")

    def last_branch_epoch(self, epochs: int) -> int:
        """A constant/swalr phase captures first after epoch ``swa_start`` (after ``c_epochs`` when it is 0),
        so a branch must start one epoch earlier; cyclic and Shake-Shake phases capture within later epochs."""
        if self.phase in ("cyclic", "shake_shake"):
            return self.swa_start
        return (self.swa_start if self.swa_start > 0 else self.c_epochs) - 1

    def _budget_epoch(self, budget: float) -> int:
        if self.budget_epochs is None:
            raise ValueError("method.eval_at_budgets needs method.budget_epochs (the model's budget B in epochs)")
        return int(round(budget * self.budget_epochs))

    # -- learning rate -----------------------------------------------------------------
    def cycle_iterations(self, steps_per_epoch: int) -> int:
        return max(1, int(round(self.cycle * steps_per_epoch)))

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        if epoch < self.swa_start:
            return self.pre_schedule.at(epoch, step, steps_per_epoch)
        if self.phase == "cyclic":
            i = (epoch - self.swa_start) * steps_per_epoch + step + 1
            return cyclic_swa_lr(i, self.swa_lr, self.swa_lr_min, self.cycle_iterations(steps_per_epoch))
        if self.phase == "swalr":
            lr_prev = self.pre_schedule(float(self.swa_start - 1)) if self.swa_start > 0 else self.schedule.lr
            return swalr_lr(epoch - self.swa_start, self.swa_lr, lr_prev, self.anneal_epochs, self.anneal_strategy)
        if self.phase == "shake_shake":
            return shake_shake_swa_lr(epoch - self.swa_start)
        return self.swa_lr

    # -- hooks -------------------------------------------------------------------------
    def on_train_start(self, ctx: TrainContext) -> None:
        self._steps_per_epoch = ctx.steps_per_epoch
        self.averaged = AveragedModel(ctx.model, multi_avg_fn=get_swa_multi_avg_fn())

    def capture(self, ctx: TrainContext) -> None:
        self.averaged.update_parameters(ctx.model)
        faults.hit("swa_average")  # test-only kill point (swalab.faults)

    @property
    def n_averaged(self) -> int:
        return 0 if self.averaged is None else int(self.averaged.n_averaged)

    def on_step_end(self, ctx: TrainContext, epoch: int, step: int) -> None:
        if self.phase == "cyclic" and epoch >= self.swa_start:
            i = (epoch - self.swa_start) * ctx.steps_per_epoch + step + 1
            if i % self.cycle_iterations(ctx.steps_per_epoch) == 0:
                self.capture(ctx)

    def on_epoch_end(self, ctx: TrainContext, epoch: int) -> None:
        done = epoch + 1
        if self.phase in ("constant", "swalr"):
            if done >= self.swa_start and (done - self.swa_start) % self.c_epochs == 0:
                self.capture(ctx)
        elif self.phase == "shake_shake":
            if done > self.swa_start and (done - self.swa_start) % 100 == 0:
                self.capture(ctx)
        scored = False
        for b in self.eval_at_budgets:
            if done == self._budget_epoch(b) and self.n_averaged:
                self.budget_probs[f"swa@{b:g}"] = ctx.test_probs(self.averaged_for_eval(ctx))
                scored = True
        if self.eval_every and done % self.eval_every == 0 and self.n_averaged and not scored:
            metrics = metrics_from_probs(ctx.test_probs(self.averaged_for_eval(ctx)), ctx.test_labels)
            ctx.log({f"swa_test_{k}": v for k, v in metrics.items()})

    def averaged_for_eval(self, ctx: TrainContext) -> torch.nn.Module:
        """The average, with BatchNorm statistics recomputed on the training data (its own copy)."""
        if self.n_averaged == 0:
            raise RuntimeError("SWA has averaged no model yet: check method.swa_start and trainer.epochs")
        if self.bn_update:
            ctx.update_bn(self.averaged.module)
        return self.averaged.module

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        swa_model = self.averaged_for_eval(ctx)
        out: dict[str, Predictor] = {name: CachedProbs(p) for name, p in self.budget_probs.items()}
        out["swa"] = ModelPredictor(swa_model, ctx.device, ctx.amp)
        out["sgd"] = ModelPredictor(ctx.model, ctx.device, ctx.amp)
        return out

    def extra_metrics(self, ctx: TrainContext, labels: torch.Tensor) -> dict[str, dict]:
        return {"swa": {"n_averaged": self.n_averaged}}

    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"swa": copy.deepcopy(self.averaged.module.state_dict())} if self.averaged is not None else {}

    # -- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"averaged": self.averaged.state_dict() if self.averaged is not None else None,
                "budget_probs": self.budget_probs}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if state.get("averaged") is not None:
            self.averaged.load_state_dict(state["averaged"])
        self.budget_probs = dict(state.get("budget_probs", {}))
