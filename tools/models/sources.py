"""Where models come from: a registry of model sources, behind one ``acquire_model`` verb.

Sources (tried in order, first that ``accepts`` the spec wins):

* ``builtin`` — the paper's four architectures (``vit-b16``, ``deit-b16``, ``swin-b``, ``resnet-101``)
  built from their published configurations with seeded random weights: no network, marked untrained.
* ``demo`` — the small digits classifiers that ship with the package (``digits-vit``, ``digits-cnn``).
* ``local`` — a directory in ``save_pretrained`` format.
* ``hub`` — a Hugging Face hub id (needs the network, or the local HF cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"
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


def _builtin_configs() -> dict[str, Callable[[], Any]]:
    from transformers import DeiTConfig, ResNetConfig, SwinConfig, ViTConfig

    def labels() -> dict[str, Any]:
        return {"num_labels": 1000}

    return {
        "vit-b16": lambda: ViTConfig(
            architectures=["ViTForImageClassification"],
            image_size=224,
            patch_size=16,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            **labels(),
        ),
        "deit-b16": lambda: DeiTConfig(
            architectures=["DeiTForImageClassification"],
            image_size=224,
            patch_size=16,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            **labels(),
        ),
        "swin-b": lambda: SwinConfig(
            architectures=["SwinForImageClassification"],
            image_size=224,
            patch_size=4,
            embed_dim=128,
            depths=[2, 2, 18, 2],
            num_heads=[4, 8, 16, 32],
            window_size=7,
            **labels(),
        ),
        "resnet-101": lambda: ResNetConfig(
            architectures=["ResNetForImageClassification"],
            embedding_size=64,
            hidden_sizes=[256, 512, 1024, 2048],
            depths=[3, 4, 23, 3],
            layer_type="bottleneck",
            downsample_in_first_stage=False,
            **labels(),
        ),
    }


BUILTIN_MODELS = ("vit-b16", "deit-b16", "swin-b", "resnet-101")
DEMO_MODELS = {"digits-vit": ASSETS / "digits-vit", "digits-cnn": ASSETS / "digits-cnn"}


def family_of(model: nn.Module) -> str:
    """The model family used by planners: the HF ``model_type`` when known, else ``cnn``/``transformer``."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str) and model_type:
        return model_type
    has_attention = any("attention" in type(m).__name__.lower() for m in model.modules())
    return "transformer" if has_attention else "cnn"


def _id2label(model: nn.Module) -> dict[int, str]:
    config = getattr(model, "config", None)
    mapping = getattr(config, "id2label", None) or {}
    return {int(k): str(v) for k, v in mapping.items()}


def _load_builtin(spec: str) -> LoadedModel:
    from transformers import AutoModelForImageClassification, ViTImageProcessor

    config = _builtin_configs()[spec]()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForImageClassification.from_config(config)
    processor = ViTImageProcessor(size={"height": 224, "width": 224}, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
    return LoadedModel(
        model=model.eval(),
        processor=processor,
        family=family_of(model),
        source="builtin",
        spec=spec,
        untrained=True,
        id2label=_id2label(model),
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (no retries, no long waits)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _read_config(spec: str, source: str) -> Any:
    """The model's config: local files first, then the hub if it can be reached (failing fast if not)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/HF errors here
        if source != "hub":
            raise ModelLoadError(f"cannot read a model config from directory {spec!r}: {_first_line(exc)}") from exc
    if not hub_reachable():
        raise ModelLoadError(
            f"model {spec!r} is not a local directory, not in the Hugging Face cache, and the hub cannot be "
            "reached: pass a save_pretrained directory or check the network"
        )
    try:
        return AutoConfig.from_pretrained(spec)
    except Exception as exc:
        raise ModelLoadError(f"cannot load {spec!r} from the Hugging Face hub: {_first_line(exc)}") from exc


def _load_pretrained(spec: str, source: str) -> LoadedModel:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    config = _read_config(spec, source)
    try:
        model = AutoModelForImageClassification.from_pretrained(spec, config=config)
    except ValueError as exc:
        raise ModelLoadError(
            f"{spec!r} is a {config.model_type!r} model, not an image classifier: "
            "pass a model with an image-classification head"
        ) from exc
    try:
        processor = AutoImageProcessor.from_pretrained(spec)
    except Exception as exc:  # no preprocessor_config.json
        logger.warning("no image processor for %s (%s); using config-derived preprocessing", spec, exc)
        processor = None
    untrained = False
    marker = Path(spec) / "profiling_agent.json"
    if marker.is_file():
        import json

        untrained = bool(json.loads(marker.read_text()).get("untrained", False))
    return LoadedModel(
        model=model.eval(),
        processor=processor,
        family=family_of(model),
        source=source,
        spec=spec,
        untrained=untrained,
        id2label=_id2label(model),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass(frozen=True)
class ModelSource:
    name: str
    accepts: Callable[[str], bool]
    load: Callable[[str], LoadedModel]


def _is_factory(spec: str) -> bool:
    from tools.models.factory import is_factory_spec

    return is_factory_spec(spec)


def _load_factory(spec: str, options: Mapping[str, Any] | None = None) -> LoadedModel:
    from tools.models.factory import FactorySpec, build_factory_model

    if options is not None:
        return build_factory_model(FactorySpec.model_validate({**options, "factory": spec}))
    return build_factory_model(FactorySpec.from_options(spec))


MODEL_SOURCES: list[ModelSource] = [
    ModelSource("builtin", lambda s: s in BUILTIN_MODELS, _load_builtin),
    ModelSource("demo", lambda s: s in DEMO_MODELS, lambda s: _load_pretrained(str(DEMO_MODELS[s]), "demo")),
    ModelSource("factory", _is_factory, _load_factory),
    ModelSource("local", lambda s: Path(s).is_dir(), lambda s: _load_pretrained(s, "local")),
    ModelSource(
        "hub",
        lambda s: not Path(s).exists() and s.count("/") <= 1 and not s.startswith((".", "/")),
        lambda s: _load_pretrained(s, "hub"),
    ),
]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available: use --device cpu")
    return torch.device(device)


def acquire_model(spec: str, device: str = "cpu", factory_options: Mapping[str, Any] | None = None) -> LoadedModel:
    """Load ``spec`` through the first model source that accepts it, in eval mode on ``device``.

    ``factory_options`` (``FactorySpec`` fields but ``factory``) apply to a ``module:factory`` spec only.
    """
    if factory_options is not None:
        if not _is_factory(spec):
            raise ModelLoadError(
                f"--weights/--labels/--image-size/--mean/--std/--channels: only for --model module.path:factory, "
                f"not {spec!r}"
            )
        loaded = _load_factory(spec, factory_options)
    else:
        for source in MODEL_SOURCES:
            if source.accepts(spec):
                loaded = source.load(spec)
                break
        else:
            raise ModelLoadError(
                f"model {spec!r} not found: give a Hugging Face id, a save_pretrained directory, "
                f"module.path:factory (with --weights), or one of {', '.join((*BUILTIN_MODELS, *DEMO_MODELS))}"
            )
    loaded.model.to(resolve_device(device))
    logger.info("acquired %s (%s, %s)", spec, type(loaded.model).__name__, loaded.source)
    return loaded


def build_preprocess(
    processor: Any | None,
    shape: tuple[int, int, int],
    mean: list[float] | None = None,
    std: list[float] | None = None,
) -> Callable[[list[Image.Image]], torch.Tensor]:
    """Images -> ``pixel_values`` batch: the HF processor when there is one, else resize + normalise."""
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

        arrays = [
            np.asarray(img.convert(mode).resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32)
            for img in images
        ]
        batch = torch.from_numpy(np.stack(arrays)) / 255.0
        batch = batch.unsqueeze(1) if channels == 1 else batch.permute(0, 3, 1, 2)
        return (batch - mean_t) / std_t

    return plain_preprocess


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
