from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers import tiny_vit
from tools.deploy.base import QuantizationError
from tools.deploy.registry import get_backend, quantize, resolve_targets
from tools.schemas import QuantizationRecommendation


def test_all_selects_every_linear_classifier_included() -> None:
    model = tiny_vit()
    targets, unmatched = resolve_targets(model, [QuantizationRecommendation(layer="all")])
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    assert sorted(targets) == sorted(linears)
    assert "classifier" in targets
    assert unmatched == []


def test_regex_and_override_order() -> None:
    model = tiny_vit()
    recs = [
        QuantizationRecommendation(layer="all", dtype="qint8"),
        QuantizationRecommendation(layer=r"mlp\.fc\d", dtype="float16"),
        QuantizationRecommendation(layer="nothing-matches"),
    ]
    targets, unmatched = resolve_targets(model, recs)
    assert targets["vit.layers.0.mlp.fc1"] == "float16"
    assert targets["vit.layers.0.attention.q_proj"] == "qint8"
    assert unmatched == ["nothing-matches"]


def test_invalid_regex_is_a_clear_error() -> None:
    with pytest.raises(QuantizationError, match="invalid layer regex"):
        resolve_targets(tiny_vit(), [QuantizationRecommendation(layer="(")])


def test_quantized_model_runs_close_to_float_and_roundtrips_tensors() -> None:
    model = tiny_vit()
    x = torch.randn(2, 3, 16, 16)
    qmodel, report = quantize(model, [QuantizationRecommendation(layer="all")])
    assert report.layers and report.backend == "torch-ao-dynamic"
    with torch.inference_mode():
        ref, out = model(x).logits, qmodel(x).logits
    assert out.shape == ref.shape
    assert torch.allclose(ref, out, atol=0.1)
    backend = get_backend()
    tensors = backend.export_tensors(qmodel)
    assert tensors["classifier.weight_int8"].dtype == torch.int8
    fresh, _ = quantize(tiny_vit(), [QuantizationRecommendation(layer="all")])
    backend.import_tensors(fresh, tensors)
    with torch.inference_mode():
        assert torch.equal(fresh(x).logits, out)


def test_unknown_backend() -> None:
    with pytest.raises(QuantizationError, match="unknown quantization backend"):
        get_backend("nope")


def test_nothing_selected_is_said_in_the_report_not_only_the_log() -> None:
    from tools.deploy.registry import plan_quantization

    recs = [QuantizationRecommendation(layer=r"^no_such_layer$", dtype="qint8", justification="test")]
    report = plan_quantization(tiny_vit(), recs)
    assert report.layers == {}
    assert any("no nn.Linear layer was selected for int8" in note for note in report.notes)


class _ReadsItsChildsWeight(nn.Module):
    """Attention as torchvision's Swin computes it: the parent calls ``F.linear`` on its child's weight itself."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.nn.functional.linear(x, self.qkv.weight, self.qkv.bias).relu())


def test_a_linear_whose_parent_reads_its_weight_stays_float_and_the_model_runs() -> None:
    model = nn.Sequential(_ReadsItsChildsWeight(), nn.Linear(4, 3)).eval()
    x = torch.randn(2, 8)
    qmodel, report = quantize(model, [QuantizationRecommendation(layer="all")])
    assert sorted(report.layers) == ["0.proj", "1"]
    assert "reads self.qkv.weight itself" in report.float_layers["0.qkv"]
    with torch.inference_mode():  # swapped, qkv's weight would be a method: F.linear raised a TypeError
        assert torch.allclose(qmodel(x), model(x), atol=0.05)
    assert type(qmodel[0].qkv) is nn.Linear
