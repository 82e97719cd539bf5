"""Narrowing heads (``head_dim`` pruning) checked against the original with the removed dimensions zeroed.

With the original softmax scale kept, removing query/key dimension ``d`` of a head leaves exactly the scores the
original gives with row ``d`` of q (and its bias) zeroed; removing value dimension ``d`` (a v row and an o
column) exactly what it gives with that v row zeroed. Which dimensions were removed is read off the weights
(each kept row is one original row), so the test holds whichever the importance picks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from agents.context import Context
from tests.helpers import tiny_vit
from tests.unit.test_head_masking import _images, _logits, _swin, _vit, _vit_style
from tools.compression.heads import attention_modules
from tools.compression.pruning import apply_pruning, prunable_layers
from tools.compression.recipes import PruningConfig
from tools.compression.units import prunable_units
from tools.deploy.onnxruntime.fusion import fuse_attention
from tools.schemas import PruningRecommendation

ATOL = 1e-4


def _narrow(
    model: nn.Module, ratio: float, importance: str = "l2", layer: str = "attention", head_round_to: int = 0
) -> nn.Module:
    pruned = copy.deepcopy(model)
    rec = PruningRecommendation(layer=layer, pruning_type="head_dim", pruning_ratio=ratio)
    size = int(next(iter(attention_modules(model).values()))[0].config.image_size)
    config = PruningConfig(importance=importance, head_round_to=head_round_to)
    report = apply_pruning(pruned, [rec], _images(size)[:1], config)  # type: ignore[arg-type]
    assert report.applied and report.applied[0].pruning_type == "head_dim", report
    return pruned


def _kept_rows(pruned: torch.Tensor, original: torch.Tensor) -> list[int]:
    rows = []
    for row in pruned:
        matches = [i for i, r in enumerate(original) if torch.equal(row, r)]
        assert len(matches) == 1, "a kept row is not exactly one row of the original"
        rows.append(matches[0])
    return rows


def _zeroed_reference(original: nn.Module, pruned: nn.Module) -> nn.Module:
    """``original`` with the q/k and v rows that ``pruned`` removed zeroed (their biases too)."""
    reference = copy.deepcopy(original)
    after = dict(pruned.named_modules())
    for name, (module, _) in attention_modules(reference).items():
        narrowed = after[name]
        heads, head_dim, kept_dim = module.num_attention_heads, module.head_dim, narrowed.head_dim
        assert narrowed.num_attention_heads == heads and kept_dim < head_dim
        assert narrowed.scaling == module.scaling  # the original scale is kept
        qk = _kept_rows(narrowed.q_proj.weight, module.q_proj.weight)
        assert _kept_rows(narrowed.k_proj.weight, module.k_proj.weight) == qk
        vo = _kept_rows(narrowed.v_proj.weight, module.v_proj.weight)
        assert _kept_rows(narrowed.o_proj.weight.T, module.o_proj.weight.T) == vo
        for kept in (qk, vo):  # the same number of dimensions kept in every head
            assert sorted(i // head_dim for i in kept) == [h for h in range(heads) for _ in range(kept_dim)]
        with torch.no_grad():
            for proj, kept in ((module.q_proj, qk), (module.v_proj, vo)):
                gone = sorted(set(range(heads * head_dim)) - set(kept))
                proj.weight[gone] = 0.0
                if proj.bias is not None:
                    proj.bias[gone] = 0.0
    return reference


@pytest.mark.parametrize(
    "build",
    [_vit, *(_vit_style(f) for f in ("deit", "dinov2", "dinov2_registers", "vit_msn", "ijepa", "beit")), _swin],
    ids=["vit", "deit", "dinov2", "dinov2_registers", "vit_msn", "ijepa", "beit", "swin"],
)
@pytest.mark.parametrize("importance", ["l2", "random"])
def test_narrowed_heads_compute_what_the_original_does_with_those_dimensions_zeroed(build, importance) -> None:  # type: ignore[no-untyped-def]
    original = build()
    pruned = _narrow(original, 0.5, importance)
    size = int(original.config.image_size)
    x = _images(size)
    expected = _logits(_zeroed_reference(original, pruned), x)
    assert torch.allclose(_logits(pruned, x), expected, atol=ATOL)
    assert not torch.allclose(_logits(original, x), expected, atol=1e-3)  # the removal did change the model
    params = sum(p.numel() for p in pruned.parameters())
    assert params < sum(p.numel() for p in original.parameters())


def test_l2_keeps_the_largest_query_key_products() -> None:
    original = _vit()
    pruned = _narrow(original, 0.5, "l2", layer=r"layers\.0\.attention$")
    module = original.vit.layers[0].attention
    heads, head_dim = module.num_attention_heads, module.head_dim
    after = pruned.vit.layers[0].attention
    q = (module.q_proj.weight.pow(2).sum(1) + module.q_proj.bias.pow(2)).sqrt().reshape(heads, head_dim)
    k = (module.k_proj.weight.pow(2).sum(1) + module.k_proj.bias.pow(2)).sqrt().reshape(heads, head_dim)
    best = torch.sort(torch.argsort(q * k, dim=1, descending=True)[:, : after.head_dim], dim=1).values
    expected = (best + torch.arange(heads)[:, None] * head_dim).reshape(-1).tolist()
    assert _kept_rows(after.q_proj.weight, module.q_proj.weight) == expected
    assert pruned.vit.layers[1].attention.head_dim == head_dim  # the pattern selected layer 0 only


def test_at_least_one_dimension_per_head_is_kept() -> None:
    pruned = _narrow(_vit(), 0.99)
    assert all(m.head_dim == 1 for m, _ in attention_modules(pruned).values())


def test_narrowed_widths_are_rounded_to_a_multiple_of_head_round_to() -> None:
    wide = tiny_vit(hidden_size=96, layers=1)  # heads of 24 dimensions
    assert Context().pruning_config().head_round_to == 8  # a run's default: the widths int8 kernels run fastest
    for ratio, width in ((0.3, 16), (0.4, 16), (0.6, 8), (0.9, 8)):
        assert _narrow(wide, ratio, head_round_to=8).vit.layers[0].attention.head_dim == width
    assert _narrow(wide, 0.3).vit.layers[0].attention.head_dim == 17  # head_round_to=0: any width
    x = _images(16)[:1]
    rec = PruningRecommendation(layer="attention", pruning_type="head_dim", pruning_ratio=0.1)
    report = apply_pruning(copy.deepcopy(wide), [rec], x, PruningConfig(importance="l2", head_round_to=8))
    assert not report.applied and "removes no dimension of 24 to a multiple of 8" in report.skipped[0].reason
    rec = rec.model_copy(update={"pruning_ratio": 0.5})
    report = apply_pruning(copy.deepcopy(_vit()), [rec], x, PruningConfig(importance="l2", head_round_to=8))
    assert not report.applied and "not more than head_round_to=8" in report.skipped[0].reason


def test_head_dims_are_sensitivity_units_selected_through_the_query_projection() -> None:
    model = _vit()
    layers = prunable_layers(model, _images(int(model.config.image_size))[:1])
    assert set(layers.head_dims) == {f"{name}.q_proj" for name in layers.heads}
    units = [u for u in prunable_units(layers.model_dump()) if u.pruning_type == "head_dim"]
    assert [u.modules[0] for u in units] == list(layers.heads)
    head_units = {u.pattern for u in prunable_units(layers.model_dump()) if u.pruning_type == "head"}
    assert not head_units & {u.pattern for u in units}  # a plan addresses heads and their width separately


def test_narrowed_attention_fuses_with_its_original_scale() -> None:
    pruned = _narrow(_vit(), 0.5)
    x = _images(int(pruned.config.image_size))
    fused, count = fuse_attention(pruned, x[:1])  # raises when the fused outputs differ
    assert count == len(attention_modules(pruned))
    assert torch.allclose(_logits(fused, x), _logits(pruned, x), atol=ATOL)
