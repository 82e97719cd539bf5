"""Int8 that holds on every CPU kind: the non-VNNI path forced on any machine, and the settings it carries.

The thresholds here hold on CPUs with and without VNNI: a model built for CPUs without VNNI has 7-bit weights
(checked in the files), so its u8 x s8 pair sums fit 16 bits and it computes the same on both kinds.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")

from tests.helpers import save_tiny, tiny_vit
from tools.artifacts.io import load_compressed, load_module, save_original, save_quantized
from tools.deploy import cpu
from tools.deploy.registry import plan_quantization
from tools.models.sources import acquire_model
from tools.schemas import QuantizationRecommendation

SIZE = 16
ALL = [QuantizationRecommendation(layer="all", dtype="qint8")]
AVX2_ONLY = cpu.CpuFeatures(model_name="AMD EPYC-Milan (test)", machine="x86_64", features=["avx2"])


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def _logits(model: object, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)  # type: ignore[operator]
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    return save_original(acquire_model(str(save_tiny(tiny_vit(), root / "src", SIZE))), root / "original")


def _build(original: Path, out: Path, backend: str, target: str) -> dict:
    model = load_module(original)
    report = plan_quantization(model, ALL, backend=backend, int8_cpu=target)
    save_quantized(
        model,
        out,
        base_dir=original,
        recipe={"source": str(original)},
        report=report,
        example_input=_images(1, 0),
        calibration=_images(48, 7),
    )
    import json

    return json.loads((out / "artifact.json").read_text())["quantization"]


def _onnx_int8_weights(path: Path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return [
        numpy_helper.to_array(init)
        for init in graph.initializer
        if init.data_type == onnx.TensorProto.INT8 and numpy_helper.to_array(init).size > 16
    ]


@pytest.mark.parametrize("backend", ["onnxruntime", "onnxruntime-static"])
def test_the_non_vnni_path_builds_7_bit_weights_that_agree_with_fp32(
    original: Path, tmp_path: Path, backend: str
) -> None:
    report = _build(original, tmp_path / "q", backend, "no-vnni")
    assert report["int8"]["target"] == "no-vnni" and report["int8"]["reduce_range"] is True
    weights = _onnx_int8_weights(tmp_path / "q" / "model.onnx")
    assert weights, "int8 weights were written"
    # 7-bit symmetric weights in [-64, 64]: 255 x 64 x 2 = 32,640 fits the 16-bit pair sums of non-VNNI kernels
    assert all(w.min() >= -64 and w.max() <= 64 for w in weights), "7-bit weights: pair sums fit 16 bits"
    x = _images(64, 3)
    int8, reference = _logits(load_compressed(tmp_path / "q"), x), _logits(load_module(original), x)
    # holds on any CPU kind: nothing saturates with 7-bit weights
    assert (int8.argmax(1) == reference.argmax(1)).float().mean() >= 0.85
    assert (int8 - reference).abs().max() < 0.25 * reference.abs().max()


def test_the_vnni_path_keeps_8_bit_weights(original: Path, tmp_path: Path) -> None:
    report = _build(original, tmp_path / "q", "onnxruntime-static", "vnni")
    assert report["int8"]["target"] == "vnni" and report["int8"]["reduce_range"] is False
    weights = _onnx_int8_weights(tmp_path / "q" / "model.onnx")
    assert any(w.min() < -64 or w.max() > 64 for w in weights), "full 8-bit range on CPUs that sum in 32 bits"


def test_openvino_takes_the_overflow_fix_of_the_kind(original: Path, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    report = _build(original, tmp_path / "q", "openvino-int8", "no-vnni")
    assert report["int8"]["overflow_fix"] == "enable"
    x = _images(32, 5)
    int8, reference = _logits(load_compressed(tmp_path / "q"), x), _logits(load_module(original), x)
    assert (int8.argmax(1) == reference.argmax(1)).float().mean() >= 0.8


def test_loading_a_vnni_build_where_vnni_is_missing_warns(
    original: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _build(original, tmp_path / "vnni", "onnxruntime-static", "vnni")
    _build(original, tmp_path / "portable", "onnxruntime-static", "no-vnni")
    import tools.artifacts.io as io

    monkeypatch.setattr(io, "detect_cpu", lambda: AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="tools.artifacts.io"):
        load_compressed(tmp_path / "vnni")
    warned = [r.getMessage() for r in caplog.records if "without VNNI" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "vnni") in warned[0] and "\n" not in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tools.artifacts.io"):
        load_compressed(tmp_path / "portable")
    assert not [r for r in caplog.records if "VNNI" in r.getMessage()], "a no-VNNI build holds everywhere"


def test_float_backends_carry_no_int8_settings(original: Path) -> None:
    model = load_module(original)
    assert isinstance(model, nn.Module)
    for backend in ("onnxruntime-fp32", "torch-ao-dynamic"):
        assert plan_quantization(model, ALL, backend=backend).int8 is None
