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


class VersionedNet(nn.Module):
    """A model whose block refuses a state without its version, as torchvision's MNASNet does."""

    class Block(nn.Module):
        _version = 2

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.versions_seen: list[object] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.bn(self.conv(x)))

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):  # type: ignore[no-untyped-def]
            version = local_metadata.get("version")
            if version not in (1, 2):
                raise ValueError(f"version should be set to 1 or 2 instead of {version}")
            self.versions_seen.append(version)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def __init__(self) -> None:
        super().__init__()
        self.block = VersionedNet.Block()
        self.mid = nn.Conv2d(8, 8, kernel_size=3, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mid(self.block(x))).mean(dim=(2, 3)))


class NotAllowed:
    """A custom class: a pickle holding it must be refused by ``torch.load(weights_only=True)``."""

    def __init__(self) -> None:
        self.payload = "anything"


def tiny_grey_cnn() -> TinyGreyCNN:
    return TinyGreyCNN()


def tied_net() -> TiedNet:
    return TiedNet()


def versioned_net() -> VersionedNet:
    return VersionedNet()


def needs_arguments(width: int) -> nn.Module:
    return nn.Linear(width, 2)


def not_a_module() -> str:
    return "not a model"


NOT_CALLABLE = 42
