"""Stochastic Weight Averaging (Izmailov et al., UAI 2018).

Train with the usual schedule until ``swa_start``, then keep a high constant or cyclic learning
rate and average the weights the iterates pass through. The average lives in torch's
``AveragedModel`` (multi-tensor running mean, ``n_averaged`` kept as a buffer), so only the
capture rule and the schedules are written here.

When to use which phase schedule (``phase``):

* ``constant`` (the paper's default for VGG / PreResNet / WRN): lr ``swa_lr``, a capture at the
  end of every ``capture_every``-th epoch from ``swa_start``, exactly the reference code's rule
  ``(e + 1) >= swa_start and (e + 1 - swa_start) % capture_every == 0``.
* ``cyclic`` (PyramidNet, ImageNet): per-iteration sawtooth from ``swa_lr`` down to
  ``swa_lr_min`` over ``cycle_epochs`` epochs; a capture at the end of each cycle (lr minimum).
* ``swalr``: torch's ``SWALR`` anneal from the lr in force to ``swa_lr`` over ``anneal_epochs``,
  then constant; captures as for ``constant``. A different recipe from the paper's.
* ``shake_shake``: the paper's 100-epoch cosine cycle for Shake-Shake; a capture at the end of
  each 100-epoch cycle.

What goes wrong without care: the average's BatchNorm statistics are stale (they belong to no
single iterate). They are recomputed with one pass over the training data (``update_bn``
semantics) on the *average's own copy*, before it is scored or saved, so the live model's
statistics are never touched.

``swa_start`` is the epoch averaging starts: the config gives it as a fraction of the budget B
(``model.swa.start``, 0.805 of B = 200 is the reference's epoch 161), so a short run scales it, or
as an exact epoch (``model.swa.start_epoch``).

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
from swalab.config import ConfigError, require
from swalab.evaluate import CachedLogProbs, ModelPredictor, Predictor, log_of, metrics_from_log_probs
from swalab.methods.base import Method, TrainContext, check_pre_schedule
from swalab.schedules import PaperSGD, Schedule, cyclic_swa_lr, shake_shake_swa_lr, swalr_lr

PHASES = ("constant", "cyclic", "swalr", "shake_shake")


def budget_predictor(budget: float) -> str:
    """The name of the average scored at ``budget`` budgets (``swa@1.25``); its budget and epoch are in its metrics."""
    return f"swa@{budget:g}"


class SWA(Method):
    name = "swa"
    scoring_settings = ("score_every", "score_at_budgets")

    def __init__(self, schedule: Schedule, epochs: int, swa_lr: float, swa_start: float | None = None,
                 swa_start_epoch: int | None = None, phase: str = "constant", swa_lr_min: float | None = None,
                 cycle_epochs: float = 1, capture_every: int = 1, anneal_epochs: int = 5,
                 anneal_strategy: str = "cos", pre_schedule: str = "reference", bn_update: bool = True,
                 score_every: int = 0, score_at_budgets: Sequence[float] = (), budget: float = 1.0,
                 name: str | None = None):
        super().__init__(schedule, epochs, budget, name)
        require("method.swa_start", swa_start, "number?", 0)
        require("method.swa_start_epoch", swa_start_epoch, "int?", 0)
        if swa_start is None and swa_start_epoch is None:
            raise ConfigError("SWA needs a start: set model.swa.start (a fraction of the budget B) or "
                              "model.swa.start_epoch (an exact epoch)")
        self.start_fraction = None if swa_start_epoch is not None else swa_start
        self.swa_start = swa_start_epoch if swa_start_epoch is not None else self.epoch_of(swa_start)
        self.swa_lr = float(require("method.swa_lr", swa_lr, "number", 0, low_open=True))
        self.phase = phase
        self.swa_lr_min = require("method.swa_lr_min", swa_lr_min, "number?", 0, low_open=True)
        self.cycle = require("method.cycle_epochs", cycle_epochs, "number", 0, low_open=True)
        self.c_epochs = require("method.capture_every", capture_every, "int", 1)
        self.anneal_epochs = require("method.anneal_epochs", anneal_epochs, "int", 0)
        self.anneal_strategy = anneal_strategy
        self.pre_schedule_name, self.bn_update = pre_schedule, bn_update
        self.eval_every = require("method.score_every", score_every, "int", 0)
        for b in score_at_budgets or ():
            require("method.score_at_budgets[]", b, "number", 0, low_open=True)
        self.eval_at_budgets = [float(b) for b in score_at_budgets or ()]
        self.pre_schedule = (PaperSGD(lr=schedule.lr, horizon=max(self.swa_start, 1), final_lr=self.swa_lr)
                             if pre_schedule == "reference" else schedule)
        self.averaged: AveragedModel | None = None
        self.budget_log_probs: dict[str, torch.Tensor] = {}

    # -- checks ------------------------------------------------------------------------
    def validate(self, initialized: bool) -> None:
        super().validate(initialized)
        epochs = self.epochs
        if self.phase not in PHASES:
            raise ConfigError(f"method.phase={self.phase!r} is not one of {PHASES}")
        check_pre_schedule(self.pre_schedule_name, self.schedule, "swa")
        if self.anneal_strategy not in ("cos", "linear"):
            raise ConfigError(f"method.anneal_strategy={self.anneal_strategy!r} must be 'cos' or 'linear'")
        if not 0 <= self.swa_start < epochs:
            how = ("method.swa_start_epoch" if self.start_fraction is None else
                   f"method.swa_start={self.start_fraction:g} of B={self.budget_epochs:g}")
            raise ConfigError(f"SWA would start averaging at epoch {self.swa_start} ({how}) but the run has "
                              f"trainer.epochs={epochs}: set model.swa.start, a fraction of the budget below "
                              f"method.budget={self.budget:g}, or model.swa.start_epoch below {epochs}")
        if self.phase in ("constant", "swalr") and self.swa_start == 0 and self.c_epochs > epochs:
            raise ConfigError(f"method.capture_every={self.c_epochs} with averaging from epoch 0 captures first after "
                              f"epoch {self.c_epochs}, beyond trainer.epochs={epochs}: no model to average")
        if self.phase == "cyclic":
            if self.swa_lr_min is None or not self.swa_lr_min <= self.swa_lr:
                raise ConfigError(f"model.swa.lr_min must be in (0, model.swa.lr={self.swa_lr}] for a cyclic "
                                  f"schedule, got {self.swa_lr_min}")
            if self.cycle > epochs - self.swa_start:
                raise ConfigError(f"model.swa.cycle_epochs={self.cycle} is longer than the {epochs - self.swa_start} "
                                  "epochs after the averaging starts: the schedule leaves no model to average")
        if self.phase == "shake_shake" and epochs - self.swa_start < 100:
            raise ConfigError("phase=shake_shake captures once per 100-epoch cycle: the run leaves "
                              f"{epochs - self.swa_start} epochs after the averaging starts, no model to average")
        for b in self.eval_at_budgets:
            mark = self.epoch_of(b)
            if not self.swa_start < mark <= epochs:
                raise ConfigError(f"model.swa.score_at_budgets: budget {b:g} is epoch {mark}, outside (start="
                                  f"{self.swa_start}, trainer.epochs={epochs}]")

    def last_branch_epoch(self) -> int:
        """A constant/swalr phase captures first after epoch ``swa_start`` (after ``capture_every`` when it is 0),
        so a branch must start one epoch earlier; cyclic and Shake-Shake phases capture within later epochs."""
        if self.phase in ("cyclic", "shake_shake"):
            return self.swa_start
        return (self.swa_start if self.swa_start > 0 else self.c_epochs) - 1

    def describe(self, predictor: str) -> dict[str, float]:
        for b in self.eval_at_budgets:
            if predictor == budget_predictor(b):
                return {"budget": b, "epoch": self.epoch_of(b)}
        return super().describe(predictor)

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
        scored = None  # the average's test log-probabilities, when this epoch end scores it
        for b in self.eval_at_budgets:
            if done == self.epoch_of(b) and self.n_averaged:
                scored = self.budget_log_probs[budget_predictor(b)] = ctx.test_log_probs(self.averaged_for_eval(ctx))
        if self.eval_every and done % self.eval_every == 0 and self.n_averaged:
            if scored is None:  # a budget mark's scoring serves the epoch's line too
                scored = ctx.test_log_probs(self.averaged_for_eval(ctx))
            metrics = metrics_from_log_probs(scored, ctx.test_labels)
            ctx.log({f"swa_test_{k}": v for k, v in metrics.items()})

    def averaged_for_eval(self, ctx: TrainContext) -> torch.nn.Module:
        """The average, with BatchNorm statistics recomputed on the training data (its own copy)."""
        if self.n_averaged == 0:
            raise RuntimeError("SWA has averaged no model yet: check model.swa.start and trainer.epochs")
        if self.bn_update:
            ctx.update_bn(self.averaged.module)
        return self.averaged.module

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        swa_model = self.averaged_for_eval(ctx)
        out: dict[str, Predictor] = {name: CachedLogProbs(p) for name, p in self.budget_log_probs.items()}
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
                "budget_log_probs": self.budget_log_probs}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if state.get("averaged") is not None:
            self.averaged.load_state_dict(state["averaged"])
        self.budget_log_probs = dict(state.get("budget_log_probs", {}))
        self.budget_log_probs.update({k: log_of(p) for k, p in state.get("budget_probs", {}).items()})  # older files
