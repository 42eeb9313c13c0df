"""Pre-activation ResNet for CIFAR.

Architecture: He, Zhang, Ren & Sun, "Identity Mappings in Deep Residual
Networks" (ECCV 2016): every residual unit is BN -> ReLU -> conv (the
"full pre-activation" unit), the network starts with a single 3x3 conv and ends
with BN -> ReLU -> global average pooling -> Linear.

Details follow the reference used by the SWA paper (PreResNet-110/164):

* depth >= 44 uses bottleneck units (1x1, 3x3, 1x1; expansion 4) with
  n = (depth - 2) / 9 units per stage; shallower nets use basic units
  (two 3x3 convs) with n = (depth - 2) / 6;
* three stages of width base_width, 2*base_width, 4*base_width (times the
  expansion), strides 1, 2, 2 (the stride sits on the 3x3 conv);
* all convolutions are bias-free;
* when a unit changes shape, the shortcut is a bias-free 1x1 convolution with
  the unit's stride and *no* BatchNorm; as in the paper it is applied to the
  pre-activated input (the BN -> ReLU of the unit is shared by both paths);
* conv weights ~ N(0, sqrt(2 / n)), n = k * k * out_channels; BN weight 1,
  bias 0.

Parameter counts (this implementation): PreResNet-110 1,146,842 / 1,169,972,
PreResNet-164 1,703,258 / 1,726,388 (10 / 100 classes), matching the
reference's 1.15M / 1.17M and 1.70M / 1.73M. PreResNet-20 (basic) has 0.27M.
Global pooling is adaptive, so inputs smaller than 32x32 (e.g. 8x8) work."""

from __future__ import annotations


import torch
from torch import nn

from .init import init_weights, three_stages

__all__ = ["PreResNet", "PreActBasicBlock", "PreActBottleneck", "valid_preresnet_depth"]


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class _PreActUnit(nn.Module):
    """A unit's convolutions (``conv1``, ``conv2``, ...) each preceded by BN -> ReLU (``bn1``, ``bn2``, ...); where the
    shape changes, the shortcut is a 1x1 convolution of the pre-activated input."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, *convs: nn.Conv2d) -> None:
        super().__init__()
        for i, conv in enumerate(convs, 1):
            setattr(self, f"bn{i}", nn.BatchNorm2d(conv.in_channels))
            setattr(self, f"conv{i}", conv)
        self.pairs = len(convs)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(x))
        identity = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(out)
        for i in range(2, self.pairs + 1):
            out = getattr(self, f"conv{i}")(self.relu(getattr(self, f"bn{i}")(out)))
        return out + identity


class PreActBasicBlock(_PreActUnit):
    """Two 3x3 convolutions, each preceded by BN -> ReLU."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, planes, stride, _conv3x3(in_planes, planes, stride), _conv3x3(planes, planes))


class PreActBottleneck(_PreActUnit):
    """1x1 (reduce) -> 3x3 (stride) -> 1x1 (expand x4), each preceded by BN -> ReLU."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, planes * 4, stride, nn.Conv2d(in_planes, planes, kernel_size=1, bias=False),
                         _conv3x3(planes, planes, stride), nn.Conv2d(planes, planes * 4, kernel_size=1, bias=False))


def valid_preresnet_depth(depth: int) -> bool:
    """True when ``depth`` is 6n+2 (n >= 1) below 44, or 9n+2 from 44 on."""
    if depth < 44:
        return depth >= 8 and (depth - 2) % 6 == 0
    return (depth - 2) % 9 == 0


class PreResNet(nn.Module):
    """Pre-activation ResNet for CIFAR-sized inputs.

    Args:
        depth: total number of weighted layers. Below 44 it must be 6n+2
            (8, 14, 20, 26, 32, 38; basic units); from 44 on it must be 9n+2
            (47, 56, 65, ..., 110, ..., 164, ...; bottleneck units).
        num_classes: number of output logits.
        in_channels: channels of the input image.
        base_width: width of the first stage (16 in the paper)."""

    def __init__(self, depth: int, num_classes: int = 10, in_channels: int = 3, base_width: int = 16) -> None:
        super().__init__()
        if not valid_preresnet_depth(depth):
            raise ValueError(f"PreResNet depth {depth} is invalid: depth < 44 must be 6n+2 with n >= 1 "
                             "(valid: 8, 14, 20, 26, 32, 38; basic blocks), depth >= 44 must be 9n+2 "
                             "(valid: 47, 56, 65, 74, 83, 92, 101, 110, ..., 164, ...; bottleneck blocks)")
        if depth >= 44:
            block: type[PreActBasicBlock] | type[PreActBottleneck] = PreActBottleneck
            n = (depth - 2) // 9
        else:
            block = PreActBasicBlock
            n = (depth - 2) // 6
        self.depth = depth
        self.blocks_per_stage = n

        self.conv1 = nn.Conv2d(in_channels, base_width, kernel_size=3, padding=1, bias=False)
        stages, in_planes = three_stages(block, base_width, [[base_width * 2**i] * n for i in range(3)], block.expansion)
        self.layer1, self.layer2, self.layer3 = stages
        self.bn = nn.BatchNorm2d(in_planes)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self, conv="he")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.relu(self.bn(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)
