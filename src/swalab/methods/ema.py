"""Exponential moving average of the weights during conventional training (the EMA baseline).

The average is timm's ``ModelEmaV3`` (multi-tensor lerp, optional warmup), updated every
``update_every`` optimizer steps. When to reach for the warmup: with ``decay = 0.9999`` and no
warmup the average stays near its random initialisation for tens of thousands of steps (a
frequent surprise for timm users, timm#188); ``warmup=true`` ramps the decay up as
``1 - (1 + step / warmup_gamma) ** -warmup_power``.

BatchNorm buffers (``bn``):
* ``average``: running statistics are averaged like the weights (timm's default);
* ``recompute``: buffers are copied from the live model during training and the EMA model's
  statistics are recomputed with one pass over the training data before it is scored, as SWA does.
"""

from __future__ import annotations

import copy

import torch
from timm.utils import ModelEmaV3

from swalab.config import ConfigError, require
from swalab.evaluate import ModelPredictor, Predictor
from swalab.methods.base import Method, TrainContext
from swalab.schedules import Schedule


class EMA(Method):
    name = "ema"

    def __init__(self, schedule: Schedule, epochs: int, decay: float = 0.999, warmup: bool = False,
                 warmup_gamma: float = 1.0, warmup_power: float = 2 / 3, update_every: int = 1,
                 bn: str = "average", budget: float = 1.0, name: str | None = None):
        super().__init__(schedule, epochs, budget, name)
        self.decay = float(require("method.decay", decay, "number", 0, 1, low_open=True, high_open=True))
        self.warmup = require("method.warmup", warmup, "bool")
        self.warmup_gamma = require("method.warmup_gamma", warmup_gamma, "number", 0, low_open=True)
        self.warmup_power = require("method.warmup_power", warmup_power, "number", 0, low_open=True)
        self.update_every = require("method.update_every", update_every, "int", 1)
        self.bn = bn
        self.ema: ModelEmaV3 | None = None
        self.updates = 0

    def validate(self, initialized: bool) -> None:
        super().validate(initialized)
        if self.bn not in ("average", "recompute"):
            raise ConfigError(f"method.bn must be 'average' or 'recompute', got {self.bn!r}")

    def validate_steps(self, steps_per_epoch: int) -> None:
        steps = self.epochs * steps_per_epoch
        if self.update_every > steps:
            raise ConfigError(f"method.update_every={self.update_every} but the run has only {steps} optimizer steps "
                              f"({self.epochs} epochs of {steps_per_epoch}): the EMA would never be updated and "
                              f"'ema' would score the initial weights. Set method.update_every to at most {steps}")

    def on_train_start(self, ctx: TrainContext) -> None:
        self.ema = ModelEmaV3(ctx.model, decay=self.decay, use_warmup=self.warmup,
                              warmup_gamma=self.warmup_gamma, warmup_power=self.warmup_power,
                              exclude_buffers=self.bn == "recompute")

    def on_step_end(self, ctx: TrainContext, epoch: int, step: int) -> None:
        global_step = epoch * ctx.steps_per_epoch + step + 1
        if global_step % self.update_every == 0:
            self.updates += 1
            self.ema.update(ctx.model, step=self.updates if self.warmup else None)

    def ema_for_eval(self, ctx: TrainContext) -> torch.nn.Module:
        if self.bn == "recompute":
            ctx.update_bn(self.ema.module)
        return self.ema.module

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {"ema": ModelPredictor(self.ema_for_eval(ctx), ctx.device, ctx.amp),
                "sgd": ModelPredictor(ctx.model, ctx.device, ctx.amp)}

    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"ema": copy.deepcopy(self.ema.module.state_dict())} if self.ema is not None else {}

    def state_dict(self) -> dict:
        return {"ema": self.ema.module.state_dict() if self.ema is not None else None, "updates": self.updates}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if state.get("ema") is not None:
            self.ema.module.load_state_dict(state["ema"])
        self.updates = int(state.get("updates", 0))
