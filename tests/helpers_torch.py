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
