"""The optimizer of a run: any ``torch.optim`` class, built over the model's parameters (``conf/optimizer``).

``optimizer=sgd`` is the paper's (momentum 0.9, the model's weight decay) and the default; ``optimizer=adamw`` is
the recipe most fine-tuning starts from; ``optimizer._target_=<any torch.optim class>`` takes the rest, its
keyword arguments given as keys of the block. The learning rate is not one of them: the method sets it at every
step (``Method.step_lr``), whatever the optimizer, so schedules, SWA's phases and FGE's cycles work with all.

``filter_bias_and_bn`` (timm's rule, off by default) exempts every one-dimensional parameter (biases and the
weights of normalisation layers) from weight decay: decaying a BatchNorm scale towards zero only fights the
normalisation, and with AdamW's decoupled decay it is the usual choice. The optimizer's state goes into every
checkpoint, so a resumed run continues with the same moments. On CUDA, SGD runs fused unless ``fused`` or
``foreach`` is set (:func:`fuses_by_default`): what lets the training step run as a CUDA graph.

:class:`OptimizerSpec` is what ``swalab.train`` builds from the config and checks before anything is written
(every number finite, the ranges torch itself does not check, an argument the class does not take named by its
key); the trainer calls it once with its model."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from swalab.config import ConfigError, require

KEY = "optimizer"  # the config block, as error messages name its keys


def param_groups(model: nn.Module, weight_decay: float, filter_bias_and_bn: bool) -> list[dict]:
    """The model's trainable parameters as optimizer groups: one group with ``weight_decay``, or, with
    ``filter_bias_and_bn``, the one-dimensional parameters (biases, normalisation weights) in a second group
    without decay. The groups keep the model's parameter order, so the optimizer state of a checkpoint maps back."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not filter_bias_and_bn:
        return [{"params": trainable, "weight_decay": weight_decay}]
    decayed = [p for p in trainable if p.ndim > 1]
    exempt = [p for p in trainable if p.ndim <= 1]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]


def _finite(key: str, value: Any) -> None:
    """NaN and inf are refused in any number of the block, a list's items (``betas``) included."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _finite(key, item)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} must be a finite number")


def fuses_by_default(cls: type, settings: dict[str, Any], groups: list[dict]) -> bool:
    """Whether SGD runs fused without being asked: ``torch.optim.SGD`` on CUDA parameters, ``fused`` and ``foreach``
    left unset. The fused update is one kernel for every parameter and reads the learning rate from a tensor when
    given one, which lets a CUDA graph replay it at each step's lr (``swalab.graphed``); ``optimizer.fused=false``
    keeps torch's foreach update."""
    params = [p for group in groups for p in group["params"]]
    return (cls is torch.optim.SGD and "fused" in inspect.signature(cls).parameters  # torch >= 2.3 has it
            and "fused" not in settings and "foreach" not in settings and bool(params) and all(p.is_cuda for p in params))


def check_lengths(settings: dict[str, Any], takes) -> None:
    """A list setting of another length than its default (``optimizer.betas=[0.9]`` for AdamW's pair) is refused by
    its key: torch would fail on it with a bare ``list index out of range``."""
    for name, value in settings.items():
        default = takes[name].default if name in takes else None
        if isinstance(default, (tuple, list)) and isinstance(value, (tuple, list)) and len(value) != len(default):
            raise ConfigError(f"{KEY}.{name}={list(value)!r} must be a list of {len(default)} numbers, like its "
                              f"default {list(default)!r}")


@dataclass
class OptimizerSpec:
    """``target`` (an import path of a ``torch.optim.Optimizer`` class) with its keyword arguments ``settings``
    (momentum, betas, ...; ``weight_decay`` among them) and timm's ``filter_bias_and_bn`` rule."""

    target: str = "torch.optim.SGD"
    settings: dict[str, Any] = field(default_factory=dict)
    filter_bias_and_bn: bool = False

    def __post_init__(self) -> None:
        require(f"{KEY}.filter_bias_and_bn", self.filter_bias_and_bn, "bool")
        for name, value in self.settings.items():
            _finite(f"{KEY}.{name}", value)
        if "lr" in self.settings:
            raise ConfigError(f"{KEY}.lr: the learning rate is the method's, set at every step; set model.lr (the "
                              "schedule's) or the method's own lr instead")
        require(f"{KEY}.weight_decay", self.settings.get("weight_decay", 0.0), "number", 0)
        if "momentum" in self.settings:
            require(f"{KEY}.momentum", self.settings["momentum"], "number", 0, 1, high_open=True)

    @property
    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        from hydra.utils import get_class

        try:
            cls = get_class(self.target)
        except Exception as exc:  # noqa: BLE001  hydra wraps import errors of every kind
            raise ConfigError(f"{KEY}._target_={self.target!r} cannot be imported ({exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise ConfigError(f"{KEY}._target_={self.target!r} is not a torch.optim.Optimizer class")
        return cls

    def build(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        """The optimizer over ``model``'s parameters at ``lr``; torch's own refusals name the block's keys."""
        cls = self.optimizer_class
        takes = inspect.signature(cls).parameters
        unknown = [k for k in self.settings if k not in takes]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in takes.values()):
            allowed = [p for p in takes if p not in ("self", "params", "lr", "kwargs")]
            raise ConfigError(f"{KEY}.{unknown[0]} is not a setting of {self.target}; it takes: {', '.join(allowed)}")
        check_lengths(self.settings, takes)
        settings = dict(self.settings)
        groups = param_groups(model, float(settings.pop("weight_decay", 0.0)), self.filter_bias_and_bn)
        if fuses_by_default(cls, settings, groups):
            settings["fused"] = True
        try:
            return cls(groups, lr=lr, **settings)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{KEY} ({self.target}) refuses its settings: {exc}") from None

    def check(self) -> None:
        """Build it once over a stand-in parameter: every refusal comes before the run writes anything."""
        self.build(nn.Linear(1, 1), lr=0.1)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)`` (a checkpoint's moments and hyperparameters), keeping how the update runs
    (``fused``, ``foreach``): that is this machine's choice, not the checkpoint's. A run checkpointed on a CPU
    (foreach) and resumed on a GPU runs fused there, as the CUDA graph needs (:func:`fuses_by_default`)."""
    kernels = [{k: group[k] for k in ("fused", "foreach") if k in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, chosen in zip(optimizer.param_groups, kernels):
        group.update(chosen)

