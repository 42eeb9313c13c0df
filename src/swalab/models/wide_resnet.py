"""Wide Residual Network (WRN-d-k) for CIFAR.

Architecture: Zagoruyko & Komodakis, "Wide Residual Networks" (BMVC 2016):
a 3x3 conv to 16 channels, three stages of n = (depth - 4) / 6 pre-activation
units of width 16k, 32k, 64k (strides 1, 2, 2), each unit
BN -> ReLU -> conv3x3 -> [Dropout] -> BN -> ReLU -> conv3x3, then
BN -> ReLU -> global average pooling -> Linear.

Details follow the reference implementation used by the SWA paper (so that
WRN-28-10 has 36.49M / 36.55M parameters for 10 / 100 classes):

* every convolution, including the 1x1 projection shortcut, has a bias;
* the stride of a downsampling unit sits on the *second* 3x3 conv (conv2),
  not on the first as in the original WRN (about +13% FLOPs);
* the projection shortcut (1x1 conv with the unit's stride, used when the
  width or the resolution changes) is applied to the raw unit input;
* conv weights Xavier-uniform with gain sqrt(2) and zero bias, BN weight 1,
  bias 0, Linear default init with zero bias.

Parameter count (this implementation), WRN-28-10: 36,489,290 (10 classes) /
36,546,980 (100 classes)."""

from __future__ import annotations


import torch
from torch import nn

from .init import init_weights, three_stages

__all__ = ["WideResNet", "WideBasicBlock"]


class WideBasicBlock(nn.Module):
    """Pre-activation wide basic unit with the stride on conv2."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, padding=1, bias=True)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=True)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.dropout(out)
        out = self.conv2(self.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(nn.Module):
    """WRN-depth-widen_factor.

    Args:
        depth: total depth, must be 6n+4 (10, 16, 22, 28, 34, 40, ...).
        widen_factor: width multiplier k.
        num_classes: number of output logits.
        dropout: dropout probability between the two convolutions of a unit.
        in_channels: channels of the input image."""

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10, dropout: float = 0.0,
                 in_channels: int = 3) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WideResNet depth {depth} is invalid: it must be 6n+4 with n >= 1 "
                             "(valid: 10, 16, 22, 28, 34, 40, ...)")
        if widen_factor < 1:
            raise ValueError(f"widen_factor must be >= 1, got {widen_factor}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.depth = depth
        self.widen_factor = widen_factor

        self.conv1 = nn.Conv2d(in_channels, widths[0], kernel_size=3, padding=1, bias=True)
        stages, in_planes = three_stages(lambda i, o, s: WideBasicBlock(i, o, s, dropout), widths[0],
                                         [[w] * n for w in widths[1:]])
        self.layer1, self.layer2, self.layer3 = stages
        self.bn = nn.BatchNorm2d(in_planes)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self, conv="xavier", zero_linear_bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.relu(self.bn(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)
