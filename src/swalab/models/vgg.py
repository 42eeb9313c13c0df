"""VGG-16 (without BatchNorm) for 32x32 inputs.

Architecture: Simonyan & Zisserman, "Very Deep Convolutional Networks for
Large-Scale Image Recognition" (ICLR 2015), configuration D, adapted to CIFAR
as in the SWA paper (Izmailov et al., UAI 2018) and its reference code:

* thirteen 3x3 convolutions (padding 1, with bias) + ReLU, five 2x2 max-pools,
  so a 32x32 image ends as a 512x1x1 feature map;
* no BatchNorm;
* classifier Dropout(0.5) -> Linear(512, 512) -> ReLU -> Dropout(0.5) ->
  Linear(512, 512) -> ReLU -> Linear(512, num_classes);
* convolution weights ~ N(0, sqrt(2 / n)) with n = k * k * out_channels,
  convolution biases zero (linear layers keep PyTorch's default init).

Parameter count: 15,245,130 (10 classes) / 15,291,300 (100 classes), i.e. the
15.25M / 15.29M of the reference."""

from __future__ import annotations


import torch
from torch import nn

from .init import init_weights

__all__ = ["VGG16", "VGG16_CONFIG"]

#: Convolution widths of VGG-16; "M" is a 2x2 max-pool with stride 2.
VGG16_CONFIG: tuple[int | str, ...] = (
    64, 64, "M",
    128, 128, "M",
    256, 256, 256, "M",
    512, 512, 512, "M",
    512, 512, 512, "M",
)


class VGG16(nn.Module):
    """VGG-16 without BatchNorm, with the 512-512 dropout classifier of the SWA paper.

    Args:
        num_classes: number of output logits.
        in_channels: channels of the input image."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG16_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers.append(nn.Conv2d(channels, int(item), kernel_size=3, padding=1))
                layers.append(nn.ReLU(inplace=True))
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(512, 512), nn.ReLU(inplace=True),
                                        nn.Dropout(), nn.Linear(512, 512), nn.ReLU(inplace=True),
                                        nn.Linear(512, num_classes))
        init_weights(self, conv="he")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)
