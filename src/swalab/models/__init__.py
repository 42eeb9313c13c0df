"""CIFAR model zoo: VGG-16, PreResNet, WideResNet, PyramidNet and Shake-Shake.

All models are plain ``nn.Module`` s on the CPU; moving them to a device is the
caller's job. Every constructor takes ``num_classes`` and ``in_channels``."""

from __future__ import annotations

from torch import nn

from .preresnet import PreResNet
from .pyramidnet import PyramidNet
from .shake_shake import ShakeShake
from .vgg import VGG16
from .wide_resnet import WideResNet

__all__ = ["VGG16", "PreResNet", "WideResNet", "PyramidNet", "ShakeShake", "count_parameters"]


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters of ``model`` (shared parameters counted once).

    Buffers such as BatchNorm running statistics are not counted. With
    ``trainable_only`` only parameters with ``requires_grad`` are counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
