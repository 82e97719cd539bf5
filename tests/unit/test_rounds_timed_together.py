"""``--objective latency`` times a round with every earlier round's build and the original's in one interleaved
call, and the earlier rounds take the new timing (``agents.evaluation.with_deploy_latency``): timed minutes apart with
another job on the machine, CIFAR Swin-tiny's depth round and kept round each ran 1.086x the original; together, on
an idle machine, 1.13x and 1.03x."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.context import Context
from agents.evaluation import with_deploy_latency
from tests.helpers import typed_state
from tools.schemas import RoundResult


def _round(index: int, run: Path, speedup: float | None, backend: str | None = "openvino-int8") -> dict[str, Any]:
    metrics = {
        "params": 100 - index,
        "latency_s": 1.0,
        "memory_mb": 1.0,
        "accuracy": 0.9,
        "artifact": str(run / "rounds" / f"round-{index:02d}" / "model"),
        "deploy_speedup": speedup,
        "deploy_backend": backend,
    }
    return {
        "round": index,
        "plan": {},
        "source": "rules",
        "metrics": metrics,
        "accuracy_drop_points": 0.1,
        "within_budget": True,
    }


def test_a_round_is_timed_with_the_earlier_rounds_and_they_take_the_new_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_latency_in_build(source: Path, *args: Any, earlier: dict[str, Path], **kwargs: Any) -> dict[str, float]:
        calls.append({"source": source, "earlier": dict(earlier)})
        return {"model": 0.80e-3, "reference": 1.00e-3, "0": 0.97e-3, "1": 0.88e-3}

    monkeypatch.setattr("tools.stages.ops.latency_in_build", fake_latency_in_build)
    state = typed_state(
        {
            "run_dir": str(tmp_path),
            "input_shape": {"channels": 3, "height": 8, "width": 8},
            "dataset": "cifar10",
            "original_deployment": {
                "chosen": "openvino-int8",
                "why": "test",
                "candidates": [
                    {
                        "backend": "openvino-int8",
                        "runtime": "openvino",
                        "precision": "int8",
                        "artifact": str(tmp_path / "ov"),
                    }
                ],
            },
            "rounds": [
                _round(0, tmp_path, 1.086),
                _round(1, tmp_path, 1.086),
                _round(2, tmp_path, None),  # its build failed: not timed again
                _round(3, tmp_path, 1.2, backend="onnxruntime"),  # timed in another build: not again either
            ],
        }
    )
    new = RoundResult.model_validate(_round(4, tmp_path, None, backend=None))
    timed = with_deploy_latency(state, Context(objective="latency"), new)
    assert [r.round for r in timed] == [0, 1, 4]  # the new round last: the CLI's progress line shows it
    assert calls[0]["source"] == Path(tmp_path / "rounds" / "round-04" / "model")
    assert set(calls[0]["earlier"]) == {"0", "1"}
    speedups = {r.round: r.metrics.deploy_speedup for r in timed}
    assert speedups == {4: 1.25, 0: pytest.approx(1.0309, abs=1e-4), 1: pytest.approx(1.1364, abs=1e-4)}
    assert all(r.metrics.deploy_backend == "openvino-int8" for r in timed)
    logged = json.loads((tmp_path / "rounds" / "round-01" / "round.json").read_text())
    assert logged["metrics"]["deploy_speedup"] == pytest.approx(1.1364, abs=1e-4)


def test_without_the_originals_deployment_the_round_is_as_it_was(tmp_path: Path) -> None:
    record = RoundResult.model_validate(_round(0, tmp_path, None, backend=None))
    assert with_deploy_latency(typed_state({"run_dir": str(tmp_path)}), Context(objective="latency"), record) == [
        record
    ]


def test_latency_in_build_times_the_earlier_builds_in_the_same_call(tmp_path: Path) -> None:
    """Real builds of a tiny CNN in ONNX Runtime FP32: the new round's build is made beside it, an earlier round's
    build is timed with it and the original's, and an earlier round with no build is left out."""
    from tests.helpers import save_tiny, tiny_resnet
    from tools.deploy.config import QuantizationConfig
    from tools.stages import ops
    from tools.stages.ops import latency_in_build
    from tools.stages.run_data import EvalSpec

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_resnet(), tmp_path / "src", 16)), original)
    shape, spec = ops.resolve_input_shape(original), EvalSpec(dataset=None)
    reference = tmp_path / "original-onnxruntime-fp32"
    ops.quantize(original, original, [], reference, QuantizationConfig(backend="onnxruntime-fp32"), shape=shape)
    rounds = [tmp_path / f"round-{i}" / "model" for i in range(3)]
    for folder in rounds:
        ops.acquire(str(original), folder)
    first = latency_in_build(rounds[0], original, "onnxruntime-fp32", reference, shape, spec, repeats=3)
    assert set(first) == {"model", "reference"} and (tmp_path / "round-0" / "model-onnxruntime-fp32").is_dir()
    earlier = {"0": rounds[0], "1": rounds[1]}  # round 1 was never built: not timed
    times = latency_in_build(
        rounds[2], original, "onnxruntime-fp32", reference, shape, spec, repeats=3, earlier=earlier
    )
    assert set(times) == {"model", "reference", "0"} and all(t > 0 for t in times.values())


def test_of_the_rounds_over_the_budget_only_the_fastest_are_timed_again() -> None:
    from agents.evaluation import RETIMED_OVER_BUDGET, _timed_again

    rounds = [
        RoundResult.model_validate({**_round(i, Path("r"), speedup), "within_budget": within})
        for i, (speedup, within) in enumerate([(1.0, True), (1.5, False), (1.1, False), (1.3, False), (1.4, False)])
    ]
    again = [r.round for r in _timed_again(rounds)]
    assert RETIMED_OVER_BUDGET == 3 and again == [0, 1, 3, 4]  # within the budget, and the three fastest others
