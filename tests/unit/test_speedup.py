"""The decomposed speed-up: three factors from one timing run that multiply to the total."""

from __future__ import annotations

import math

from tools.deploy.registry import float_reference_of
from tools.deploy.speedup import SpeedupFactors


def test_factors_telescope_to_the_total() -> None:
    times = {"orig": 4.0e-3, "ort32": 2.0e-3, "ort8": 1.0e-3, "pruned8": 0.8e-3}
    f = SpeedupFactors.measure(
        "onnxruntime", times, original="orig", runtime_fp32="ort32", runtime_original="ort8", deployed="pruned8"
    )
    assert (f.runtime_factor, f.precision_factor) == (2.0, 2.0)
    assert math.isclose(f.pruning_factor, 1.25) and math.isclose(f.total, 5.0)
    assert f.runtime == "onnxruntime" and f.same_as == [] and f.pruned
    assert f.lines()[0].startswith("runtime: 2.00x (PyTorch FP32 → onnxruntime FP32")
    dumped = f.model_dump()
    assert math.isclose(dumped["total"], 5.0)
    assert SpeedupFactors.model_validate(dumped) == f  # the computed fields round-trip through report.json


def test_same_artifact_steps_are_one_and_say_so() -> None:
    times = {"orig": 3.0e-3, "ao": 2.0e-3}
    f = SpeedupFactors.measure(
        "torch-ao-dynamic", times, original="orig", runtime_fp32="orig", runtime_original="ao", deployed="ao"
    )
    assert f.runtime_factor == 1.0 and f.pruning_factor == 1.0 and not f.pruned
    assert f.same_as == ["runtime", "pruning"]
    assert "same model on both sides" in f.lines()[0] and "same model on both sides" in f.lines()[2]


def test_fp32_reference_of_each_runtime() -> None:
    assert float_reference_of("onnxruntime-static") == "onnxruntime-fp32"
    assert float_reference_of("onnxruntime") == "onnxruntime-fp32"
    assert float_reference_of("openvino-int8") == "openvino"
    assert float_reference_of("torch-ao-dynamic") == "torch"
    assert float_reference_of("torch") == "torch"
