"""The training loss (``conf/loss``): cross-entropy with label smoothing and mixup/cutmix when asked.

Only the training steps see any of it. Every test pass, every score in ``metrics.json`` and the BatchNorm update
of an averaged model use clean images and plain labels, so SWA, EMA and FGE trained with a regularised loss are
scored exactly as those trained without.

* Label smoothing moves ``label_smoothing`` of the target's weight onto all classes uniformly (the true class
  keeps ``1 - eps + eps / K``), as ``F.cross_entropy(label_smoothing=)`` and timm do.
* Mixup and cutmix are timm's ``Mixup`` (one Beta draw per batch, pair or image, ``mix_mode``): a batch is mixed
  with itself reversed and the loss is the cross-entropy with the mixed soft target. Its draws come from numpy's
  global generator, which every checkpoint saves, so a resumed run mixes exactly as one that ran straight through.
  timm mixes even batches only; a batch of odd size (a run's last, when the training set is odd) is mixed but for
  its last image, which keeps its own (smoothed) label.
* The history's ``train_loss`` is the objective trained (smoothed and mixed); its ``train_acc`` counts a
  prediction right when it is the class holding the most weight in the (mixed) target: the true label without
  mixup, the dominant one of the pair with it.

:class:`LossSpec` holds the settings and checks them before anything is written; :meth:`LossSpec.build` makes the
:class:`TrainingLoss` once the number of classes is known from the data."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swalab.config import ConfigError, require

MIX_MODES = ("batch", "pair", "elem")


@dataclass(frozen=True)
class LossSpec:
    """The ``loss`` block of a run, checked key by key (each named as ``loss.<key>`` in an error)."""

    label_smoothing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    mix_mode: str = "batch"

    def __post_init__(self) -> None:
        require("loss.label_smoothing", self.label_smoothing, "number", 0, 1, high_open=True)
        require("loss.mixup_alpha", self.mixup_alpha, "number", 0)
        require("loss.cutmix_alpha", self.cutmix_alpha, "number", 0)
        require("loss.mix_prob", self.mix_prob, "number", 0, 1)
        require("loss.switch_prob", self.switch_prob, "number", 0, 1)
        if self.mix_mode not in MIX_MODES:
            raise ConfigError(f"loss.mix_mode={self.mix_mode!r} must be one of {', '.join(MIX_MODES)}")
        if self.mixing and self.mix_prob == 0:
            raise ConfigError("loss.mix_prob=0 with mixup or cutmix on would never mix a batch: set loss.mix_prob > 0, "
                              "or loss.mixup_alpha=0 and loss.cutmix_alpha=0 to train without mixing")

    @property
    def mixing(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def build(self, num_classes: int) -> "TrainingLoss":
        return TrainingLoss(self, num_classes)


class TrainingLoss:
    """``prepare(x, y)`` mixes a training batch (when mixup/cutmix is on), ``loss(logits, target)`` is the objective,
    ``correct(logits, target)`` the count of right predictions (module doc), all on the device, without a sync."""

    def __init__(self, spec: LossSpec, num_classes: int):
        self.spec, self.num_classes = spec, num_classes
        self.mixup = None
        if spec.mixing:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=spec.mixup_alpha, cutmix_alpha=spec.cutmix_alpha, prob=spec.mix_prob,
                               switch_prob=spec.switch_prob, mode=spec.mix_mode, label_smoothing=spec.label_smoothing,
                               num_classes=num_classes)

    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch the step trains on and its target: ``(x, y)`` as they are without mixing, else the mixed images
        and soft targets ``[N, K]`` (``x`` is mixed in place, as timm does)."""
        if self.mixup is None:
            return x, y
        even = len(x) - len(x) % 2
        if even == 0:
            return x, self.soft(y)
        mixed_x, target = self.mixup(x[:even], y[:even])
        if even == len(x):
            return mixed_x, target
        return x, torch.cat([target, self.soft(y[even:])])

    def soft(self, y: torch.Tensor) -> torch.Tensor:
        """Plain labels as (smoothed) one-hot targets, timm's values."""
        off = self.spec.label_smoothing / self.num_classes
        target = torch.full((len(y), self.num_classes), off, device=y.device)
        return target.scatter_(1, y.long().view(-1, 1), 1.0 - self.spec.label_smoothing + off)

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if target.ndim == 2:  # soft targets (mixed)
            return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        return F.cross_entropy(logits, target, label_smoothing=self.spec.label_smoothing)

    @staticmethod
    def correct(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        labels = target.argmax(dim=1) if target.ndim == 2 else target
        return logits.detach().argmax(1).eq(labels).sum()
