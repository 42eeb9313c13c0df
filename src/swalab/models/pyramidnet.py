"""PyramidNet for CIFAR.

Architecture: Han, Kim & Kim, "Deep Pyramidal Residual Networks" (CVPR 2017),
as used by the SWA paper (PyramidNet-272, bottleneck, alpha = 200, CIFAR-100):

* additive widening: the width grows linearly by alpha / N per unit over all
  N units of the network, starting from 16, and the width of each unit is the
  running width rounded to an integer (bottleneck units output 4x that width);
* first layer 3x3 conv (16 channels, no bias) followed by BN (no ReLU);
* bottleneck unit (depth = 9n + 2, n units per stage):
  BN -> 1x1 conv -> BN -> ReLU -> 3x3 conv (stride) -> BN -> ReLU ->
  1x1 conv (x4) -> BN, with *no* ReLU at the end of the unit; basic unit
  (depth = 6n + 2): BN -> 3x3 conv (stride) -> BN -> ReLU -> 3x3 conv -> BN;
* shortcut: identity, 2x2 average pooling when the unit downsamples, and
  zero-padding of the extra channels (no parameters);
* stages with strides 1, 2, 2; final BN -> ReLU -> global average pooling ->
  Linear;
* conv weights ~ N(0, sqrt(2 / n)), n = k * k * out_channels; BN weight 1,
  bias 0; Linear bias 0.

Parameter count (this implementation), PyramidNet-272 alpha 200 bottleneck:
26,288,692 (100 classes) / 26,210,842 (10 classes); the paper reports
26.0M (this is 1.1% more; rounding the widths down instead would give
26.12M, but the authors' PyTorch code rounds to nearest, which is kept here)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from .init import init_weights, three_stages

__all__ = ["PyramidNet", "PyramidBasicBlock", "PyramidBottleneck"]


class _PyramidUnit(nn.Module):
    """Common shortcut of a pyramidal unit: avg-pool when strided, zero-pad channels."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, *layers: nn.Module) -> None:
        super().__init__()
        self.in_planes, self.out_planes, self.stride = in_planes, out_planes, stride
        self.residual = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.residual(x)
        shortcut = x
        if self.stride != 1:
            shortcut = F.avg_pool2d(shortcut, kernel_size=2, stride=2, ceil_mode=True)
        extra = self.out_planes - self.in_planes
        if extra > 0:
            # Pad the channel dimension (dim 1) with zeros at the end.
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, extra))
        return out + shortcut


class PyramidBasicBlock(_PyramidUnit):
    """BN -> conv3x3(stride) -> BN -> ReLU -> conv3x3 -> BN."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, planes * self.expansion, stride, nn.BatchNorm2d(in_planes),
                         nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
                         nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(planes))


class PyramidBottleneck(_PyramidUnit):
    """BN -> 1x1 -> BN -> ReLU -> 3x3(stride) -> BN -> ReLU -> 1x1 (x4) -> BN."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__(in_planes, planes * self.expansion, stride, nn.BatchNorm2d(in_planes),
                         nn.Conv2d(in_planes, planes, kernel_size=1, bias=False), nn.BatchNorm2d(planes),
                         nn.ReLU(inplace=True),
                         nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
                         nn.Conv2d(planes, planes * self.expansion, kernel_size=1, bias=False),
                         nn.BatchNorm2d(planes * self.expansion))


class PyramidNet(nn.Module):
    """PyramidNet with additive widening.

    Args:
        depth: total depth; 9n+2 with bottleneck units (e.g. 110, 164, 200,
            236, 272), 6n+2 with basic units (e.g. 20, 110).
        alpha: total widening over the whole network.
        num_classes: number of output logits.
        bottleneck: bottleneck (True) or basic (False) units.
        in_channels: channels of the input image."""

    def __init__(self, depth: int = 272, alpha: int = 200, num_classes: int = 10, bottleneck: bool = True,
                 in_channels: int = 3) -> None:
        super().__init__()
        divisor = 9 if bottleneck else 6
        if depth < divisor + 2 or (depth - 2) % divisor != 0:
            kind = "bottleneck" if bottleneck else "basic"
            examples = "11, 20, ..., 110, 164, 200, 236, 272" if bottleneck else "8, 14, 20, ..., 110"
            raise ValueError(f"PyramidNet depth {depth} is invalid for {kind} units: it must be "
                             f"{divisor}n+2 with n >= 1 (valid: {examples}, ...)")
        block: type[PyramidBasicBlock | PyramidBottleneck] = PyramidBottleneck if bottleneck else PyramidBasicBlock
        n = (depth - 2) // divisor
        self.depth, self.alpha, self.blocks_per_stage = depth, alpha, n
        add_rate = alpha / (3 * n)

        base = 16
        self.conv1 = nn.Conv2d(in_channels, base, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        widths = [int(round(w)) for w in itertools.accumulate([add_rate] * (3 * n), initial=float(base))][1:]
        stages, in_planes = three_stages(block, base, [widths[i * n:(i + 1) * n] for i in range(3)], block.expansion)
        self.layer1, self.layer2, self.layer3 = stages
        self.bn_final = nn.BatchNorm2d(in_planes)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self, conv="he", zero_linear_bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.relu(self.bn_final(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)
