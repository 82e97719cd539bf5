"""What every model source shares: the loaded-model record, its error, and how to feed a model and read it.

:class:`LoadedModel` (a model with its processor, family, source and labels), :class:`ModelLoadError`,
the ImageNet statistics, :func:`build_preprocess` (images -> ``pixel_values``), :func:`logits_of`
(logits from any model output), :func:`family_of`, :func:`id2label_of`, :func:`resolve_device` and
:func:`clone_module` (a deep copy that works on models caching tensors in ``forward``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from torch import nn

from tools.schemas import InputShape

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class ModelLoadError(ValueError):
    """A model spec that cannot be turned into an image classifier."""


@dataclass
class LoadedModel:
    """A model with what is needed to feed it images and read its labels."""

    model: nn.Module
    processor: Any | None
    family: str
    source: str
    spec: str
    untrained: bool = False
    id2label: dict[int, str] = field(default_factory=dict)
    preprocessing: dict[str, Any] | None = None
    """Plain PyTorch models (no processor): ``image_size`` [h, w], ``channels``, ``mean``, ``std``."""

    @property
    def num_labels(self) -> int:
        return len(self.id2label)


def family_of(model: nn.Module) -> str:
    """The model family used by planners: the HF ``model_type`` when known, else ``cnn``/``transformer``."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str) and model_type:
        return model_type
    has_attention = any("attention" in type(m).__name__.lower() for m in model.modules())
    return "transformer" if has_attention else "cnn"


def id2label_of(model: nn.Module) -> dict[int, str]:
    """Class index -> name from a Hugging Face model's config ({} when it has none)."""
    config = getattr(model, "config", None)
    mapping = getattr(config, "id2label", None) or {}
    return {int(k): str(v) for k, v in mapping.items()}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available: use --device cpu")
    return torch.device(device)


def build_preprocess(
    processor: Any | None,
    shape: tuple[int, int, int],
    mean: list[float] | None = None,
    std: list[float] | None = None,
    crop: float | None = None,
) -> Callable[[list[Image.Image]], torch.Tensor]:
    """Images -> ``pixel_values`` batch: the HF processor when there is one, else resize + normalise (``crop``: the
    image resized, aspect kept, to cover the size / crop, and the size cut from its center; None: squashed to it)."""
    if processor is not None:

        def hf_preprocess(images: list[Image.Image]) -> torch.Tensor:
            return processor(images=images, return_tensors="pt")["pixel_values"]

        return hf_preprocess

    channels, height, width = shape
    mean_t = torch.tensor(mean or [0.5] * channels).view(1, -1, 1, 1)
    std_t = torch.tensor(std or [0.5] * channels).view(1, -1, 1, 1)
    mode = "L" if channels == 1 else "RGB"

    def plain_preprocess(images: list[Image.Image]) -> torch.Tensor:
        import numpy as np

        arrays = [np.asarray(_resized(img.convert(mode), width, height, crop), dtype=np.float32) for img in images]
        batch = torch.from_numpy(np.stack(arrays)) / 255.0
        batch = batch.unsqueeze(1) if channels == 1 else batch.permute(0, 3, 1, 2)
        return (batch - mean_t) / std_t

    return plain_preprocess


def _resized(img: Image.Image, width: int, height: int, crop: float | None) -> Image.Image:
    """``img`` at ``width`` x ``height``: squashed to it, or (``crop``) resized to cover ``size / crop`` with its
    aspect kept, then cut from the center (timm's and torchvision's evaluation transform)."""
    if crop is None:
        return img.resize((width, height), Image.Resampling.BILINEAR)
    scale = max(math.floor(height / crop) / img.height, math.floor(width / crop) / img.width)
    covered = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
    left, top = (covered[0] - width) // 2, (covered[1] - height) // 2
    return img.resize(covered, Image.Resampling.BILINEAR).crop((left, top, left + width, top + height))


def logits_of(output: Any) -> torch.Tensor:
    """Logits from a model output: a tensor, a HF ModelOutput, a dict with ``logits``, or a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in a model output of type {type(output).__name__}")


class LogitsOnly(nn.Module):
    """``pixel_values -> logits`` for any classifier (HF models return a ModelOutput): what runtimes export."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return logits_of(self.model(pixel_values))


def example_input(
    shape: InputShape | dict[str, Any], batch: int = 1, device: str = "cpu", seed: int = 0
) -> torch.Tensor:
    """A seeded random float batch of the model's input shape (for tracing, dry runs and timing)."""
    shape = InputShape.model_validate(shape)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape.as_tuple(), generator=generator).to(resolve_device(device))


def _cached_tensors(value: Any, found: dict[int, torch.Tensor]) -> None:
    """Every tensor inside ``value`` (nested dicts, lists and tuples) that autograd computed, by id."""
    if isinstance(value, torch.Tensor):
        if not value.is_leaf:
            found[id(value)] = value
    elif isinstance(value, Mapping):
        for item in value.values():
            _cached_tensors(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _cached_tensors(item, found)


def clone_module(model: nn.Module) -> nn.Module:
    """A deep copy of ``model``, also where its ``forward`` caches tensors computed from its parameters in plain
    attributes (timm's LeViT and EfficientFormer keep ``attention_bias_cache``): ``copy.deepcopy`` refuses tensors
    autograd computed, so those are copied detached. Parameters, buffers and submodules are copied as deepcopy does."""
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for key, value in vars(module).items():
            if key not in ("_parameters", "_buffers", "_modules"):
                _cached_tensors(value, found)
    memo: dict[int, Any] = {key: tensor.detach().clone() for key, tensor in found.items()}
    return copy.deepcopy(model, memo)
