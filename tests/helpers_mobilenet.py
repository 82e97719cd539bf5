"""A torchvision-style mobile CNN (inverted residuals holding a squeeze-excitation in their ``Sequential``)."""

from __future__ import annotations

import torch
from torch import nn


class SqueezeExcite(nn.Module):
    """torchvision's squeeze-excitation: a pooling module first, then two 1x1 convolutions scaling the input."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(self.avgpool(x)))))


class InvertedResidual(nn.Module):
    """torchvision's MBConv: expand, depthwise, squeeze-excitation and project in one ``Sequential``, a skip where
    the shape holds."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        wide = 4 * c_in
        self.block = nn.Sequential(
            nn.Sequential(nn.Conv2d(c_in, wide, 1, bias=False), nn.BatchNorm2d(wide), nn.Hardswish()),
            nn.Sequential(nn.Conv2d(wide, wide, 3, stride, 1, groups=wide, bias=False), nn.BatchNorm2d(wide)),
            SqueezeExcite(wide, c_in),
            nn.Sequential(nn.Conv2d(wide, c_out, 1, bias=False), nn.BatchNorm2d(c_out)),
        )
        self.skip = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        if self.skip:
            out += x  # in place, as torchvision does
        return out


class TinyMobileNet(nn.Module):
    """A stem, two stages of inverted residuals with squeeze-excitation (torchvision's layout), pool, classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()),
            nn.Sequential(InvertedResidual(8, 8), InvertedResidual(8, 8)),
            nn.Sequential(InvertedResidual(8, 16, 2), InvertedResidual(16, 16)),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def tiny_mobilenet() -> TinyMobileNet:
    return TinyMobileNet()
