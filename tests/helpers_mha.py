"""Tiny vision transformers written with plain ``torch.nn`` attention, for the ``nn.MultiheadAttention`` head tests
(importable as ``tests.helpers_mha:encoder_vit`` / ``tests.helpers_mha:torchvision_vit`` for ``--model``).

Two layouts users write: an ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer`` (batch first, pre-norm,
GELU; fused in-projection), and torchvision's ``VisionTransformer`` blocks, which call
``self.self_attention(x, x, x, need_weights=False)``.
"""

from __future__ import annotations

import torch
from torch import nn

SIZE, PATCH, DIM, HEADS, CLASSES = 16, 4, 32, 4, 10


class _Patches(nn.Module):
    """Patch embedding, class token and position embedding: (B, 3, H, W) -> (B, 1 + tokens, dim)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, PATCH, stride=PATCH)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, 1 + (SIZE // PATCH) ** 2, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding


class EncoderViT(nn.Module):
    """A ViT over ``nn.TransformerEncoder(batch_first=True, norm_first=True)``."""

    def __init__(self, layers: int = 2, heads: int = HEADS, dim: int = DIM) -> None:
        super().__init__()
        self.embed = _Patches(dim)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x))[:, 0])


class EncoderBlock(nn.Module):
    """torchvision's ``vision_transformer.EncoderBlock``: pre-norm attention and MLP, each added to its input."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class TorchvisionViT(nn.Module):
    """torchvision's ``VisionTransformer`` layout: ``encoder.layers`` of :class:`EncoderBlock`, ``heads.head``."""

    def __init__(self, layers: int = 2, heads: int = HEADS, dim: int = DIM) -> None:
        super().__init__()
        self.embed = _Patches(dim)
        self.encoder = nn.Module()
        self.encoder.layers = nn.Sequential(*(EncoderBlock(dim, heads) for _ in range(layers)))
        self.encoder.ln = nn.LayerNorm(dim, eps=1e-6)
        self.heads = nn.Sequential()
        self.heads.head = nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder.ln(self.encoder.layers(self.embed(x)))
        return self.heads(x[:, 0])


def encoder_vit() -> nn.Module:
    torch.manual_seed(0)
    return EncoderViT().eval()


def torchvision_vit() -> nn.Module:
    torch.manual_seed(0)
    return TorchvisionViT().eval()
