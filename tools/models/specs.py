"""A factory model's spec: ``module.path:callable``, weights, class names, and its preprocessing.

A plain model has no image processor, so the preprocessing is part of the spec: ``image_size``
(height, width), ``channels`` (1: greyscale 'L' images, 3: RGB), and the per-channel ``mean`` / ``std``
applied after scaling pixels to [0, 1] -- what ``torchvision.transforms.ToTensor`` + ``Normalize`` do.
``sources`` says where each came from: a flag, or ``default`` until the model is built and
:func:`tools.models.input_shape.resolve_factory_spec` resolves it from the model (:meth:`FactorySpec.with_shape`).
:func:`parse_labels`, :func:`parse_image_size` and :func:`parse_floats` read the command-line values.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tools.models.base import IMAGENET_MEAN, IMAGENET_STD, ModelLoadError, build_preprocess
from tools.text import first_line, preview

DEFAULT_IMAGE_SIZE = (224, 224)
#: ``FactorySpec.sources`` value of a number no flag gave (the model decides it when it is built).
DEFAULT_SOURCE = "default"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``module.path:callable``.
FACTORY_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}$")


def parse_labels(value: str | Sequence[str] | None) -> list[str]:
    """Class names: comma-separated (``"cat,dog"``), a file with one name per line, or a list; [] for None.

    Blank lines of a file are skipped; names are stripped; empty names are errors (repeated ones are kept).
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ModelLoadError("--labels is empty: give comma-separated class names or a file, one name per line")
        path = Path(text).expanduser()
        if path.is_file():
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"cannot read labels file {text}: {first_line(exc)}") from exc
            names = [line.strip() for line in lines if line.strip()]
            if not names:
                raise ModelLoadError(f"labels file {text} has no class names (one name per line)")
        elif "," in text:
            names = [part.strip() for part in text.split(",")]
        else:
            raise ModelLoadError(
                f"--labels {text!r} is neither a file nor a comma-separated list: "
                "give 'name0,name1,...' or a file with one class name per line"
            )
    else:
        names = [str(v).strip() for v in value]
    if any(not name for name in names):
        raise ModelLoadError(f"--labels has an empty class name at position {names.index('')}: {preview(names)}")
    return names  # a name may repeat (ImageNet-1k has 'crane' twice): label matching handles duplicates


def parse_image_size(value: str | int | Sequence[int]) -> tuple[int, int]:
    """(height, width) from ``"32"``, ``"32x48"`` (height x width), an int, or a pair."""
    parts: list[Any]
    if isinstance(value, bool):
        parts = []
    elif isinstance(value, int):
        parts = [value, value]
    elif isinstance(value, str):
        text = value.strip().lower().replace("×", "x")
        parts = [p.strip() for p in text.split("x")] if "x" in text else [text, text]
    else:
        parts = list(value)
        if len(parts) == 1:
            parts = parts * 2
    try:
        if len(parts) != 2:
            raise ValueError
        height, width = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ModelLoadError(f"--image-size {value!r}: give one size (32) or height x width (32x48)") from None
    if height < 1 or width < 1:
        raise ModelLoadError(f"--image-size {value!r}: sizes must be positive")
    return height, width


def parse_floats(value: str | float | Sequence[float], name: str = "value") -> list[float]:
    """Floats from ``"0.5"``, ``"0.485,0.456,0.406"``, a number, or a sequence (finite values only)."""
    items: list[Any]
    if isinstance(value, bool):
        items = [None]
    elif isinstance(value, int | float):
        items = [value]
    elif isinstance(value, str):
        items = [p.strip() for p in value.strip().strip("()[]").split(",")]
    else:
        items = list(value)
    try:
        floats = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ModelLoadError(
            f"--{name} {value!r}: give one number or comma-separated numbers (0.485,0.456,0.406)"
        ) from None
    if not floats or not all(math.isfinite(v) for v in floats):
        raise ModelLoadError(f"--{name} {value!r}: give finite numbers")
    return floats


def is_factory_spec(spec: str) -> bool:
    """Whether ``spec`` reads as ``module.path:callable`` (and is not an existing directory)."""
    return bool(FACTORY_RE.match(spec.strip())) and not Path(spec).is_dir()


class Preprocessing(BaseModel):
    """How images become model inputs: resize, 'L' (1 channel) or 'RGB' (3), scale to [0, 1], normalise."""

    model_config = ConfigDict(extra="forbid")

    image_size: tuple[int, int] = Field(description="(height, width) the images are resized to.")
    channels: int = Field(description="1: greyscale 'L' images; 3: RGB.")
    mean: list[float] = Field(description="Per-channel mean subtracted after scaling to [0, 1].")
    std: list[float] = Field(description="Per-channel std divided by after subtracting the mean.")
    crop: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Center crop: the image is resized, aspect kept, to cover image_size / crop, and image_size is "
        "cut from its center (timm's crop_pct; torchvision's 224 of 256: 0.875). None: the whole image is resized "
        "to image_size.",
    )

    @field_validator("image_size")
    @classmethod
    def _positive_size(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) < 1:
            raise ValueError(f"image_size {value} must be positive")
        return value

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: int) -> int:
        if value not in (1, 3):
            raise ValueError(f"channels must be 1 (greyscale) or 3 (RGB), not {value}")
        return value

    @model_validator(mode="after")
    def _broadcast(self) -> Preprocessing:
        for name in ("mean", "std"):
            values: list[float] = getattr(self, name)
            if len(values) == 1 and self.channels > 1:
                setattr(self, name, values * self.channels)
            elif len(values) != self.channels:
                raise ValueError(
                    f"{len(values)} {name} values for {self.channels} channels: give one value or one per channel"
                )
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be positive, not {self.std}")
        return self

    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width)."""
        return (self.channels, *self.image_size)


class FactorySpec(Preprocessing):
    """A plain PyTorch classifier: its factory, weights, class names and preprocessing."""

    factory: str = Field(description="'module.path:callable' that builds the model with no arguments.")
    weights: str | None = Field(default=None, description="State dict file (safetensors or torch); None: untrained.")
    labels: list[str] = Field(default_factory=list, description="Class names in output order; [] for class_N.")
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="Where channels, image_size, mean and std came from: a flag ('--channels'), 'default' "
        "(resolved from the model when it is built), or what the model said ('first convolution conv1').",
    )

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str) -> str:
        value = value.strip()
        if not FACTORY_RE.match(value):
            raise ValueError(f"factory {value!r} must read module.path:callable")
        return value

    @classmethod
    def from_options(
        cls,
        factory: str,
        *,
        weights: str | os.PathLike[str] | None = None,
        labels: str | Sequence[str] | None = None,
        image_size: str | int | Sequence[int] | None = None,
        mean: str | float | Sequence[float] | None = None,
        std: str | float | Sequence[float] | None = None,
        channels: int | str | None = None,
        crop: str | float | None = None,
    ) -> FactorySpec:
        """Parse command-line values (strings or parsed values) into a spec; ``ModelLoadError`` on bad input.

        Defaults: ``image_size`` 224x224; ``channels`` = the number of ``mean`` values when more than one,
        else 3; ``mean`` / ``std`` = the ImageNet statistics for 3 channels, 0.5 otherwise (one value is
        used for every channel). ``weights`` must exist and is stored as an absolute path. ``sources``
        marks the defaults (``default``), which the model replaces when it is built.
        """
        if not FACTORY_RE.match(factory.strip()):
            raise ModelLoadError(f"--model {factory!r} is not a factory: write module.path:callable")
        mean_values = None if mean is None else parse_floats(mean, "mean")
        std_values = None if std is None else parse_floats(std, "std")
        n_channels, channels_source = _channel_count(channels, mean_values, std_values)
        sources = {
            "image_size": DEFAULT_SOURCE if image_size is None else "--image-size",
            "mean": DEFAULT_SOURCE if mean is None else "--mean",
            "std": DEFAULT_SOURCE if std is None else "--std",
            "channels": channels_source,
            "crop": DEFAULT_SOURCE if crop is None else "--crop",
        }
        if mean_values is None:
            mean_values = list(IMAGENET_MEAN) if n_channels == 3 else [0.5]
        if std_values is None:
            std_values = list(IMAGENET_STD) if n_channels == 3 else [0.5]
        weights_path = _weights_file(weights)
        size = DEFAULT_IMAGE_SIZE if image_size is None else parse_image_size(image_size)
        crop_value = _crop_fraction(crop)
        try:
            return cls(
                factory=factory.strip(),
                weights=weights_path,
                labels=parse_labels(labels),
                image_size=size,
                mean=mean_values,
                std=std_values,
                channels=n_channels,
                crop=crop_value,
                sources=sources,
            )
        except ValidationError as exc:
            raise ModelLoadError(f"--model {factory}: {validation_message(exc)}") from None

    def given(self, name: str) -> bool:
        """Whether ``name`` (channels, image_size, mean, std) came from the user or the model, not a default.

        A spec without ``sources`` (saved before they were recorded) counts as given throughout.
        """
        return self.sources.get(name, "given") != DEFAULT_SOURCE

    def with_shape(
        self, channels: int, image_size: tuple[int, int], *, channels_source: str, size_source: str
    ) -> FactorySpec:
        """This spec for ``channels`` x ``image_size`` (resolved from the model), with its sources.

        Default ``mean`` / ``std`` follow the channels (ImageNet's for 3, 0.5 for 1); one value given for
        every channel is kept for the new number of channels.
        """
        values: dict[str, list[float]] = {}
        for name, imagenet in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
            current: list[float] = getattr(self, name)
            if not self.given(name):
                values[name] = list(imagenet) if channels == 3 else [0.5]
            else:
                values[name] = current[:1] if len(set(current)) == 1 else list(current)
        sources = {**self.sources, "channels": channels_source, "image_size": size_source}
        data = self.model_dump() | values | {"channels": channels, "image_size": image_size, "sources": sources}
        return FactorySpec.model_validate(data)

    def describe_preprocessing(self) -> str:
        """How images become inputs and where each setting came from, in one line for the report."""

        def source(name: str) -> str:
            found = self.sources.get(name, "given")
            return "default" if found == DEFAULT_SOURCE else found

        height, width = self.image_size
        crop = (
            f"the center cut from the image resized to cover {height / self.crop:.0f} px, aspect kept "
            f"(crop {self.crop:g}: {source('crop')})"
            if self.crop is not None
            else "the whole image resized (no crop)"
        )
        values = ", ".join(
            f"{name} {[round(v, 4) for v in getattr(self, name)]} ({source(name)})" for name in ("mean", "std")
        )
        return f"preprocessing: {height} × {width} px, {crop}; {values}"

    def preprocessing(self) -> Preprocessing:
        return Preprocessing(
            image_size=self.image_size, channels=self.channels, mean=self.mean, std=self.std, crop=self.crop
        )


def _channel_count(channels: int | str | None, mean: list[float] | None, std: list[float] | None) -> tuple[int, str]:
    """The number of channels and where it came from: ``--channels``; else the number of ``mean`` (then ``std``)
    values when more than one; else 3, a default."""
    if channels is None:
        counts = [(len(v), n) for v, n in ((mean, "--mean"), (std, "--std")) if v and len(v) > 1]
        return (counts[0][0], f"{counts[0][1]} ({counts[0][0]} values)") if counts else (3, DEFAULT_SOURCE)
    try:
        return int(channels), "--channels"
    except (TypeError, ValueError):
        raise ModelLoadError(f"--channels {channels!r}: give 1 (greyscale) or 3 (RGB)") from None


def _weights_file(weights: str | os.PathLike[str] | None) -> str | None:
    """``--weights`` as an absolute path (``ModelLoadError`` when it is not a file); None: none given (untrained)."""
    if weights is None:
        return None
    path = Path(weights).expanduser()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else f"no such file ({path.resolve()})"
        raise ModelLoadError(
            f"--weights {str(weights)!r}: {what}; pass the model's state dict file, "
            "or leave --weights out to run the model untrained"
        )
    return str(path.resolve())


def _crop_fraction(crop: str | float | None) -> float | None:
    """``--crop`` as one number in (0, 1] (``ModelLoadError`` otherwise); None: none given (no crop)."""
    crop_values = None if crop is None else parse_floats(crop, "crop")
    if crop_values is not None and (len(crop_values) != 1 or not 0 < crop_values[0] <= 1):
        raise ModelLoadError(f"--crop {crop!r}: give one number in (0, 1], e.g. 0.875 (224 of 256)")
    return None if crop_values is None else crop_values[0]


def validation_message(exc: ValidationError) -> str:
    """The first error of a pydantic validation, on one line: ``field: message``."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def preprocess_for(spec: Preprocessing | Mapping[str, Any]) -> Callable[[list[Image.Image]], torch.Tensor]:
    """Images -> normalised batch ``(N, channels, height, width)`` for a factory model.

    Reuses :func:`tools.models.base.build_preprocess` (no processor): ``convert('L' | 'RGB')``, bilinear resize
    to ``image_size`` (after a center crop where ``crop`` is set), scale to [0, 1], ``(x - mean) / std``.
    """
    pre = spec if isinstance(spec, Preprocessing) else Preprocessing.model_validate(dict(spec))
    return build_preprocess(None, pre.input_shape(), mean=list(pre.mean), std=list(pre.std), crop=pre.crop)
