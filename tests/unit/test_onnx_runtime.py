from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from tests.helpers import DIGIT_LABELS, tiny_vit
from tools.deploy.onnxruntime.export import OnnxRuntimeError, export_onnx
from tools.deploy.onnxruntime.quantize import quantize_onnx
from tools.deploy.onnxruntime.session import OnnxBaseline, OrtModel, onnx_baseline
from tools.evaluation.accuracy import evaluate_accuracy, predict_logits
from tools.evaluation.cost import compare_latencies
from tools.evaluation.datasets import load_eval_dataset
from tools.evaluation.labels import match_labels
from tools.models.base import build_preprocess

SIZE = 16


def tiny_cnn(num_labels: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 32),
        nn.ReLU(),
        nn.Linear(32, num_labels),
    ).eval()


def _inputs(batch: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def _reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.fixture(scope="module")
def vit_baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, OnnxBaseline]:
    model = tiny_vit()
    return model, onnx_baseline(model, _inputs(1), tmp_path_factory.mktemp("vit"), threads=1)


@pytest.fixture(scope="module")
def cnn_baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, OnnxBaseline]:
    model = tiny_cnn()
    return model, onnx_baseline(model, _inputs(1), tmp_path_factory.mktemp("cnn"), threads=1)


@pytest.mark.parametrize("which", ["vit_baseline", "cnn_baseline"])
def test_fp32_matches_torch_and_int8_stays_close(which: str, request: pytest.FixtureRequest) -> None:
    model, baseline = request.getfixturevalue(which)
    x = _inputs(16)
    expected = _reference(model, x)
    fp32 = baseline.fp32_model()(x)
    int8 = baseline.quantized_model()(x)
    assert fp32.shape == int8.shape == expected.shape == (16, 10)
    assert fp32.dtype == torch.float32
    torch.testing.assert_close(fp32, expected, atol=1e-4, rtol=1e-4)
    assert (int8.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.85
    assert (int8 - expected).abs().max() < 0.1 * expected.abs().max() + 1e-3


def test_batch_axis_is_dynamic_and_the_model_is_left_as_it_was(tmp_path: Path) -> None:
    model = tiny_vit().train()
    path = export_onnx(model, _inputs(2), tmp_path / "m.onnx")
    assert model.training
    session = OrtModel(path, threads=1)
    assert session.input_name == "pixel_values"
    assert session.output_name == "logits"
    for batch in (1, 5):
        assert session(_inputs(batch)).shape == (batch, 10)


def test_quantized_vit_is_much_smaller(vit_baseline: tuple[nn.Module, OnnxBaseline], tmp_path: Path) -> None:
    _, baseline = vit_baseline
    assert baseline.quantized_size_mb < 0.75 * baseline.fp32_size_mb
    assert baseline.fp32_size_mb == pytest.approx(Path(baseline.fp32_path).stat().st_size / 1e6, abs=1e-4)
    # a ViT whose weights outweigh the graph: int8 MatMul/Gemm weights make the file ~3.5x smaller
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=SIZE,
        patch_size=4,
        hidden_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=512,
        id2label=DIGIT_LABELS,
    )
    wide = onnx_baseline(ViTForImageClassification(config).eval(), _inputs(1), tmp_path)
    assert wide.quantized_size_mb < 0.4 * wide.fp32_size_mb


def test_baseline_is_idempotent_and_atomic(vit_baseline: tuple[nn.Module, OnnxBaseline]) -> None:
    model, baseline = vit_baseline
    out_dir = Path(baseline.fp32_path).parent
    stamps = {p: p.stat().st_mtime_ns for p in out_dir.iterdir()}
    again = onnx_baseline(model, _inputs(1), out_dir, threads=1)
    assert again == baseline
    assert {p: p.stat().st_mtime_ns for p in out_dir.iterdir()} == stamps
    assert sorted(p.name for p in out_dir.iterdir()) == ["model.int8.onnx", "model.onnx"]


def test_missing_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(OnnxRuntimeError, match="export the FP32 model first"):
        quantize_onnx(tmp_path / "absent.onnx", tmp_path / "q.onnx")
    with pytest.raises(OnnxRuntimeError, match="does not exist"):
        OrtModel(tmp_path / "absent.onnx")
    assert list(tmp_path.iterdir()) == []


def test_ort_model_works_with_evaluate_accuracy_and_compare_latencies(
    vit_baseline: tuple[nn.Module, OnnxBaseline],
) -> None:
    model, baseline = vit_baseline
    data = load_eval_dataset("digits", samples=50)
    match = match_labels(DIGIT_LABELS, data.label_names)
    assert match.is_complete()
    preprocess = build_preprocess(None, (3, SIZE, SIZE))
    fp32, int8 = baseline.fp32_model(), baseline.quantized_model()

    expected, counted = evaluate_accuracy(model, preprocess, data, match, batch_size=16, progress=False)
    accuracy, ort_counted = evaluate_accuracy(fp32, preprocess, data, match, batch_size=16, progress=False)
    assert ort_counted == counted == 50
    assert accuracy == expected
    q_accuracy, q_counted = evaluate_accuracy(int8, preprocess, data, match, batch_size=16, progress=False)
    assert q_counted == 50 and q_accuracy is not None
    torch.testing.assert_close(predict_logits(fp32, preprocess, data), predict_logits(model, preprocess, data))

    latencies = compare_latencies({"torch": model, "ort": fp32, "ort-int8": int8}, _inputs(1), warmup=1, repeats=3)
    assert set(latencies) == {"torch", "ort", "ort-int8"}
    assert all(v > 0 for v in latencies.values())
    assert not model.training
