"""The shared Hugging Face cifar10-vit-tiny written with plain ``torch.nn``: a factory module for ``--model`` and its
converted weights, outside the repo.

A user's ViT built from ``nn.TransformerEncoder`` (pre-norm ``nn.TransformerEncoderLayer``, GELU, batch first, one
fused ``in_proj_weight`` per ``nn.MultiheadAttention``) is what ``tools.compression.mha`` makes head-prunable. This
script writes such a model's module (``cifar_vit_torch.py``, factory ``cifar10_vit``) and the shared model's weights
converted to it (``cifar10-vit-torch.safetensors``) into ``--out``, checks on CIFAR-10 images that its logits are
the Hugging Face model's (in eval mode under ``no_grad``, where PyTorch runs its fused encoder-layer kernel, and once
more with every attention split into q/k/v/o layers, as the tool prunes it), and prints the run's command::

    python benchmarks/torch_nn_vit.py --out /work/scratch/torchvit
    cd /work/scratch/torchvit && profiling-agent run --model cifar_vit_torch:cifar10_vit ...   # as printed

The factory's module is found in the directory the run starts in (README: "importable factory").
"""

from __future__ import annotations

import argparse
import copy
import importlib
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODULE = "cifar_vit_torch"
FACTORY = "cifar10_vit"
WEIGHTS = "cifar10-vit-torch.safetensors"
DEPTH = 4

#: The factory module a user would write (image 32, patch 4, width 96, 4 layers of 4 heads, MLP 384, eps 1e-12).
SOURCE = '''"""A CIFAR-10 ViT written with plain torch.nn (written by benchmarks/torch_nn_vit.py)."""

import torch
from torch import nn


class TorchViT(nn.Module):
    def __init__(self, image_size=32, patch=4, dim=96, depth=4, heads=4, mlp=384, classes=10, eps=1e-12):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (image_size // patch) ** 2, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, mlp, dropout=0.0, activation="gelu", layer_norm_eps=eps, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x))[:, 0])


def cifar10_vit():
    return TorchViT()
'''

#: A Hugging Face ViT layer's modules -> the nn.TransformerEncoderLayer's.
LAYER_NAMES = {
    "layernorm_before": "norm1",
    "attention.output.dense": "self_attn.out_proj",
    "layernorm_after": "norm2",
    "intermediate.dense": "linear1",
    "output.dense": "linear2",
}


def converted(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hugging Face ViT's state dict in the torch.nn model's names; q, k and v concatenated into ``in_proj``."""
    out = {
        "cls_token": hf["vit.embeddings.cls_token"],
        "pos_embed": hf["vit.embeddings.position_embeddings"],
        "patch_embed.weight": hf["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.bias": hf["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": hf["vit.layernorm.weight"],
        "norm.bias": hf["vit.layernorm.bias"],
        "head.weight": hf["classifier.weight"],
        "head.bias": hf["classifier.bias"],
    }
    for i in range(DEPTH):
        hf_layer, layer = f"vit.encoder.layer.{i}.", f"encoder.layers.{i}."
        attention = hf_layer + "attention.attention."
        for kind in ("weight", "bias"):
            out[f"{layer}self_attn.in_proj_{kind}"] = torch.cat(
                [hf[f"{attention}{p}.{kind}"] for p in ("query", "key", "value")]
            )
            for hf_name, name in LAYER_NAMES.items():
                out[f"{layer}{name}.{kind}"] = hf[f"{hf_layer}{hf_name}.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


def cifar_images(data: Path, per_class: int) -> torch.Tensor:
    """The first ``per_class`` images of each class folder, preprocessed as the model expects (32 px, mean/std 0.5)."""
    from PIL import Image

    batch = []
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir())[:per_class]:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize((32, 32))
            pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1)
            batch.append((pixels / 255.0 - 0.5) / 0.5)
    return torch.stack(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for the factory module and the weights")
    parser.add_argument("--source", type=Path, default=SHARED / "models" / "cifar10-vit-tiny")
    parser.add_argument("--data", type=Path, default=SHARED / "data" / "cifar10-test")
    parser.add_argument("--per-class", type=int, default=2, help="images of each class the logits are compared on")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageClassification

    from tools.compression.mha import split_attention_

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    sys.path.insert(0, str(out))
    factory = getattr(importlib.import_module(MODULE), FACTORY)
    weights = converted(load_file(str(args.source / "model.safetensors")))
    model = factory().eval()
    model.load_state_dict(weights, strict=True)
    reference = AutoModelForImageClassification.from_pretrained(str(args.source)).eval()
    split = copy.deepcopy(model)
    split_attention_(split)
    images = cifar_images(args.data, args.per_class)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        gaps = {"torch.nn": model(images), "split attention": split(images)}
    for name, logits in gaps.items():
        gap = float((logits - expected).abs().max())
        if gap > 1e-4 or not torch.equal(logits.argmax(-1), expected.argmax(-1)):
            raise SystemExit(f"the {name} model's logits differ from {args.source}'s by {gap:.2e}")
        print(f"{name}: logits within {gap:.1e} of the Hugging Face model's on {len(images)} CIFAR-10 images")
    save_file(weights, str(out / WEIGHTS))
    labels = ",".join(reference.config.id2label[i] for i in sorted(reference.config.id2label))
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out / MODULE}.py ({FACTORY}: {type(model).__name__}, {params:,} parameters) and {out / WEIGHTS}")
    command = [
        "profiling-agent", "run", "--model", f"{MODULE}:{FACTORY}", "--weights", str(out / WEIGHTS),
        "--dataset", str(args.data.resolve()), "--image-size", "32", "--mean", "0.5", "--std", "0.5",
        "--labels", labels, "--run-dir", str(out / "run"),
    ]  # fmt: skip
    print(f"cd {shlex.quote(str(out))} && {shlex.join(command)}")


if __name__ == "__main__":
    main()
