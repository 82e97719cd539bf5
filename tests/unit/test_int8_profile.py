"""The int8 profile measures int8's damage per block only where it decides something: where a full-int8 build of
the original is within the accuracy budget, every layer goes int8, and the table (87 s of EfficientNet-Lite2's
run at 260 px) is not measured; the profile, the plan and the report say why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langgraph.runtime import Runtime

from agents import int8
from agents.context import Context
from agents.planning.quantization import quantization_plan
from tests.helpers import typed_state
from tools.deploy.choice import DeployCandidate, DeployChoice
from tools.schemas import ModelProfile


def _choice(int8_within: bool) -> DeployChoice:
    rows = [
        DeployCandidate(backend="torch", runtime="pytorch", precision="fp32", accuracy=0.8, within_budget=True),
        DeployCandidate(
            backend="openvino-int8",
            runtime="openvino",
            precision="int8 static (NNCF)",
            artifact="x",
            accuracy=0.8,
            within_budget=int8_within,
            latency_s=1e-3,
        ),
    ]
    return DeployChoice(chosen="openvino-int8" if int8_within else "torch", why="", candidates=rows)


def _profile_int8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, int8_within: bool, quant_backend: str = "auto"
) -> tuple[dict[str, Any], list[str]]:
    from tools.stages import deployment, ops

    profile_dir = tmp_path / "profile"
    profile_dir.mkdir(parents=True)
    profile = ModelProfile(
        model_class="Tiny", family="cnn", device="cpu", input_shape=[3, 8, 8], total_params=10, total_macs=100,
        latency_s=1e-3,
    )  # fmt: skip
    (profile_dir / "profile.json").write_text(profile.model_dump_json())
    measured: list[str] = []

    def sensitivity(*args: Any, **kwargs: Any) -> None:
        measured.append("int8 sensitivity")

    monkeypatch.setattr(ops, "int8_sensitivity", sensitivity)
    monkeypatch.setattr(deployment, "deploy", lambda *a, **k: _choice(int8_within))
    state = typed_state(
        {
            "run_dir": str(tmp_path),
            "input_shape": {"channels": 3, "height": 8, "width": 8},
            "baseline": {"artifact": "original", "params": 10, "latency_s": 1e-3, "memory_mb": 0.0, "accuracy": 0.8},
        }
    )
    ctx = Context(run_dir=str(tmp_path), quant_backend=quant_backend)
    return int8.profile_int8(state, Runtime(context=ctx)), measured


def test_no_int8_table_where_the_originals_full_int8_is_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    update, measured = _profile_int8(tmp_path, monkeypatch, int8_within=True)
    assert not measured, "the per-block table decides nothing here"
    assert "accuracy_budget" in update and "original_deployment" in update and "int8_profile" not in update
    notes = [n for n in update["notes"] if n.startswith("int8 sensitivity per block not measured")]
    assert notes and "openvino-int8" in notes[0]
    profile = ModelProfile.model_validate(json.loads((tmp_path / "profile" / "profile.json").read_text()))
    assert profile.int8_not_measured is not None and "within the accuracy budget" in profile.int8_not_measured
    (rec,) = quantization_plan(profile, 0.0)
    assert rec.dtype == "qint8" and "within the accuracy budget" in rec.justification
    assert "no calibration images" not in rec.justification


@pytest.mark.parametrize(
    ("int8_within", "quant_backend"), [(False, "auto"), (True, "onnxruntime-static-mixed")], ids=["over", "forced"]
)
def test_the_int8_table_is_measured_where_it_decides_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, int8_within: bool, quant_backend: str
) -> None:
    """Over the budget, a mixed-precision build keeps the costliest blocks in float; a forced mixed build ranks
    them by the table too."""
    update, measured = _profile_int8(tmp_path, monkeypatch, int8_within=int8_within, quant_backend=quant_backend)
    assert measured == ["int8 sensitivity"]
    assert not any(n.startswith("int8 sensitivity per block not measured") for n in update["notes"])
