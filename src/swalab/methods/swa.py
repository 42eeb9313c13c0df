"""Stochastic Weight Averaging (Izmailov et al., UAI 2018).

Train with the usual schedule until epoch ``start_epoch``, then keep a high constant or cyclic learning
rate and average the weights the iterates pass through. The average lives in torch's
``AveragedModel`` (multi-tensor running mean, ``n_averaged`` kept as a buffer), so only the
capture rule and the schedules are written here. Every setting is a ``method.*`` key
(``conf/method/swa.yaml``), read from the model's recipe block ``model.swa`` (``conf/recipe/paper.yaml``).

When to use which phase schedule (``phase``):

* ``constant`` (the paper's default for VGG / PreResNet / WRN): lr ``lr``, a capture at the
  end of every ``capture_every``-th epoch from ``start_epoch``, exactly the reference code's rule
  ``(e + 1) >= start_epoch and (e + 1 - start_epoch) % capture_every == 0``.
* ``cyclic`` (PyramidNet, ImageNet): per-iteration sawtooth from ``lr`` down to ``lr_min`` over
  ``cycle_epochs`` epochs; a capture at the end of each cycle (lr minimum).
* ``swalr``: torch's ``SWALR`` anneal from the lr in force to ``lr`` over ``anneal_epochs``,
  then constant; captures as for ``constant``. A different recipe from the paper's.
* ``shake_shake``: the paper's 100-epoch cosine cycle for Shake-Shake; a capture at the end of
  each 100-epoch cycle.

What goes wrong without care: the average's BatchNorm statistics are stale (they belong to no
single iterate). They are recomputed with one pass over the training data (``update_bn``
semantics) on the *average's own copy*, before it is scored or saved, so the live model's
statistics are never touched.

The start is given as a fraction of the budget B (``start``: 0.805 of B = 200 is the reference's
epoch 161), so a short run scales it, or as an exact epoch (``start_epoch``); either way
``self.start_epoch`` is the epoch averaging starts.

Before it the lr follows ``pre_schedule``: ``reference`` is the reference code's schedule (the
paper's SGD shape over ``start_epoch`` epochs ending at ``lr``); ``base`` keeps the base schedule
untouched, i.e. SWA branches off the SGD run "without modifying the learning rate schedule"
(paper section 4.1)."""

from __future__ import annotations

import copy
import math
from typing import Sequence

import torch
from torch.optim.swa_utils import AveragedModel, get_swa_multi_avg_fn

from swalab import faults
from swalab.checkpoint import CheckpointError
from swalab.config import ConfigError, check_avg_device, require
from swalab.evaluate import CachedLogProbs, ModelPredictor, Predictor, metrics_from_log_probs
from swalab.methods.base import (Method, TrainContext, averages_device, check_pre_schedule,
                                 on_training_device, unread_schedule_keys)
from swalab.rundir import earlier_format
from swalab.schedules import PaperSGD, Schedule, cyclic_swa_lr, shake_shake_swa_lr, swalr_lr

PHASES = ("constant", "cyclic", "swalr", "shake_shake")


def val_file(name: str) -> str:
    """The name, in ``ctx.predictions``, of a budget mark's log-probabilities on the validation split."""
    return f"{name}_val"


def budget_predictor(budget: float) -> str:
    """The name of the average scored at ``budget`` budgets (``swa@1.25``); its budget and epoch are in its metrics."""
    return f"swa@{budget:g}"


class SWA(Method):
    """SWA (module doc). Its arguments are the ``method.*`` keys of ``conf/method/swa.yaml``, which read the model's
    recipe block ``model.swa``: ``lr`` here is ``method.lr`` in every message (named ``model.swa.lr`` where the value
    came from there: ``swalab.train.plan.in_user_keys``)."""

    name = "swa"
    scoring_settings = ("score_every", "score_at_budgets")

    def __init__(self, schedule: Schedule, epochs: int, lr: float, start: float | None = None,
                 start_epoch: int | None = None, phase: str = "constant", lr_min: float | None = None,
                 cycle_epochs: float = 1, capture_every: int = 1, anneal_epochs: int = 5,
                 anneal_strategy: str = "cos", pre_schedule: str = "reference", bn_update: bool = True,
                 score_every: int = 0, score_at_budgets: Sequence[float] = (), budget: float = 1.0,
                 name: str | None = None, avg_device: str = "train"):
        super().__init__(schedule, epochs, budget, name)
        self.avg_device = check_avg_device(avg_device)  # run.avg_device: where the average lives (methods.base.averages_device)
        require("method.start", start, "number?", 0)
        require("method.start_epoch", start_epoch, "int?", 0)
        if start is None and start_epoch is None:
            raise ConfigError("SWA needs a start: set method.start (a fraction of the budget B) or "
                              "method.start_epoch (an exact epoch)")
        self.start = None if start_epoch is not None else start  # the fraction of B, when the start was given so
        self.start_epoch = start_epoch if start_epoch is not None else self.epoch_of(start)  # the epoch averaging starts
        self.lr = float(require("method.lr", lr, "number", 0, low_open=True))
        self.phase = phase
        self.lr_min = require("method.lr_min", lr_min, "number?", 0, low_open=True)
        self.cycle_epochs = require("method.cycle_epochs", cycle_epochs, "number", 0, low_open=True)
        self.capture_every = require("method.capture_every", capture_every, "int", 1)
        self.anneal_epochs = require("method.anneal_epochs", anneal_epochs, "int", 0)
        self.anneal_strategy = anneal_strategy
        self.pre_schedule, self.bn_update = pre_schedule, bn_update
        self.score_every = require("method.score_every", score_every, "int", 0)
        for b in score_at_budgets or ():
            require("method.score_at_budgets[]", b, "number", 0, low_open=True)
        self.score_at_budgets = [float(b) for b in score_at_budgets or ()]
        self.schedule_before_start = (PaperSGD(lr=schedule.lr, horizon=max(self.start_epoch, 1), final_lr=self.lr)
                                      if pre_schedule == "reference" else schedule)
        self.averaged: AveragedModel | None = None
        self.budget_log_probs: dict[str, torch.Tensor] = {}  # the average scored at each budget mark, in ctx.predictions
        self.budget_val_log_probs: dict[str, torch.Tensor] = {}  # the same, on the validation split (if any)

    # -- checks ------------------------------------------------------------------------
    def validate(self, initialized: bool) -> None:
        super().validate(initialized)
        epochs = self.epochs
        if self.phase not in PHASES:
            raise ConfigError(f"method.phase={self.phase!r} is not one of {PHASES}")
        check_pre_schedule(self.pre_schedule, self.schedule, self.name, "method.pre_schedule")
        if self.anneal_strategy not in ("cos", "linear"):
            raise ConfigError(f"method.anneal_strategy={self.anneal_strategy!r} must be 'cos' or 'linear'")
        if not 0 <= self.start_epoch < epochs:
            how = ("method.start_epoch" if self.start is None else
                   f"method.start={self.start:g} of B={self.budget_epochs:g}")
            raise ConfigError(f"SWA would start averaging at epoch {self.start_epoch} ({how}) but the run has "
                              f"trainer.epochs={epochs}: set method.start, a fraction of the budget below "
                              f"method.budget={self.budget:g}, or method.start_epoch below {epochs}")
        if self.phase == "cyclic" and (self.lr_min is None or not self.lr_min <= self.lr):
            raise ConfigError(f"method.lr_min must be in (0, method.lr={self.lr}] for a cyclic "
                              f"schedule, got {self.lr_min}")
        if self.phase == "swalr" and self.anneal_epochs >= epochs - self.start_epoch:
            raise ConfigError(f"method.anneal_epochs={self.anneal_epochs} anneals the lr from epoch {self.start_epoch} "
                              f"on, but trainer.epochs={epochs} ends {epochs - self.start_epoch} epochs later: the lr "
                              f"never reaches method.lr={self.lr:g}. Set method.anneal_epochs below "
                              f"{epochs - self.start_epoch}, start averaging earlier, or lengthen the run")
        self.check_captures(self.captures_by(epochs))
        for b in self.score_at_budgets:
            mark = self.epoch_of(b)
            if not self.start_epoch < mark <= epochs:
                raise ConfigError(f"method.score_at_budgets: budget {b:g} is epoch {mark}, outside (start="
                                  f"{self.start_epoch}, trainer.epochs={epochs}]")
            if self.captures_by(mark) < 2:
                raise ConfigError(f"method.score_at_budgets: budget {b:g} is epoch {mark}, where the average holds "
                                  f"{self.captures_by(mark)} model(s) ({self.spacing()}): no average to score. Give "
                                  "budgets later in the run, or capture more often")

        first = next((done for done in range(1, epochs + 1) if self.captures_by(done)), epochs)
        if self.score_every and not any(done % self.score_every == 0 for done in range(first, epochs + 1)):
            raise ConfigError(f"method.score_every={self.score_every} scores the average every {self.score_every} "
                              f"epochs, but it exists from epoch {first} to trainer.epochs={epochs}: it would never be "
                              f"scored before the end. Set method.score_every to at most {epochs} (0: only at the end)")

    def caveats(self) -> list[str]:
        """Settings of the schedule group that the reference pre-schedule never reads (:func:`unread_schedule_keys`):
        said at launch, not refused, since a grid over methods shares them with an SGD run that reads them."""
        if self.pre_schedule != "reference" or self.start_epoch == 0:
            return []
        return [f"{unread} is not read by method={self.name} with method.pre_schedule=reference (the paper's shape "
                f"from schedule.lr to method.lr over the {self.start_epoch} epochs before averaging): set "
                "method.pre_schedule=base to train with the schedule group as configured"
                for unread in unread_schedule_keys(self.schedule, self.epochs)]

    def validate_steps(self, steps_per_epoch: int) -> None:
        """A cyclic phase captures every ``round(cycle_epochs x steps_per_epoch)`` steps: with the steps known, the
        captures counted before the data were loaded (whole epochs) are counted again exactly."""
        if self.phase == "cyclic":
            self.check_captures(self.captures_by(self.epochs, steps_per_epoch))

    def captures_by(self, done: int, steps_per_epoch: int | None = None) -> int:
        """How many models the average holds after ``done`` epochs (the capture rules of the module doc); a cyclic
        phase's captures counted in whole steps when ``steps_per_epoch`` is given, else in epochs."""
        after = done - self.start_epoch  # epochs of averaging done
        if self.phase in ("constant", "swalr"):
            if self.start_epoch == 0:
                return done // self.capture_every
            return after // self.capture_every + 1 if after >= 0 else 0
        if after <= 0:
            return 0
        if self.phase == "cyclic":
            if steps_per_epoch is None:
                return math.floor(after / self.cycle_epochs + 1e-9)  # 1 // 0.1 is 9.0 in floats
            return after * steps_per_epoch // self.cycle_iterations(steps_per_epoch)
        return after // 100 if self.phase == "shake_shake" else 0

    def spacing(self) -> str:
        """What spaces the captures of this phase, in the keys a user sets (for a message)."""
        where = f"from epoch {self.start_epoch}"
        if self.phase == "cyclic":
            return (f"method.phase=cyclic captures at the end of each cycle of method.cycle_epochs={self.cycle_epochs:g} "
                    "epochs " + where)
        if self.phase == "shake_shake":
            return "method.phase=shake_shake captures once per 100-epoch cycle " + where
        return f"method.phase={self.phase} captures every method.capture_every={self.capture_every} epochs " + where

    def check_captures(self, captured: int) -> None:
        """Refuse a run whose average would hold fewer than two models: one model is its SGD snapshot, reported
        as SWA (every phase alike)."""
        if captured >= 2:
            return
        start = "method.start_epoch" if self.start is None else "method.start"
        set_by = (f"{start}={self.start_epoch}" if self.start is None
                  else f"{start}={self.start:g} of B={self.budget_epochs:g}")
        fix = {"cyclic": "shorten method.cycle_epochs", "shake_shake": None}.get(
            self.phase, "lower method.capture_every")
        models = "1 model" if captured == 1 else f"{captured} models"
        fixes = [*([f"lower {start}"] if self.start_epoch > 0 else []), *([fix] if fix else []),
                 "lengthen the run (trainer.epochs)"]
        fixes = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
        raise ConfigError(f"the SWA average would hold {models} in a run of trainer.epochs={self.epochs}: "
                          f"{self.spacing()} ({set_by}), and an average needs 2 at least (one model is the SGD iterate, "
                          f"not an average). {fixes[0].upper()}{fixes[1:]}")

    def last_branch_epoch(self) -> int:
        """A constant/swalr phase captures first after epoch ``start_epoch`` (after ``capture_every`` when it is 0),
        so a branch must start one epoch earlier; cyclic and Shake-Shake phases capture within later epochs."""
        if self.phase in ("cyclic", "shake_shake"):
            return self.start_epoch
        return (self.start_epoch if self.start_epoch > 0 else self.capture_every) - 1

    def describe(self, predictor: str) -> dict[str, float]:
        for b in self.score_at_budgets:
            if predictor == budget_predictor(b):
                return {"budget": b, "epoch": self.epoch_of(b)}
        return super().describe(predictor)

    # -- learning rate -----------------------------------------------------------------
    def cycle_iterations(self, steps_per_epoch: int) -> int:
        return max(1, int(round(self.cycle_epochs * steps_per_epoch)))

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        if epoch < self.start_epoch:
            return self.schedule_before_start.at(epoch, step, steps_per_epoch)
        if self.phase == "cyclic":
            i = (epoch - self.start_epoch) * steps_per_epoch + step + 1
            return cyclic_swa_lr(i, self.lr, self.lr_min, self.cycle_iterations(steps_per_epoch))
        if self.phase == "swalr":
            lr_prev = (self.schedule_before_start(float(self.start_epoch - 1)) if self.start_epoch > 0
                       else self.schedule.lr)
            return swalr_lr(epoch - self.start_epoch, self.lr, lr_prev, self.anneal_epochs, self.anneal_strategy)
        if self.phase == "shake_shake":
            return shake_shake_swa_lr(epoch - self.start_epoch)
        return self.lr

    # -- hooks -------------------------------------------------------------------------
    def on_train_start(self, ctx: TrainContext) -> None:
        self.averaged = AveragedModel(ctx.model, device=averages_device(self.avg_device, ctx),
                                      multi_avg_fn=get_swa_multi_avg_fn())

    def capture(self, ctx: TrainContext) -> None:
        self.averaged.update_parameters(ctx.model)
        faults.hit("swa_average")  # test-only kill point (swalab.faults)

    @property
    def n_averaged(self) -> int:
        return 0 if self.averaged is None else int(self.averaged.n_averaged)

    def on_step_end(self, ctx: TrainContext, epoch: int, step: int) -> None:
        if self.phase == "cyclic" and epoch >= self.start_epoch:
            i = (epoch - self.start_epoch) * ctx.steps_per_epoch + step + 1
            if i % self.cycle_iterations(ctx.steps_per_epoch) == 0:
                self.capture(ctx)

    def on_epoch_end(self, ctx: TrainContext, epoch: int) -> None:
        done = epoch + 1
        if self.phase in ("constant", "swalr"):
            if done >= self.start_epoch and (done - self.start_epoch) % self.capture_every == 0:
                self.capture(ctx)
        elif self.phase == "shake_shake":
            if done > self.start_epoch and (done - self.start_epoch) % 100 == 0:
                self.capture(ctx)
        scored: dict[str, torch.Tensor] = {}  # the average's log-probabilities per split, when this epoch end scores it
        for b in self.score_at_budgets:
            if done == self.epoch_of(b) and self.n_averaged:
                name, model = budget_predictor(b), self.averaged_for_eval(ctx)
                scored["test"] = self.budget_log_probs[name] = ctx.test_log_probs(model)
                ctx.predictions.save(name, scored["test"])
                if ctx.val_log_probs is not None:  # a budget mark is a predictor: scored on the validation split too
                    scored["val"] = self.budget_val_log_probs[name] = ctx.val_log_probs(model)
                    ctx.predictions.save(val_file(name), scored["val"])
        if self.score_every and done % self.score_every == 0 and self.n_averaged:
            split = ctx.eval_split  # swa_test_* (or swa_val_* with run.eval_split=val)
            if split not in scored:  # a budget mark's scoring serves the epoch's line too
                scored[split] = ctx.log_probs_on(split, self.averaged_for_eval(ctx))
            metrics = metrics_from_log_probs(scored[split], ctx.labels_on(split))
            ctx.log({f"swa_{split}_{k}": v for k, v in metrics.items()})

    def averaged_for_eval(self, ctx: TrainContext, for_good: bool = False) -> torch.nn.Module:
        """The average on the training device, with BatchNorm statistics recomputed on the training data (its own
        copy of the network); ``for_good`` at the end of training, when it need not go back to ``run.avg_device``."""
        if self.n_averaged == 0:
            raise RuntimeError("SWA has averaged no model yet: check method.start and trainer.epochs")
        model = on_training_device(self.averaged.module, ctx, for_good)
        if self.bn_update:
            ctx.update_bn(model)
        return model

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        swa_model = self.averaged_for_eval(ctx, for_good=True)
        out: dict[str, Predictor] = {name: CachedLogProbs(p, self.budget_val_log_probs.get(name))
                                     for name, p in self.budget_log_probs.items()}
        out["swa"] = ModelPredictor(swa_model, ctx.device)
        out[self.live] = ModelPredictor(ctx.model, ctx.device)
        return out

    def extra_metrics(self, ctx: TrainContext, labels: torch.Tensor) -> dict[str, dict]:
        return {"swa": {"n_averaged": self.n_averaged}}

    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"swa": copy.deepcopy(self.averaged.module.state_dict())} if self.averaged is not None else {}

    # -- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The average and the names of the budget marks scored so far (their predictions are in ctx.predictions,
        on the validation split too when there is one)."""
        return {"averaged": self.averaged.state_dict() if self.averaged is not None else None,
                "budget_files": list(self.budget_log_probs), "budget_val_files": list(self.budget_val_log_probs)}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if "budget_files" not in state and any(k.startswith("budget_") for k in state):  # marks inside: swalab.upgrade
            raise CheckpointError(earlier_format(f"the SWA state of a checkpoint of {ctx.run_dir}", ctx.run_dir))
        if state.get("averaged") is not None:
            self.averaged.load_state_dict(state["averaged"])
        self.budget_log_probs = {name: ctx.predictions.load(name) for name in state.get("budget_files", [])}
        self.budget_val_log_probs = {name: ctx.predictions.load(val_file(name))
                                     for name in state.get("budget_val_files", [])}
