"""Models that need no download: the paper's four architectures (untrained) and the bundled digits demos.

* :data:`BUILTIN_MODELS` -- ``vit-b16``, ``deit-b16``, ``swin-b``, ``resnet-101``, built from their
  published configurations with seeded random weights (:func:`load_builtin`), marked untrained.
* :data:`DEMO_MODELS` -- the small digits classifiers in :data:`ASSETS` (``digits-vit``, ``digits-cnn``),
  ``save_pretrained`` directories.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tools.models.base import IMAGENET_MEAN, IMAGENET_STD, LoadedModel, family_of, id2label_of

ASSETS = Path(__file__).resolve().parent / "assets"
BUILTIN_MODELS = ("vit-b16", "deit-b16", "swin-b", "resnet-101")
DEMO_MODELS = {"digits-vit": ASSETS / "digits-vit", "digits-cnn": ASSETS / "digits-cnn"}


def _builtin_configs() -> dict[str, Callable[[], Any]]:
    from transformers import DeiTConfig, ResNetConfig, SwinConfig, ViTConfig

    def labels() -> dict[str, Any]:
        return {"num_labels": 1000}

    def base_16(architecture: str) -> dict[str, Any]:
        """The ViT-B/16 shape at 224 px (which DeiT-B/16 shares) for ``architecture``, with the labels."""
        return {
            "architectures": [architecture],
            "image_size": 224,
            "patch_size": 16,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            **labels(),
        }

    return {
        "vit-b16": lambda: ViTConfig(**base_16("ViTForImageClassification")),
        "deit-b16": lambda: DeiTConfig(**base_16("DeiTForImageClassification")),
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


def load_builtin(spec: str) -> LoadedModel:
    """One of :data:`BUILTIN_MODELS` with seeded (seed 0) random weights and an ImageNet 224x224 processor."""
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
        id2label=id2label_of(model),
    )
