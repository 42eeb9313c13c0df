"""Weight initialisation and the three-stage layout shared by the CIFAR models, as each reference definition does it.

When it matters: results are reproduced from the reference code's starting weights, so each model
keeps its reference scheme (the choice is an argument here, not a copy of the loop in every model):

* ``conv="he"``: ``N(0, sqrt(2 / n))`` with ``n = k * k * out_channels`` (He et al. with fan-out; what
  PreResNet, PyramidNet, VGG and Shake-Shake's ``kaiming_normal_(mode="fan_out")`` draw);
* ``conv="xavier"``: Xavier-uniform with gain sqrt(2) (the reference WideResNet).

Convolution biases start at 0, BatchNorm at weight 1 and bias 0; ``zero_linear_bias`` zeroes the
classifier's bias too (the Linear weights keep PyTorch's default)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from torch import nn


def three_stages(unit: Callable[[int, int, int], nn.Module], in_planes: int, planes: Sequence[Sequence[int]],
                 expansion: int = 1) -> tuple[list[nn.Sequential], int]:
    """The stages of a CIFAR ResNet, strides 1, 2, 2: ``unit(in_planes, planes, stride)`` for each of ``planes``'s
    widths (one sequence per stage), the first unit of a stage striding; with the width the last stage ends on."""
    stages = []
    for stride, widths in zip((1, 2, 2), planes):
        units = []
        for j, width in enumerate(widths):
            units.append(unit(in_planes, width, stride if j == 0 else 1))
            in_planes = width * expansion
        stages.append(nn.Sequential(*units))
    return stages, in_planes


def init_weights(model: nn.Module, conv: str = "he", zero_linear_bias: bool = False) -> None:
    """Initialise ``model``'s convolutions, BatchNorms and (optionally) Linear biases in place."""
    if conv not in ("he", "xavier"):
        raise ValueError(f"conv must be 'he' or 'xavier', got {conv!r}")
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            if conv == "he":
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, mean=0.0, std=math.sqrt(2.0 / n))
            else:
                nn.init.xavier_uniform_(m.weight, gain=math.sqrt(2.0))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and zero_linear_bias:
            nn.init.zeros_(m.bias)
