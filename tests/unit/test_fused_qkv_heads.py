"""Head pruning of attention whose query, key and value share one fused layer, as timm 1.x builds it: its
``Attention`` (ViT, DeiT and others) and its Swin ``WindowAttention`` (classes copied here in their layout, so the
suite does not need timm)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tools.compression.heads import attention_modules, other_attention
from tools.compression.pruning import apply_pruning, prunable_layers
from tools.compression.recipes import PruningConfig
from tools.compression.units import prunable_units
from tools.schemas import PruningRecommendation

DIM, HEADS, TOKENS = 24, 4, 9


class Attention(nn.Module):
    """timm.layers.Attention (1.0): one ``qkv`` layer, a forward that reshapes by num_heads, head_dim, attn_dim."""

    fused_attn = True

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=True)
        self.proj = nn.Linear(self.attn_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused_attn:  # the kernel's scale: 1 / sqrt(q's width)
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            x = ((q * self.scale) @ k.transpose(-2, -1)).softmax(-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, self.attn_dim))


class UnfusedAttention(Attention):
    fused_attn = False


UnfusedAttention.__name__ = "Attention"


class WindowAttention(nn.Module):
    """timm's Swin window attention: no head_dim attribute, a relative-position bias table with a column per head."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.randn(TOKENS * TOKENS, num_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.relative_position_bias_table.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(x.transpose(1, 2).reshape(b, n, -1))


class LegacyAttention(Attention):
    """An older timm forward: the output is reshaped to the input's width, so fewer heads cannot run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


LegacyAttention.__name__ = "Attention"  # the class name is what selects the spec


class Block(nn.Module):
    def __init__(self, attention: type[nn.Module]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = attention(DIM, HEADS)
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        return x + self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, attention: type[nn.Module]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(12, DIM)
        self.blocks = nn.Sequential(Block(attention), Block(attention))
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x.flatten(2).transpose(1, 2))).mean(1))


def _images() -> torch.Tensor:
    return torch.randn(4, 12, 3, 3, generator=torch.Generator().manual_seed(1))


def _zero_head(attention: nn.Module, head: int) -> None:
    dim = attention.proj.in_features // attention.num_heads
    width = attention.proj.in_features
    with torch.no_grad():
        for part in range(3):
            rows = slice(part * width + head * dim, part * width + (head + 1) * dim)
            attention.qkv.weight[rows] = 0
            attention.qkv.bias[rows] = 0
        attention.proj.weight[:, head * dim : (head + 1) * dim] = 0


@pytest.mark.parametrize("attention", [Attention, UnfusedAttention, WindowAttention])
def test_a_silent_head_is_removed_and_the_model_computes_what_it_did(attention: type[nn.Module]) -> None:
    model = Net(attention).eval()
    _zero_head(model.blocks[1].attn, 2)
    x = _images()
    before = model(x)
    assert set(attention_modules(model)) == {"blocks.0.attn", "blocks.1.attn"} and not other_attention(model)
    assert prunable_layers(model, x).heads == {"blocks.0.attn": HEADS, "blocks.1.attn": HEADS}
    rec = PruningRecommendation(layer=r"^blocks\.1\.attn$", pruning_type="head", pruning_ratio=0.25, justification="t")
    report = apply_pruning(model, [rec], x, PruningConfig(importance="l2"))
    attn = model.blocks[1].attn
    assert [(a.before, a.after) for a in report.applied] == [(HEADS, HEADS - 1)] and attn.num_heads == HEADS - 1
    width = (HEADS - 1) * DIM // HEADS
    assert attn.qkv.out_features == 3 * width and attn.proj.in_features == width
    if attention is not WindowAttention:
        assert attn.attn_dim == attn.proj.in_features
    else:
        assert attn.relative_position_bias_table.shape[1] == HEADS - 1
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


def test_fused_heads_are_sensitivity_units_and_not_channels() -> None:
    model = Net(Attention).eval()
    layers = prunable_layers(model, _images())
    units = prunable_units(layers.model_dump())
    assert {u.modules[0] for u in units if u.pruning_type == "head"} == {"blocks.0.attn", "blocks.1.attn"}
    assert {u.modules[0] for u in units if u.pruning_type == "head_dim"} == {"blocks.0.attn", "blocks.1.attn"}
    assert layers.head_dims == {"blocks.0.attn.qkv": DIM // HEADS, "blocks.1.attn.qkv": DIM // HEADS}
    assert not any("qkv" in m for u in units if u.pruning_type == "structured" for m in u.modules)
    assert "blocks.0.attn.qkv" not in layers.structured


def test_a_forward_that_cannot_take_fewer_heads_is_rolled_back_with_its_reason() -> None:
    model = Net(LegacyAttention).eval()
    x = _images()
    before = model(x)
    rec = PruningRecommendation(layer=r"^blocks\.0\.attn$", pruning_type="head", pruning_ratio=0.5, justification="t")
    report = apply_pruning(model, [rec], x, PruningConfig(importance="l2"))
    assert not report.applied and report.skipped and model.blocks[0].attn.num_heads == HEADS
    torch.testing.assert_close(model(x), before)


@pytest.mark.parametrize("attention", [Attention, UnfusedAttention, WindowAttention])
def test_narrowed_fused_heads_keep_the_softmax_scale_and_compute_what_they_did(attention: type[nn.Module]) -> None:
    model = Net(attention).eval()
    attn = model.blocks[0].attn
    width, dim = attn.proj.in_features, attn.proj.in_features // HEADS
    with torch.no_grad():  # dimensions 0 and 1 of every head: silent in q.k, and 2 and 3 silent in v -> o
        for head in range(HEADS):
            for part, dims in ((0, (0, 1)), (1, (0, 1)), (2, (2, 3))):
                rows = [part * width + head * dim + d for d in dims]
                attn.qkv.weight[rows] = 0
                attn.qkv.bias[rows] = 0
            attn.proj.weight[:, [head * dim + 2, head * dim + 3]] = 0
    x = _images()
    before = model(x)
    rec = PruningRecommendation(
        layer=r"^blocks\.0\.attn\.qkv$", pruning_type="head_dim", pruning_ratio=2 / dim, justification="t"
    )
    report = apply_pruning(model, [rec], x, PruningConfig(importance="l2", head_round_to=0))
    assert [(a.before, a.after) for a in report.applied] == [(dim, dim - 2)]
    assert attn.qkv.out_features == 3 * HEADS * (dim - 2) and attn.scale == pytest.approx((dim - 2) ** -0.5)
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


class _LinearNorm(nn.Sequential):
    pass


class _LevitLike(nn.Module):
    """timm's LeViT names its attention class "Attention" as timm's ViT does; its qkv is a Linear then a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads = 2
        self.qkv = _LinearNorm(nn.Linear(8, 24), nn.BatchNorm1d(24))
        self.proj = nn.Linear(8, 8)


class _EfficientFormerLike(nn.Module):
    """timm's EfficientFormer: queries and keys of 4 dimensions a head, values of 8."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads = 2
        self.qkv = nn.Linear(8, 2 * (4 + 4 + 8))
        self.proj = nn.Linear(16, 8)


@pytest.mark.parametrize(("layout", "said"), [(_LevitLike, "qkv not nn.Linear"), (_EfficientFormerLike, "qkv has 32")])
def test_an_attention_of_another_layout_is_left_out_and_said_once_with_what_differs(
    layout: type[nn.Module], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    # both were taken for timm's ViT attention: the warning repeated for every call of every probe and printed the
    # spec's repr (LeViT), or the heads were offered as units that every probe and plan then skipped (EfficientFormer)
    attention = type("Attention", (layout,), {})
    model = nn.Sequential(attention())
    with caplog.at_level("WARNING", logger="tools.compression.heads"):
        assert attention_modules(model) == {}
        assert attention_modules(model) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert said in lines[0] and "heads are not pruned" in lines[0] and "AttentionSpec" not in lines[0]
