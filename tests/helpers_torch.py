"""Plain PyTorch models for the ``--model module:factory`` tests (importable as ``tests.helpers_torch:...``)."""

from __future__ import annotations

import torch
from torch import nn

GREY_LABELS = ["circle", "square", "triangle"]


class TinyGreyCNN(nn.Module):
    """1-channel (greyscale, MNIST-style) CNN: conv -> BN -> ReLU -> pool -> linear, 3 classes."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, num_classes)
        self.seen_shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen_shapes.append(tuple(x.shape))
        out = torch.relu(self.bn(self.conv(x)))
        return self.head(out.mean(dim=(2, 3)))


class TiedNet(nn.Module):
    """Two heads sharing one weight tensor (safetensors refuses shared storage unless handled)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, kernel_size=3, padding=1)
        self.proj = nn.Linear(5, 5, bias=False)
        self.head = nn.Linear(5, 5)
        self.head.weight = self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(self.conv(x).mean(dim=(2, 3)))))


class NotAllowed:
    """A custom class: a pickle holding it must be refused by ``torch.load(weights_only=True)``."""

    def __init__(self) -> None:
        self.payload = "anything"


def tiny_grey_cnn() -> TinyGreyCNN:
    return TinyGreyCNN()


def tied_net() -> TiedNet:
    return TiedNet()


def needs_arguments(width: int) -> nn.Module:
    return nn.Linear(width, 2)


def not_a_module() -> str:
    return "not a model"


NOT_CALLABLE = 42
