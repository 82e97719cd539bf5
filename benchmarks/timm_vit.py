"""The shared Hugging Face cifar10-vit-tiny as timm builds it: a factory for ``--model`` and its converted weights.

timm's ``VisionTransformer`` holds each block's queries, keys and values in one ``qkv`` layer; the shared model's
weights, converted, give the same logits (checked when converting). The README's timm figure runs the tool on it::

    python benchmarks/timm_vit.py --out runs/timm/vit_cifar.safetensors        # converts and checks the logits
    PYTHONPATH=benchmarks profiling-agent run --model timm_vit:vit_cifar \\
        --weights runs/timm/vit_cifar.safetensors --image-size 32 --mean 0.5 --std 0.5 \\
        --labels airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck \\
        --dataset runs/figures/halves/a --run-dir runs/timm/vit --iterations 5 --threads 1

Needs timm, which needs torchvision (PyPI's build wants torch 2.14: ``pip install torch==2.14.1 torchvision==0.29.1
timm`` in a separate environment, with the project's other requirements).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import torch
from torch import nn

SHARED_VIT = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "cifar10-vit-tiny"
DEPTH = 4


def vit_cifar() -> nn.Module:
    """timm's VisionTransformer in the layout of the shared cifar10-vit-tiny (32 px, patch 4, width 96, 4 heads)."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=32,
        patch_size=4,
        embed_dim=96,
        depth=DEPTH,
        num_heads=4,
        mlp_ratio=4,
        num_classes=10,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-12),
    )


def converted(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hugging Face ViT's state dict in timm's names; q, k and v concatenated into ``qkv``."""
    out = {
        "cls_token": hf["vit.embeddings.cls_token"],
        "pos_embed": hf["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": hf["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": hf["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": hf["vit.layernorm.weight"],
        "norm.bias": hf["vit.layernorm.bias"],
        "head.weight": hf["classifier.weight"],
        "head.bias": hf["classifier.bias"],
    }
    names = {
        "attn.proj": "attention.output.dense",
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    for i in range(DEPTH):
        hf_block, block = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        attention = hf_block + "attention.attention."
        for kind in ("weight", "bias"):
            parts = [hf[f"{attention}{p}.{kind}"] for p in ("query", "key", "value")]
            out[f"{block}attn.qkv.{kind}"] = torch.cat(parts)
            for timm_name, hf_name in names.items():
                out[f"{block}{timm_name}.{kind}"] = hf[f"{hf_block}{hf_name}.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=SHARED_VIT, help="the Hugging Face ViT (save_pretrained dir)")
    parser.add_argument("--out", type=Path, required=True, help="the timm weights to write (safetensors)")
    args = parser.parse_args()
    from safetensors.torch import load_file, save_file
    from transformers import ViTForImageClassification

    weights = converted(load_file(str(args.source / "model.safetensors")))
    model = vit_cifar().eval()
    model.load_state_dict(weights, strict=True)
    reference = ViTForImageClassification.from_pretrained(str(args.source)).eval()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = float((model(x) - reference(pixel_values=x).logits).abs().max())
    if gap > 1e-4:
        raise SystemExit(f"the converted model's logits differ from {args.source}'s by {gap:.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(args.out))
    print(f"wrote {args.out}: timm's VisionTransformer, logits within {gap:.1e} of {args.source}")


if __name__ == "__main__":
    main()
