"""What a model says about its input: channels and image size, each candidate proven by a dry forward pass.

The paper's Input Shape Resolver. Candidates, in order, each with where it came from:

* **channels**: the user's flag; the first convolution (a CNN's stem, a ViT's patch embedding); the
  config's ``num_channels``; a timm ``pretrained_cfg`` ``input_size``; the first Linear when it takes the
  flattened image (784 = 1 x 28 x 28); the dataset's images (all greyscale: 1); then 3 and 1.
* **image size**: the user's flag; the processor's ``crop_size`` / ``size``; the config's ``image_size``;
  a timm ``input_size``; the position embeddings of a ViT (197 positions = 14 x 14 patches of 16 + a class
  token: 224); the first Linear of a flattened image; the dataset's images (when they share one size); 224;
  then the usual sizes (32, 28, 64, ...) -- a convolution stack that ends in a fixed Linear (LeNet's
  ``Linear(320, 50)``) runs on the first that gives the Linear its features.

The first (channels, size) pair that runs the model -- one image in, one row of logits out (as many as the
model has labels, when known) -- wins; :class:`~tools.schemas.InputShape` records ``channels_source`` and
``size_source``. :func:`resolve_factory_spec` does this for a factory model whose ``--channels`` /
``--image-size`` were not given, before the model is saved; :func:`resolve_loaded_shape` for any loaded model.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, Field
from torch import nn

from tools.models.base import LoadedModel, ModelLoadError, logits_of
from tools.models.specs import FactorySpec
from tools.schemas import InputShape
from tools.text import first_line

logger = logging.getLogger(__name__)

#: Sizes tried after everything the model, its processor and the data say (and the 224 default).
USUAL_SIZES = (32, 28, 64, 96, 128, 48, 256, 299, 384, 512, 160, 192, 16)
#: Image modes whose pixels are one channel.
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"})
_POSITION_NAME = re.compile(r"pos(ition(al)?)?_?emb", re.IGNORECASE)

Size = tuple[int, int]
Candidate = tuple[Any, str]  # (value, where it came from)


class ImageHints(BaseModel):
    """What a dataset's images say about the input: one channel when all are greyscale, their common size."""

    channels: int | None = Field(default=None, description="1 when every image is greyscale, 3 when any is colour.")
    size: Size | None = Field(default=None, description="(height, width) when every image has it, else None.")
    images: int = Field(default=0, description="How many images were looked at.")


def image_hints(images: Sequence[Image.Image]) -> ImageHints:
    """:class:`ImageHints` of decoded PIL images (an empty hint for no images)."""
    if not images:
        return ImageHints()
    modes = {image.mode for image in images}
    sizes = {(image.height, image.width) for image in images}
    return ImageHints(
        channels=1 if modes <= GREY_MODES else 3,
        size=next(iter(sizes)) if len(sizes) == 1 else None,
        images=len(images),
    )


# ---------------------------------------------------------------------------------------------- the model


def first_module(model: nn.Module, kind: type[nn.Module] | tuple[type[nn.Module], ...]) -> tuple[str, Any] | None:
    """The first submodule (in registration order) of ``kind``, with its name; None when there is none."""
    for name, module in model.named_modules():
        if isinstance(module, kind):
            return name or type(module).__name__, module
    return None


def _first_convolution(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels > 0:  # not a LazyConv2d yet
            return name or type(module).__name__, module
    return None


def _flat_linear(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """The first Linear when no convolution comes before it: it takes the flattened image."""
    found = first_module(model, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear))
    if found is None or not isinstance(found[1], nn.Linear) or found[1].in_features < 1:
        return None
    return found  # type: ignore[return-value]


def _is_patch_embedding(conv: nn.Conv2d) -> bool:
    kernel, stride = tuple(conv.kernel_size), tuple(conv.stride)
    return kernel == stride and max(kernel) > 1


def _config_value(model: nn.Module, name: str) -> Any:
    return getattr(getattr(model, "config", None), name, None)


def _timm_cfgs(model: nn.Module) -> list[tuple[str, dict[str, Any]]]:
    """(attribute, dict) of the configs a timm model carries: ``pretrained_cfg``, then the older ``default_cfg``."""
    found = [(attr, getattr(model, attr, None)) for attr in ("pretrained_cfg", "default_cfg")]
    return [(attr, cfg) for attr, cfg in found if isinstance(cfg, dict)]


def _timm_input_size(model: nn.Module) -> tuple[int, int, int] | None:
    for _, cfg in _timm_cfgs(model):
        value = cfg.get("input_size")
        if isinstance(value, list | tuple) and len(value) == 3 and all(isinstance(v, int) and v > 0 for v in value):
            return int(value[0]), int(value[1]), int(value[2])
    return None


def channel_candidates(model: nn.Module, hints: ImageHints | None = None) -> list[Candidate]:
    """(channels, source) the model suggests, most specific first, then the dataset's images, then 3 and 1."""
    found: list[Candidate] = []
    conv = _first_convolution(model)
    if conv is not None:
        kind = "patch embedding" if _is_patch_embedding(conv[1]) else "first convolution"
        found.append((conv[1].in_channels, f"{kind} {conv[0]}"))
    num_channels = _config_value(model, "num_channels")
    if isinstance(num_channels, int) and num_channels > 0:
        found.append((num_channels, "config.num_channels"))
    timm = _timm_input_size(model)
    if timm is not None:
        found.append((timm[0], "pretrained_cfg.input_size"))
    linear = _flat_linear(model)
    if linear is not None:
        name, layer = linear
        for channels in (1, 3):
            side = _square_side(layer.in_features, channels)
            if side is not None:
                found.append((channels, f"first Linear {name} ({layer.in_features} = {channels}×{side}×{side} inputs)"))
    if hints is not None and hints.channels is not None:
        found.append((hints.channels, "dataset images are " + ("greyscale" if hints.channels == 1 else "colour")))
    found += [(3, "default 3 (RGB)"), (1, "1 (greyscale), the only other choice")]
    return _unique(found)


def _square_side(features: int, channels: int) -> int | None:
    if features % channels:
        return None
    side = math.isqrt(features // channels)
    return side if side > 0 and side * side * channels == features else None


def _processor_sizes(processor: Any) -> Iterator[Candidate]:
    for attr in ("crop_size", "size"):
        size = getattr(processor, attr, None) if processor is not None else None
        if size is None:
            continue
        if attr == "crop_size" and getattr(processor, "do_center_crop", True) is False:
            continue  # never applied (EfficientNet: crop_size 289, size 224): the processor's output is ``size``
        if isinstance(size, int):
            yield (size, size), f"processor.{attr}"
            continue

        def get(key: str, size: Any = size) -> Any:
            return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

        height, width = get("height"), get("width")
        if height is None and get("shortest_edge") is not None:
            height = width = get("shortest_edge")
        if height and width:
            yield (int(height), int(width)), f"processor.{attr}"


def _position_sizes(model: nn.Module) -> Iterator[Candidate]:
    """Sizes whose patch grid fills a ViT's position embeddings (with 1 or 2 class tokens, or none)."""
    conv = _first_convolution(model)
    if conv is None or not _is_patch_embedding(conv[1]):
        return
    patch_h, patch_w = conv[1].kernel_size
    for name, param in model.named_parameters():
        parts = name.split(".")
        leaf = parts[-2] if parts[-1] == "weight" and len(parts) > 1 else parts[-1]
        if not _POSITION_NAME.search(leaf) or param.ndim not in (2, 3) or (param.ndim == 3 and param.shape[0] != 1):
            continue
        positions = int(param.shape[-2])
        for tokens, what in ((1, " + 1 class token"), (2, " + 2 class tokens"), (0, "")):
            side = _square_side(positions - tokens, 1) if positions > tokens else None
            if side is not None:
                size = (side * patch_h, side * patch_w)
                yield size, f"position embeddings {name} ({positions} = {side}×{side} patches of {patch_h}{what})"
        return


def size_candidates(
    model: nn.Module, processor: Any = None, channels: int = 3, hints: ImageHints | None = None
) -> list[Candidate]:
    """((height, width), source) for ``channels``: processor, config, timm, position embeddings, first Linear,
    the dataset's images, 224, then :data:`USUAL_SIZES`."""
    found: list[Candidate] = list(_processor_sizes(processor))
    image_size = _config_value(model, "image_size")
    if isinstance(image_size, int) and image_size > 0:
        found.append(((image_size, image_size), "config.image_size"))
    elif isinstance(image_size, list | tuple) and len(image_size) >= 2:
        found.append(((int(image_size[0]), int(image_size[1])), "config.image_size"))
    timm = _timm_input_size(model)
    if timm is not None:
        found.append(((timm[1], timm[2]), "pretrained_cfg.input_size"))
    found += list(_position_sizes(model))
    linear = _flat_linear(model)
    if linear is not None:
        name, layer = linear
        side = _square_side(layer.in_features, channels)
        if side is not None:
            found.append(((side, side), f"first Linear {name} ({layer.in_features} = {channels}×{side}×{side} inputs)"))
    if hints is not None and hints.size is not None:
        found.append((hints.size, "dataset images are all this size"))
    found.append(((224, 224), "default 224×224"))
    found += [((s, s), "usual size") for s in USUAL_SIZES]
    return _unique(found)


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    seen: set[Any] = set()
    kept = []
    for value, source in candidates:
        if value not in seen:
            seen.add(value)
            kept.append((value, source))
    return kept


# ---------------------------------------------------------------------------------------------- dry runs


def _linear_input(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """The first Linear that comes after a convolution (its input is what the convolutions left)."""
    seen_conv = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            seen_conv = True
        elif isinstance(module, nn.Linear) and seen_conv:
            return name, module
    return None


def dry_run_problem(model: nn.Module, shape: InputShape, num_labels: int | None = None) -> str | None:
    """Why one random input of ``shape`` does not run the model (None: one row of logits comes out)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = torch.randn(1, *shape.as_tuple(), generator=torch.Generator().manual_seed(0)).to(device)
    try:
        with torch.no_grad():
            logits = logits_of(model(example))
    except Exception as exc:  # a wrong shape raises anything from RuntimeError to ValueError
        return f"{type(exc).__name__}: {first_line(exc)}" if str(exc) else type(exc).__name__
    if logits.ndim != 2 or logits.shape[0] != 1:
        return f"one image gave an output of shape {tuple(logits.shape)}, not (1, classes)"
    if num_labels and logits.shape[-1] != num_labels:
        return f"the model gave {logits.shape[-1]} logits instead of {num_labels}"
    return None


def _fits_linear(model: nn.Module, shape: InputShape) -> str | None:
    """``first Linear NAME (N inputs)`` when ``shape`` gives the first Linear after the convolutions its
    ``in_features`` from one flattened image (so that Linear fixes the size); else None."""
    found = _linear_input(model)
    if found is None:
        return None
    name, layer = found
    seen: list[torch.Size] = []
    handle = layer.register_forward_pre_hook(lambda _module, args: seen.append(args[0].shape) if args else None)
    try:
        dry_run_problem(model, shape)
    finally:
        handle.remove()
    if seen and seen[0] == (1, layer.in_features):
        return f"first Linear {name} ({layer.in_features} inputs)"
    return None


def resolve_shape(
    model: nn.Module,
    channels: Sequence[Candidate],
    sizes: Sequence[Candidate] | None = None,
    *,
    processor: Any = None,
    hints: ImageHints | None = None,
    num_labels: int | None = None,
) -> InputShape:
    """The first (channels, size) candidate pair that runs ``model``; ``ModelLoadError`` naming the tries.

    ``sizes`` None: :func:`size_candidates` for each number of channels.
    """
    model.eval()
    tried: list[str] = []
    for n_channels, channels_source in channels:
        options = size_candidates(model, processor, n_channels, hints) if sizes is None else sizes
        failed_sizes = False
        for (height, width), size_source in options:
            shape = InputShape(
                channels=n_channels,
                height=height,
                width=width,
                channels_source=channels_source,
                size_source=size_source,
            )
            problem = dry_run_problem(model, shape, num_labels)
            if problem is None:
                if size_source == "usual size" and failed_sizes:
                    fits = _fits_linear(model, shape)
                    shape.size_source = fits or f"first usual size that runs the model ({len(tried)} tried)"
                shape.source = f"{shape.channels_source}; {shape.size_source}"
                logger.info("input shape %s: %s (after %d tries)", shape.as_tuple(), shape.describe(), len(tried))
                return shape
            failed_sizes = True
            tried.append(f"{(1, n_channels, height, width)} ({channels_source}; {size_source}): {problem}")
    if not tried:
        raise ModelLoadError("no input shape to try: no channels or sizes were given")
    raise ModelLoadError(f"no input shape runs the model ({len(tried)} tried; the first: {tried[0]})")


def resolve_loaded_shape(
    loaded: LoadedModel, hints: ImageHints | None = None, device: str | torch.device | None = None
) -> InputShape:
    """The input shape of a loaded model (see the module doc); a factory model's is its resolved spec's."""
    model = loaded.model if device is None else loaded.model.to(device)
    pre = loaded.preprocessing
    if pre:  # a plain model's images are preprocessed to this shape: it is the only candidate
        spec = getattr(loaded, "factory_spec", None)
        sources = spec.sources if isinstance(spec, FactorySpec) else {}
        return resolve_shape(
            model,
            [(int(pre["channels"]), sources.get("channels", "the factory's preprocessing"))],
            [
                (
                    (int(pre["image_size"][0]), int(pre["image_size"][1])),
                    sources.get("image_size", "the factory's preprocessing"),
                )
            ],
            num_labels=loaded.num_labels or None,
        )
    return resolve_shape(
        model, channel_candidates(model, hints), processor=loaded.processor, hints=hints, num_labels=loaded.num_labels
    )


# ---------------------------------------------------------------------------------------------- factories


def _hint_for(model: nn.Module, channels: int) -> str:
    """What the model suggests instead of a failed flag: ``its first convolution conv1 takes 1 channel``."""
    for value, source in channel_candidates(model):
        if value != channels and not source.startswith(("default", "1 (greyscale)")):
            return f"; the model suggests {value} channel{'s' if value != 1 else ''} ({source})"
    return ""


def resolve_factory_spec(model: nn.Module, spec: FactorySpec) -> FactorySpec:
    """``spec`` with the channels, image size, mean, std and crop it did not get from a flag resolved from ``model``
    (the mean, std and crop from a timm model's ``pretrained_cfg``; else ImageNet's statistics stay, and the crop
    of torchvision's ImageNet weights for its factories).

    Flags win: a flag's value is the only candidate for its number, and when the flags do not run the
    model the error says what the model suggests. ``spec.sources`` records where each number came from.
    """
    return _crop_of(model, _normalisation_of(model, _resolve_shape_of(model, spec)))


def _timm_normalisation(model: nn.Module, channels: int) -> tuple[list[float], list[float]] | None:
    """The per-channel mean and std a timm model was trained with (its ``pretrained_cfg``), when they fit."""
    for _, cfg in _timm_cfgs(model):
        mean, std = _floats(cfg.get("mean"), channels), _floats(cfg.get("std"), channels)
        if mean is not None and std is not None and all(x > 0 for x in std):
            return mean, std
    return None


def _floats(value: object, count: int) -> list[float] | None:
    """``value`` as ``count`` floats, None when it is not a sequence of that many numbers."""
    if isinstance(value, list | tuple) and len(value) == count and all(isinstance(x, int | float) for x in value):
        return [float(x) for x in value]
    return None


def _normalisation_of(model: nn.Module, spec: FactorySpec) -> FactorySpec:
    """``spec`` with the mean and std it did not get from a flag taken from the model's timm ``pretrained_cfg``
    (timm's ViTs trained with AugReg use 0.5, not ImageNet's statistics); unchanged without one."""
    found = _timm_normalisation(model, spec.channels)
    wanted = [name for name in ("mean", "std") if not spec.given(name)]
    if found is None or not wanted:
        return spec
    values = dict(zip(("mean", "std"), found, strict=True))
    update: dict[str, object] = {name: values[name] for name in wanted}
    update["sources"] = {**spec.sources, **{name: f"pretrained_cfg.{name}" for name in wanted}}
    return spec.model_copy(update=update)


#: torchvision's ImageNet weights are evaluated at 224 px cut from 256 (its classic transforms; later weights cut
#: 224 from 232-256 or 1.0 of their size): the crop of a ``torchvision.models`` factory no flag or config sets.
TORCHVISION_CROP = 224 / 256


def _crop_of(model: nn.Module, spec: FactorySpec) -> FactorySpec:
    """``spec`` with the center crop it did not get from a flag: a timm model's ``pretrained_cfg.crop_pct`` (center
    crops only), torchvision's for its factories; unchanged otherwise (the whole image is resized)."""
    if spec.given("crop"):
        return spec
    for attr, cfg in _timm_cfgs(model):
        crop = cfg.get("crop_pct")
        if isinstance(crop, int | float) and 0 < crop <= 1 and cfg.get("crop_mode", "center") == "center":
            sources = {**spec.sources, "crop": f"{attr}.crop_pct"}
            return spec.model_copy(update={"crop": float(crop), "sources": sources})
    if spec.factory.startswith("torchvision.models"):
        source = "torchvision's ImageNet evaluation (224 of 256)"
        return spec.model_copy(update={"crop": TORCHVISION_CROP, "sources": {**spec.sources, "crop": source}})
    return spec


def _resolve_shape_of(model: nn.Module, spec: FactorySpec) -> FactorySpec:
    channels_given, size_given = spec.given("channels"), spec.given("image_size")
    if channels_given and size_given:
        shape = InputShape(channels=spec.channels, height=spec.image_size[0], width=spec.image_size[1])
        problem = dry_run_problem(model, shape)
        if problem is not None:
            raise ModelLoadError(
                f"the model does not run on a {(1, *shape.as_tuple())} input: {problem}"
                f"{_hint_for(model, spec.channels)} (check --image-size and --channels)"
            )
        return spec
    channels = [(spec.channels, spec.sources["channels"])] if channels_given else channel_candidates(model)
    sizes = [(spec.image_size, spec.sources["image_size"])] if size_given else None
    try:
        shape = resolve_shape(model, channels, sizes)
    except ModelLoadError as exc:
        hint = _hint_for(model, spec.channels) if channels_given else ""
        raise ModelLoadError(f"{spec.factory}: {exc}{hint} (give --image-size and --channels)") from None
    return spec.with_shape(
        shape.channels,
        (shape.height, shape.width),
        channels_source=shape.channels_source or "",
        size_source=shape.size_source or "",
    )
