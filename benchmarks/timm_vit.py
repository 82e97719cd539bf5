"""The shared Hugging Face cifar10-vit-tiny and cifar10-swin-tiny as timm builds them: factories for ``--model`` and
their converted weights.

timm's ``VisionTransformer`` and ``SwinTransformer`` hold each block's queries, keys and values in one ``qkv`` layer;
the shared models' weights, converted, give the same logits (checked when converting). The README's timm figures run
the tool on them::

    python benchmarks/timm_vit.py --out runs/timm/vit_cifar.safetensors        # converts and checks the logits
    python benchmarks/timm_vit.py --arch swin --out runs/timm/swin_cifar.safetensors
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

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
DEPTH = 4
SWIN_DEPTHS = (2, 2, 2)
#: A block's layers other than q, k and v: timm's name -> the Hugging Face name (ViT and Swin alike).
BLOCK_NAMES = {
    "attn.proj": "attention.output.dense",
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}


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


def swin_cifar() -> nn.Module:
    """timm's SwinTransformer in the layout of the shared cifar10-swin-tiny (32 px, patch 2, width 48, window 4)."""
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        img_size=32,
        patch_size=2,
        embed_dim=48,
        depths=SWIN_DEPTHS,
        num_heads=(3, 6, 12),
        window_size=4,
        mlp_ratio=2,
        num_classes=10,
    )


def _qkv(hf: dict[str, torch.Tensor], prefix: str, kind: str) -> torch.Tensor:
    return torch.cat([hf[f"{prefix}{p}.{kind}"] for p in ("query", "key", "value")])


def converted_swin(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hugging Face Swin's state dict in timm's names: ``qkv`` fused, each stage's patch merging moved to the start
    of the next stage (timm's place for it; both concatenate the four neighbours in the same order)."""
    out = {
        "patch_embed.proj.weight": hf["swin.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": hf["swin.embeddings.patch_embeddings.projection.bias"],
        "patch_embed.norm.weight": hf["swin.embeddings.norm.weight"],
        "patch_embed.norm.bias": hf["swin.embeddings.norm.bias"],
        "norm.weight": hf["swin.layernorm.weight"],
        "norm.bias": hf["swin.layernorm.bias"],
        "head.fc.weight": hf["classifier.weight"],
        "head.fc.bias": hf["classifier.bias"],
    }
    for stage, depth in enumerate(SWIN_DEPTHS):
        hf_stage = f"swin.encoder.layers.{stage}."
        for j in range(depth):
            hf_block, block = f"{hf_stage}blocks.{j}.", f"layers.{stage}.blocks.{j}."
            attention = hf_block + "attention.self."
            out[block + "attn.relative_position_bias_table"] = hf[attention + "relative_position_bias_table"]
            for kind in ("weight", "bias"):
                out[f"{block}attn.qkv.{kind}"] = _qkv(hf, attention, kind)
                for timm_name, hf_name in BLOCK_NAMES.items():
                    out[f"{block}{timm_name}.{kind}"] = hf[f"{hf_block}{hf_name}.{kind}"]
        if stage + 1 < len(SWIN_DEPTHS):
            merge = f"layers.{stage + 1}.downsample."
            out[merge + "reduction.weight"] = hf[hf_stage + "downsample.reduction.weight"]
            out[merge + "norm.weight"] = hf[hf_stage + "downsample.norm.weight"]
            out[merge + "norm.bias"] = hf[hf_stage + "downsample.norm.bias"]
    return {k: v.contiguous() for k, v in out.items()}


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
    for i in range(DEPTH):
        hf_block, block = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        attention = hf_block + "attention.attention."
        for kind in ("weight", "bias"):
            out[f"{block}attn.qkv.{kind}"] = _qkv(hf, attention, kind)
            for timm_name, hf_name in BLOCK_NAMES.items():
                out[f"{block}{timm_name}.{kind}"] = hf[f"{hf_block}{hf_name}.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=("vit", "swin"), default="vit")
    parser.add_argument("--source", type=Path, help="the Hugging Face model (default: the shared cifar10-<arch>-tiny)")
    parser.add_argument("--out", type=Path, required=True, help="the timm weights to write (safetensors)")
    args = parser.parse_args()
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageClassification

    source = args.source or SHARED / f"cifar10-{args.arch}-tiny"
    convert, build = (converted, vit_cifar) if args.arch == "vit" else (converted_swin, swin_cifar)
    weights = convert(load_file(str(source / "model.safetensors")))
    model = build().eval()
    model.load_state_dict(weights, strict=True)
    reference = AutoModelForImageClassification.from_pretrained(str(source)).eval()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = float((model(x) - reference(pixel_values=x).logits).abs().max())
    if gap > 1e-4:
        raise SystemExit(f"the converted model's logits differ from {source}'s by {gap:.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(args.out))
    print(f"wrote {args.out}: timm's {type(model).__name__}, logits within {gap:.1e} of {source}")


if __name__ == "__main__":
    main()
