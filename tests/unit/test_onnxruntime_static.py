"""ONNX Runtime FP32 and static int8 (QDQ) backends: export, calibrate, save, reload, run at any batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from tests.helpers import save_tiny, tiny_resnet, tiny_vit
from tools.artifacts.io import load_compressed, save_original, save_quantized
from tools.deploy.base import Build, QuantizationError
from tools.deploy.onnxruntime.export import OnnxRuntimeError, export_onnx
from tools.deploy.onnxruntime.graph import quantized_op_counts, weighted_nodes
from tools.deploy.onnxruntime.quantize import CalibrationReader, static_preset, static_quantize_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.deploy.registry import BACKEND_CHOICES, get_backend, plan_quantization
from tools.models.sources import acquire_model
from tools.schemas import QuantizationRecommendation

SIZE = 16
ALL = [QuantizationRecommendation(layer="all", dtype="qint8")]
MODELS = {"vit": tiny_vit, "resnet": tiny_resnet}


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)


def _logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def _linears(model: nn.Module) -> list[str]:
    return sorted(name for name, m in model.named_modules() if type(m) is nn.Linear)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny model's original, and its onnxruntime-fp32 and onnxruntime-static artifacts."""
    root = tmp_path_factory.mktemp("ort-static")
    calibration = _images(48, seed=0)
    dirs: dict[str, Path] = {}
    for name, build in MODELS.items():
        original = save_original(acquire_model(str(save_tiny(build(), root / f"{name}-src", SIZE))), root / name)
        model = build()
        dirs[name] = original
        for backend in ("onnxruntime-fp32", "onnxruntime-static"):
            out = root / f"{name}-{backend}"
            report = plan_quantization(model, ALL, backend=backend)
            save_quantized(
                model, out, base_dir=original, recipe={"source": str(original)}, report=report, calibration=calibration
            )
            dirs[f"{name}-{backend}"] = out
    return dirs


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "artifact.json").read_text())


@pytest.mark.parametrize("name", list(MODELS))
def test_fp32_artifact_reproduces_the_torch_logits_at_batch_1_and_5(run: dict[str, Path], name: str) -> None:
    out = run[f"{name}-onnxruntime-fp32"]
    assert sorted(p.name for p in out.iterdir()) == ["artifact.json", "model.onnx"]
    meta = _meta(out)
    assert meta["quantization"]["backend"] == "onnxruntime-fp32" and meta["quantization"]["layers"] == {}
    assert any("nothing is quantized" in note for note in meta["quantization"]["notes"])
    model = load_compressed(out)
    assert isinstance(model, OrtModel) and not isinstance(model, nn.Module)
    reference = MODELS[name]()
    for batch in (1, 5):
        x = _images(batch, seed=batch)
        got = _logits(model, x)
        assert got.shape == (batch, 10)
        assert torch.allclose(got, _logits(reference, x), atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_static_int8_artifact_runs_and_mostly_agrees_with_fp32(run: dict[str, Path], name: str) -> None:
    out = run[f"{name}-onnxruntime-static"]
    assert sorted(p.name for p in out.iterdir()) == ["artifact.json", "model.onnx"]
    report = _meta(out)["quantization"]
    assert report["backend"] == "onnxruntime-static"
    reference = MODELS[name]()
    # every Linear and Conv the export applies with a constant weight is int8 (layer "all")
    assert set(_linears(reference)) <= set(report["layers"]) and set(report["layers"].values()) == {"qint8"}
    convs = {n for n, m in reference.named_modules() if isinstance(m, nn.Conv2d)}
    assert convs & set(report["layers"]), "convolutions are int8 too"
    assert any("calibrated on 48 images" in note for note in report["notes"])
    assert report["int8"]["reduce_range"] == (report["int8"]["target"] == "no-vnni")
    counts = quantized_op_counts(out / "model.onnx")
    assert counts.get("Conv", 0) >= 1 and sum(counts.values()) > 2, counts
    assert not weighted_nodes(out / "model.onnx"), "no MatMul/Gemm weight is left in float"
    model, fp32 = load_compressed(out), load_compressed(run[f"{name}-onnxruntime-fp32"])
    assert isinstance(model, OrtModel)
    x = _images(64, seed=7)
    q, f = _logits(model, x), _logits(fp32, x)
    assert q.shape == f.shape == (64, 10)
    assert (q.argmax(1) == f.argmax(1)).float().mean() >= 0.85
    assert (q - f).abs().max() < 0.5 * f.abs().max()
    for batch in (1, 5):  # the batch axis stays dynamic; reloading reproduces the outputs
        assert torch.equal(_logits(load_compressed(out), x[:batch]), q[:batch])


def test_static_needs_calibration_images(run: dict[str, Path], tmp_path: Path) -> None:
    model = tiny_vit()
    report = plan_quantization(model, ALL, backend="onnxruntime-static")
    with pytest.raises(QuantizationError, match="needs calibration images") as info:
        save_quantized(
            model, tmp_path / "q", base_dir=run["vit"], recipe={}, report=report, example_input=_images(1, seed=0)
        )
    assert "\n" not in str(info.value)
    assert not (tmp_path / "q").exists()
    with pytest.raises(QuantizationError, match="needs calibration images"):
        get_backend("onnxruntime-static").save(Build(model, report, tmp_path, calibration=_images(0, seed=0)))


def test_presets_reader_and_registry(tmp_path: Path) -> None:
    assert {"onnxruntime-fp32", "onnxruntime-static"} <= set(BACKEND_CHOICES)
    vit = export_onnx(tiny_vit(), _images(1, seed=0), tmp_path / "vit.onnx")
    cnn = export_onnx(tiny_resnet(), _images(1, seed=0), tmp_path / "cnn.onnx")
    assert static_preset(vit) == "transformer" and static_preset(cnn) == "cnn"
    reader = CalibrationReader(_images(70, seed=0), "pixel_values")
    sizes = []
    while (batch := reader.get_next()) is not None:
        sizes.append(batch["pixel_values"].shape[0])
    assert sizes == [32, 32, 6] and reader.get_next() is None
    reader.rewind()
    assert reader.get_next() is not None
    with pytest.raises(OnnxRuntimeError, match="N x C x H x W"):
        CalibrationReader(torch.zeros(3, 16, 16))
    with pytest.raises(OnnxRuntimeError, match="calibration method"):
        static_quantize_onnx(vit, tmp_path / "q.onnx", _images(4, seed=0), method="entropy")  # type: ignore[arg-type]


class _DepthwiseConv(nn.Conv2d):
    """A subclass, as Hugging Face's ``EfficientNetDepthwiseConv2d`` is."""


class _MobileBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = _DepthwiseConv(8, 8, 3, padding=1, groups=8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.depthwise(self.expand(x)).relu().mean((2, 3)))


def test_graph_backends_quantize_subclasses_of_the_layer_kinds_and_torch_ao_only_exact_types(tmp_path: Path) -> None:
    # EfficientNet's depthwise convolutions are an nn.Conv2d subclass: an exact-type match left all of them in float
    # in ONNX Runtime static int8, reported as "the plan keeps it in float"
    model = _MobileBlock().eval()
    report = plan_quantization(model, ALL, backend="onnxruntime-static")
    assert set(report.layers) == {"expand", "depthwise", "head"}
    built = get_backend("onnxruntime-static").save(Build(model, report, tmp_path, calibration=_images(8, seed=1)))
    assert "depthwise" not in built.float_layers and "depthwise" in built.layers
    attention = nn.MultiheadAttention(8, 2)  # its out_proj is a NonDynamicallyQuantizableLinear
    assert "out_proj" in plan_quantization(attention, ALL, backend="onnxruntime").layers
    assert "out_proj" not in plan_quantization(attention, ALL, backend="torch-ao-dynamic").layers
