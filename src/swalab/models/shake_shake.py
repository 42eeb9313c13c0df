"""Shake-Shake regularised ResNet for CIFAR.

Architecture: Gastaldi, "Shake-Shake regularization" (arXiv:1705.07485, 2017),
the Shake-Shake-26 2x64d network used for CIFAR-10 in the SWA paper:

* a 3x3 conv to 16 channels followed by BN;
* three stages of n = (depth - 2) / 6 units (4 for depth 26) of width
  base_width, 2*base_width, 4*base_width (64, 128, 256), strides 1, 2, 2;
* each unit has two residual branches ReLU -> conv3x3 (stride) -> BN ->
  ReLU -> conv3x3 -> BN, mixed as alpha * b1 + (1 - alpha) * b2 and added to
  the shortcut;
* "Shake-Shake-Image" (the paper's best CIFAR-10 setting, shake-shake-image):
  in training mode alpha ~ U(0, 1) is drawn independently for every sample in
  the forward pass, and an independent beta ~ U(0, 1) replaces alpha in the
  backward pass (a custom ``torch.autograd.Function``); in eval mode
  alpha = 0.5, so evaluation is deterministic;
* shortcut: identity when the shape is unchanged; otherwise ReLU, then two
  paths, each a strided 1x1 average pool followed by a 1x1 conv to half of the
  output channels, the second path shifted by one pixel (so it sees the pixels
  the first one skips), concatenated and batch-normalised;
* final ReLU -> global average pooling -> Linear;
* conv weights Kaiming-normal (fan_out), BN weight 1 / bias 0, Linear bias 0.

Parameter count (this implementation), Shake-Shake-26 2x64d: 11,653,978
(10 classes) / 11,677,108 (100 classes); Gastaldi reports 11.7M and the SWA
reference table about 11.6M."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .init import init_weights, three_stages

__all__ = ["ShakeShake", "ShakeShakeBlock", "shake_shake"]


class _ShakeShakeFunction(torch.autograd.Function):
    """alpha * x1 + (1 - alpha) * x2 forward; gradients scaled by beta, 1 - beta backward."""

    @staticmethod
    def forward(ctx, x1: torch.Tensor, x2: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor):
        ctx.save_for_backward(beta)
        return alpha * x1 + (1 - alpha) * x2

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (beta,) = ctx.saved_tensors
        grad_x1 = grad_x2 = None
        if ctx.needs_input_grad[0]:
            grad_x1 = beta * grad_output
        if ctx.needs_input_grad[1]:
            grad_x2 = (1 - beta) * grad_output
        return grad_x1, grad_x2, None, None


def shake_shake(x1: torch.Tensor, x2: torch.Tensor, training: bool) -> torch.Tensor:
    """Mix two branch outputs with per-sample Shake-Shake coefficients.

    In training mode alpha (forward) and beta (backward) are drawn
    independently from U(0, 1) for every sample; otherwise the mean 0.5 is used."""
    if not training:
        return 0.5 * (x1 + x2)
    shape = (x1.shape[0],) + (1,) * (x1.dim() - 1)
    alpha = torch.rand(shape, device=x1.device, dtype=x1.dtype)
    beta = torch.rand(shape, device=x1.device, dtype=x1.dtype)
    return _ShakeShakeFunction.apply(x1, x2, alpha, beta)


def _branch(in_planes: int, planes: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(inplace=False),
                         nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(planes),
                         nn.ReLU(inplace=True),
                         nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False),
                         nn.BatchNorm2d(planes))


class _ShiftedProjection(nn.Module):
    """Two-path 1x1 projection shortcut of Shake-Shake (second path shifted by one pixel)."""

    def __init__(self, in_planes: int, out_planes: int, stride: int) -> None:
        super().__init__()
        if out_planes % 2 != 0:
            raise ValueError(f"Shake-Shake widths must be even, got {out_planes}")
        self.stride = stride
        self.conv1 = nn.Conv2d(in_planes, out_planes // 2, kernel_size=1, bias=False)
        self.conv2 = nn.Conv2d(in_planes, out_planes // 2, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(out_planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        path1 = F.avg_pool2d(x, kernel_size=1, stride=self.stride)
        # Shift by one pixel right/down: drop the first row/column, pad at the end.
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        path2 = F.avg_pool2d(shifted, kernel_size=1, stride=self.stride)
        return self.bn(torch.cat([self.conv1(path1), self.conv2(path2)], dim=1))


class ShakeShakeBlock(nn.Module):
    """Two residual branches mixed by Shake-Shake, plus a shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.branch1 = _branch(in_planes, planes, stride)
        self.branch2 = _branch(in_planes, planes, stride)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = _ShiftedProjection(in_planes, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = shake_shake(self.branch1(x), self.branch2(x), self.training)
        return self.shortcut(x) + mixed


class ShakeShake(nn.Module):
    """Shake-Shake-depth 2x(base_width)d.

    Args:
        depth: total depth, must be 6n+2 (8, 14, 20, 26, 32, ...).
        base_width: width of the first stage (64 for 2x64d).
        num_classes: number of output logits.
        in_channels: channels of the input image."""

    def __init__(self, depth: int = 26, base_width: int = 64, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"ShakeShake depth {depth} is invalid: it must be 6n+2 with n >= 1 "
                             "(valid: 8, 14, 20, 26, 32, 38, ...)")
        n = (depth - 2) // 6
        self.depth, self.base_width = depth, base_width

        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages, in_planes = three_stages(ShakeShakeBlock, 16, [[base_width * 2**i] * n for i in range(3)])
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self, conv="he", zero_linear_bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.relu(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)
