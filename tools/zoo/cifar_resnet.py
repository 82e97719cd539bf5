"""CIFAR ResNets of He et al. (2016), section 4.2: ResNet-20/32/44/56/110/1202 with the option-A shortcut.

The structure and parameter names match the widely used checkpoints (e.g. Yerlan Idelbayev's
``resnet20.th`` ... ``resnet1202.th``, once their ``module.`` prefix is stripped):

* ``conv1`` 3x3, 3 -> 16, stride 1, no bias; ``bn1``; ReLU;
* ``layer1``, ``layer2``, ``layer3``: ``n`` :class:`BasicBlock` each, 16 / 32 / 64 channels, the first
  block of a stage with stride 1 / 2 / 2 (ResNet-6n+2: n = 3, 5, 7, 9, 18, 200 for depth 20, 32, 44, 56,
  110, 1202);
* global average pooling and ``linear`` 64 -> ``num_classes``.

A block is ``conv1`` 3x3 (stride s, no bias) -> ``bn1`` -> ReLU -> ``conv2`` 3x3 -> ``bn2``, added to the
shortcut, then ReLU. The shortcut is the identity, or, where the shape changes, the parameter-free
"option A" of the paper: the input subsampled by taking every second pixel and zero-padded with
``planes // 4`` channels on each side of the channel axis (:class:`PadShortcut`).

Inputs: 32x32 RGB scaled to [0, 1] and normalised with the ImageNet mean (0.485, 0.456, 0.406) and
std (0.229, 0.224, 0.225).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR_MEAN = (0.485, 0.456, 0.406)
CIFAR_STD = (0.229, 0.224, 0.225)
CIFAR_IMAGE_SIZE = 32


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Conv2d):
        nn.init.kaiming_normal_(module.weight)


class PadShortcut(nn.Module):
    """Option-A shortcut: ``x[:, :, ::2, ::2]`` zero-padded with ``pad`` channels on each side."""

    def __init__(self, pad: int) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad), "constant", 0.0)

    def extra_repr(self) -> str:
        return f"pad={self.pad}"


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = PadShortcut(planes // 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs, three stages of ``num_blocks[i]`` basic blocks."""

    def __init__(self, num_blocks: tuple[int, int, int], num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(16, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(32, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(64, num_blocks[2], stride=2)
        self.linear = nn.Linear(64, num_classes)
        self.apply(_init_weights)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for block_stride in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, block_stride))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet(depth: int, num_classes: int = 10) -> CifarResNet:
    """ResNet-``depth`` for CIFAR; ``depth`` must be 6n + 2 (20, 32, 44, 56, 110, ...)."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"a CIFAR ResNet has depth 6n + 2 (20, 32, 44, 56, 110), not {depth}")
    n = (depth - 2) // 6
    return CifarResNet((n, n, n), num_classes=num_classes)


def resnet20() -> CifarResNet:
    return resnet(20)


def resnet32() -> CifarResNet:
    return resnet(32)


def resnet44() -> CifarResNet:
    return resnet(44)


def resnet56() -> CifarResNet:
    return resnet(56)


def resnet110() -> CifarResNet:
    return resnet(110)


def resnet1202() -> CifarResNet:
    return resnet(1202)


__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR_IMAGE_SIZE",
    "CIFAR_MEAN",
    "CIFAR_STD",
    "BasicBlock",
    "CifarResNet",
    "PadShortcut",
    "resnet",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
    "resnet110",
    "resnet1202",
]
