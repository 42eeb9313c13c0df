"""Exponential moving average of the weights during conventional training (the EMA baseline).

The average is timm's ``ModelEmaV3`` (its copy of the model, its decay and warmup), updated every
``update_every`` optimizer steps by :class:`EmaTensors`: the same multi-tensor lerp over tensor lists paired
once at the start, instead of two ``state_dict()`` and one ``copy_`` per integer buffer every step (489 to
1,086 copies a step for the deep models). When to reach for the warmup: with ``decay = 0.9999`` and no
warmup the average stays near its random initialisation for tens of thousands of steps (a
frequent surprise for timm users, timm#188); ``warmup=true`` ramps the decay up as
``1 - (1 + step / warmup_gamma) ** -warmup_power``.

BatchNorm buffers (``bn``):
* ``average``: running statistics are averaged like the weights (timm's default);
* ``recompute``: buffers are copied from the live model during training and the EMA model's
  statistics are recomputed with one pass over the training data before it is scored, as SWA does."""

from __future__ import annotations

import copy

import torch
from timm.utils import ModelEmaV3

from swalab.config import ConfigError, check_avg_device, require
from swalab.evaluate import ModelPredictor, Predictor
from swalab.methods.base import Method, TrainContext, averages_device, on_training_device
from swalab.schedules import Schedule


class EmaTensors:
    """The EMA model's tensors paired with the live model's, once, for the per-step update.

    ``update(decay)`` is ``ModelEmaV3.update`` for float32/float64 EMAs, bit for bit (tests/test_methods.py): one
    ``torch._foreach_lerp_`` of the floating tensors towards the model with weight ``1 - decay`` and one
    ``torch._foreach_copy_`` of the rest (the integer ``num_batches_tracked``; with ``exclude_buffers`` every buffer,
    as timm's ``apply_update_no_buffers_``). The lists hold the tensors themselves, which loading a state dict or
    a checkpoint fills in place, so they stay valid for the life of the run (the trainer moves its model to its
    device and layout before the method starts, never after)."""

    def __init__(self, ema: torch.nn.Module, model: torch.nn.Module, exclude_buffers: bool):
        if exclude_buffers:
            lerp = list(zip(ema.parameters(), model.parameters()))
            copy_ = list(zip(ema.buffers(), model.buffers()))
        else:
            pairs = list(zip(ema.state_dict(keep_vars=True).values(), model.state_dict(keep_vars=True).values()))
            lerp = [(e, m) for e, m in pairs if e.is_floating_point()]
            copy_ = [(e, m) for e, m in pairs if not e.is_floating_point()]
        self.lerp_ema, self.lerp_model = [e for e, _ in lerp], [m for _, m in lerp]
        self.copy_ema, self.copy_model = [e for e, _ in copy_], [m for _, m in copy_]

    @staticmethod
    def supports(ema: torch.nn.Module) -> bool:
        """Whether the plain lerp is timm's update for this EMA (not for bf16/fp16 tensors: timm rounds those
        stochastically)."""
        return all(t.dtype not in (torch.bfloat16, torch.float16) for t in ema.state_dict().values())

    @torch.no_grad()
    def update(self, decay: float) -> None:
        if self.lerp_ema:
            torch._foreach_lerp_(self.lerp_ema, self.lerp_model, 1.0 - decay)
        if self.copy_ema:
            torch._foreach_copy_(self.copy_ema, self.copy_model)


class EMA(Method):
    """EMA (module doc). Its settings are the method's own keys ``method.*``; the defaults here are
    ``conf/method/ema.yaml``'s, so ``EMA(schedule, epochs)`` in Python is ``method=ema`` on the command line."""

    name = "ema"

    def __init__(self, schedule: Schedule, epochs: int, decay: float = 0.999, warmup: bool = True,
                 warmup_gamma: float = 1.0, warmup_power: float = 2 / 3, update_every: int = 1,
                 bn: str = "average", budget: float = 1.0, name: str | None = None, avg_device: str = "train"):
        super().__init__(schedule, epochs, budget, name)
        self.avg_device = check_avg_device(avg_device)  # run.avg_device: where the EMA copy lives
        self.decay = float(require("method.decay", decay, "number", 0, 1, low_open=True, high_open=True))
        self.warmup = require("method.warmup", warmup, "bool")
        self.warmup_gamma = require("method.warmup_gamma", warmup_gamma, "number", 0, low_open=True)
        self.warmup_power = require("method.warmup_power", warmup_power, "number", 0, low_open=True)
        self.update_every = require("method.update_every", update_every, "int", 1)
        self.bn = bn
        self.ema: ModelEmaV3 | None = None
        self.tensors: EmaTensors | None = None  # None: timm's own update (a low-precision EMA)
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
        where = averages_device(self.avg_device, ctx)
        elsewhere = where != ctx.device  # a copy on the CPU of a model trained on a GPU: timm's per-tensor update
        self.ema = ModelEmaV3(ctx.model, decay=self.decay, use_warmup=self.warmup,
                              warmup_gamma=self.warmup_gamma, warmup_power=self.warmup_power,
                              exclude_buffers=self.bn == "recompute", device=where if elsewhere else None,
                              foreach=not elsewhere)
        self.tensors = (EmaTensors(self.ema.module, ctx.model, self.bn == "recompute")
                        if EmaTensors.supports(self.ema.module) and not elsewhere else None)

    def on_step_end(self, ctx: TrainContext, epoch: int, step: int) -> None:
        global_step = epoch * ctx.steps_per_epoch + step + 1
        if global_step % self.update_every == 0:
            self.updates += 1
            step_arg = self.updates if self.warmup else None
            if self.tensors is None:
                self.ema.update(ctx.model, step=step_arg)
            else:
                self.tensors.update(self.ema.get_decay(step_arg))

    def ema_for_eval(self, ctx: TrainContext) -> torch.nn.Module:
        """The EMA on the training device at the end of training, its BN statistics recomputed with ``bn=recompute``."""
        model = on_training_device(self.ema.module, ctx, for_good=True)
        if self.bn == "recompute":
            ctx.update_bn(model)
        return model

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {"ema": ModelPredictor(self.ema_for_eval(ctx), ctx.device),
                self.live: ModelPredictor(ctx.model, ctx.device)}

    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"ema": copy.deepcopy(self.ema.module.state_dict())} if self.ema is not None else {}

    def state_dict(self) -> dict:
        return {"ema": self.ema.module.state_dict() if self.ema is not None else None, "updates": self.updates}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if state.get("ema") is not None:
            self.ema.module.load_state_dict(state["ema"])
        self.updates = int(state.get("updates", 0))
