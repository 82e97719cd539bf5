"""Pruning checked against the original with the removed units' outputs zeroed (no recovery).

Removing an attention head (its q/k/v rows and its o_proj columns) must give exactly what the unpruned model
gives when that head's slice of the o_proj input is zeroed; removing MLP channels (fc1 rows and bias, fc2
columns) exactly what it gives with those fc1 rows and biases zeroed (GELU(0) = 0). Which units were removed
is read off the weights (each kept block is an original one), so the test holds whichever units the
importance picks; for ``l1``/``l2`` it also checks they are the lowest-norm ones, computed here independently.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn
from transformers import (
    BeitConfig,
    BeitForImageClassification,
    DeiTConfig,
    DeiTForImageClassification,
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersForImageClassification,
    IJepaConfig,
    IJepaForImageClassification,
    SwinConfig,
    SwinForImageClassification,
    ViTMSNConfig,
    ViTMSNForImageClassification,
)

from tests.helpers import tiny_vit
from tools.compression.heads import attention_modules
from tools.compression.pruning import apply_pruning
from tools.compression.recipes import PruningConfig
from tools.schemas import PruningRecommendation

ATOL = 1e-5


def _rec(layer: str, ratio: float, kind: str = "structured") -> PruningRecommendation:
    return PruningRecommendation(layer=layer, pruning_type=kind, pruning_ratio=ratio)  # type: ignore[arg-type]


def _spread(model: nn.Module) -> nn.Module:
    """Weights far from HF's 0.02-std init, so a removed head or channel moves the logits by a lot."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.2) + (1.0 if p.dim() == 1 else 0))
    return model.eval()


def _vit() -> nn.Module:
    return _spread(tiny_vit())


def _swin() -> nn.Module:
    torch.manual_seed(0)
    config = SwinConfig(image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)
    return _spread(SwinForImageClassification(config))


#: A tiny random model of each ViT-style family: (config class, model class, extra config).
_VIT_STYLE: dict[str, tuple[type, type, dict[str, object]]] = {
    "deit": (DeiTConfig, DeiTForImageClassification, {"intermediate_size": 64}),
    "dinov2": (Dinov2Config, Dinov2ForImageClassification, {"mlp_ratio": 2}),
    "dinov2_registers": (Dinov2WithRegistersConfig, Dinov2WithRegistersForImageClassification, {"mlp_ratio": 2}),
    "vit_msn": (ViTMSNConfig, ViTMSNForImageClassification, {"intermediate_size": 64}),
    "ijepa": (IJepaConfig, IJepaForImageClassification, {"intermediate_size": 64}),
    # BEiT with a relative position bias per layer: the layer holds it (one column per head) and passes it to the
    # attention as its mask
    "beit": (BeitConfig, BeitForImageClassification, {"intermediate_size": 64, "use_relative_position_bias": True}),
}


def _vit_style(family: str) -> Callable[[], nn.Module]:
    config_class, model_class, extra = _VIT_STYLE[family]

    def build() -> nn.Module:
        torch.manual_seed(0)
        sizes = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
        return _spread(model_class(config_class(**sizes, **extra)))

    build.__name__ = f"_{family}"
    return build


def _images(size: int = 16, n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(2))


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=x).logits


def _origin_of_blocks(pruned: torch.Tensor, original: torch.Tensor, block: int) -> list[int]:
    """For each ``block``-row slice of ``pruned``, the index of the identical slice of ``original``."""
    kept = pruned.reshape(-1, block, pruned.shape[-1])
    candidates = original.reshape(-1, block, original.shape[-1])
    origin = []
    for piece in kept:
        matches = [i for i, c in enumerate(candidates) if torch.equal(piece, c)]
        assert len(matches) == 1, "a kept block is not exactly one block of the original"
        origin.append(matches[0])
    return origin


def _removed_heads(pruned: nn.Module, original: nn.Module) -> dict[str, list[int]]:
    """Per attention module of ``original``, the heads ``pruned`` no longer has (read off q, k, v and o)."""
    pruned_modules = dict(pruned.named_modules())
    removed: dict[str, list[int]] = {}
    for name, (module, _) in attention_modules(original).items():
        after = pruned_modules[name]
        heads, head_dim = module.num_attention_heads, module.head_dim
        kept = _origin_of_blocks(after.q_proj.weight, module.q_proj.weight, head_dim)
        assert _origin_of_blocks(after.k_proj.weight, module.k_proj.weight, head_dim) == kept
        assert _origin_of_blocks(after.v_proj.weight, module.v_proj.weight, head_dim) == kept
        assert _origin_of_blocks(after.o_proj.weight.T, module.o_proj.weight.T, head_dim) == kept
        assert after.num_attention_heads == len(kept)
        removed[name] = sorted(set(range(heads)) - set(kept))
    return removed


@contextmanager
def _heads_zeroed(model: nn.Module, heads: dict[str, list[int]]) -> Iterator[None]:
    """Zero the given heads' slices of each attention's o_proj input (their contribution to the output)."""
    modules = dict(model.named_modules())
    handles = []
    for name, removed in heads.items():
        attention = modules[name]
        mask = torch.ones(attention.o_proj.in_features)
        for head in removed:
            mask[head * attention.head_dim : (head + 1) * attention.head_dim] = 0.0

        def zero(_: nn.Module, args: tuple[torch.Tensor, ...], mask: torch.Tensor = mask) -> tuple[torch.Tensor, ...]:
            return (args[0] * mask, *args[1:])

        handles.append(attention.o_proj.register_forward_pre_hook(zero))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _head_norms(attention: nn.Module, p: int) -> torch.Tensor:
    """Each head's p-norm over its q/k/v rows and biases and its o_proj columns (an independent ranking)."""
    heads, head_dim = attention.num_attention_heads, attention.head_dim
    parts = []
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        parts += [proj.weight.reshape(heads, -1), proj.bias.reshape(heads, -1)]
    parts.append(attention.o_proj.weight.reshape(-1, heads, head_dim).transpose(0, 1).reshape(heads, -1))
    return torch.cat(parts, dim=1).detach().norm(p=p, dim=1)


@pytest.mark.parametrize(
    "factory,importance,ratio",
    [
        (_vit, "l1", 0.5),
        (_vit, "l2", 0.5),
        (_vit, "l2", 0.25),
        (_vit, "random", 0.5),
        (_swin, "l2", 0.5),
        (_vit_style("deit"), "l1", 0.5),
        (_vit_style("dinov2"), "l2", 0.5),
        (_vit_style("dinov2_registers"), "l2", 0.5),
        (_vit_style("vit_msn"), "l1", 0.25),
        (_vit_style("ijepa"), "l2", 0.5),
        (_vit_style("beit"), "l2", 0.5),
    ],
)
def test_head_pruning_equals_the_original_with_those_heads_zeroed(factory, importance: str, ratio: float) -> None:
    original = factory()
    pruned = copy.deepcopy(original)
    x = _images()
    report = apply_pruning(pruned, [_rec("attention", ratio, "head")], x, PruningConfig(importance=importance))

    removed = _removed_heads(pruned, original)
    assert removed and all(removed.values()), report
    for name, (module, _) in attention_modules(original).items():
        assert len(removed[name]) == min(module.num_attention_heads - 1, round(ratio * module.num_attention_heads))
    with _heads_zeroed(original, removed):
        expected = _logits(original, x)
    actual = _logits(pruned, x)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    # the heads mattered: the unmasked original is far from the pruned model, so the match above is not vacuous
    assert (_logits(original, x) - actual).abs().max() > 100 * ATOL


@pytest.mark.parametrize("importance,p", [("l1", 1), ("l2", 2)])
def test_magnitude_importance_removes_the_lowest_norm_heads(importance: str, p: int) -> None:
    original = _vit()
    pruned = copy.deepcopy(original)
    apply_pruning(pruned, [_rec("attention", 0.5, "head")], _images(), PruningConfig(importance=importance))
    removed = _removed_heads(pruned, original)
    for name, (module, _) in attention_modules(original).items():
        lowest = torch.argsort(_head_norms(module, p))[: len(removed[name])]
        assert removed[name] == sorted(lowest.tolist()), name


def test_zeroing_other_heads_does_not_match() -> None:
    """The check discriminates: masking any other set of heads of the same size gives different logits."""
    original = _vit()
    pruned = copy.deepcopy(original)
    x = _images()
    apply_pruning(pruned, [_rec(r"layers\.0\.attention", 0.5, "head")], x, PruningConfig(importance="l2"))
    name = "vit.layers.0.attention"
    removed = _removed_heads(pruned, original)[name]
    actual = _logits(pruned, x)
    for other in ([0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]):
        with _heads_zeroed(original, {name: other}):
            close = torch.allclose(_logits(original, x), actual, atol=ATOL, rtol=0)
        assert close == (other == removed), other


def _removed_channels(pruned: nn.Linear, original: nn.Linear) -> list[int]:
    kept = _origin_of_blocks(pruned.weight, original.weight, 1)
    assert torch.equal(pruned.bias, original.bias[kept])
    return sorted(set(range(original.out_features)) - set(kept))


@pytest.mark.parametrize("importance", ["l1", "l2"])
def test_mlp_channel_pruning_equals_the_original_with_those_channels_zeroed(importance: str) -> None:
    original = _vit()
    pruned = copy.deepcopy(original)
    x = _images()
    report = apply_pruning(pruned, [_rec(r"mlp\.fc1", 0.25)], x, PruningConfig(importance=importance))
    assert [a.modules for a in report.applied] == [["vit.layers.0.mlp.fc1", "vit.layers.1.mlp.fc1"]]

    masked = copy.deepcopy(original)
    for before, after, target in zip(original.vit.layers, pruned.vit.layers, masked.vit.layers, strict=True):
        removed = _removed_channels(after.mlp.fc1, before.mlp.fc1)
        assert len(removed) == 16  # 25 % of 64
        with torch.no_grad():
            target.mlp.fc1.weight[removed] = 0.0
            target.mlp.fc1.bias[removed] = 0.0
        kept = sorted(set(range(64)) - set(removed))
        assert torch.equal(after.mlp.fc2.weight, before.mlp.fc2.weight[:, kept])  # fc2 keeps the same columns
    actual = _logits(pruned, x)
    torch.testing.assert_close(actual, _logits(masked, x), atol=ATOL, rtol=0)
    assert (_logits(original, x) - actual).abs().max() > 100 * ATOL


def test_heads_and_channels_in_one_call_equal_both_masks() -> None:
    original = _vit()
    pruned = copy.deepcopy(original)
    x = _images()
    apply_pruning(pruned, [_rec("attention", 0.5, "head"), _rec(r"mlp\.fc1", 0.5)], x, PruningConfig(importance="l2"))
    heads = _removed_heads(pruned, original)
    masked = copy.deepcopy(original)
    for before, after, target in zip(original.vit.layers, pruned.vit.layers, masked.vit.layers, strict=True):
        removed = _removed_channels(after.mlp.fc1, before.mlp.fc1)
        with torch.no_grad():
            target.mlp.fc1.weight[removed] = 0.0
            target.mlp.fc1.bias[removed] = 0.0
    with _heads_zeroed(masked, heads):
        expected = _logits(masked, x)
    torch.testing.assert_close(_logits(pruned, x), expected, atol=ATOL, rtol=0)
