"""The deployment choice: the fastest runtime within the budget, never one slower than the original FP32 model."""

from __future__ import annotations

from pathlib import Path

from tools.deploy.choice import FLOAT, DeployCandidate, available_backends, choose


def _c(backend: str, latency_ms: float | None, ok: bool = True, error: str | None = None) -> DeployCandidate:
    return DeployCandidate(
        backend=backend,
        runtime="r",
        precision="p",
        latency_s=None if latency_ms is None else latency_ms / 1e3,
        within_budget=ok,
        error=error,
    )


def test_fastest_within_budget_wins() -> None:
    candidates = [
        _c(FLOAT, 3.0),
        _c("onnxruntime", 1.2),
        _c("openvino-int8", 0.9),
        _c("onnxruntime-static", 0.5, ok=False),
    ]
    chosen, why = choose(candidates, original_latency_s=4e-3)
    assert chosen == "openvino-int8"
    assert "fastest within the accuracy budget" in why and "onnxruntime-static" in why  # named as over budget


def test_never_slower_than_the_original_fp32_model() -> None:
    chosen, why = choose([_c(FLOAT, 5.0), _c("onnxruntime", 4.5)], original_latency_s=4e-3)
    assert chosen == FLOAT and "not faster than the original FP32 model" in why
    chosen, _ = choose([_c(FLOAT, 3.0), _c("onnxruntime", 3.5)], original_latency_s=4e-3)
    assert chosen == FLOAT  # the pruned float model is the fastest


def test_failed_and_over_budget_candidates_are_not_deployed() -> None:
    candidates = [_c(FLOAT, 3.0), _c("openvino", None, error="boom"), _c("onnxruntime", 1.0, ok=False)]
    chosen, why = choose(candidates, original_latency_s=4e-3)
    assert chosen == FLOAT and "could not run: openvino" in why
    chosen, why = choose([_c("onnxruntime", 1.0, ok=False)], original_latency_s=4e-3)
    assert chosen == FLOAT and "no runtime candidate" in why


def test_available_backends_lists_float_first_and_only_importable_ones() -> None:
    names = available_backends(["torch-ao-dynamic", "onnxruntime", "openvino"], lambda n: n != "openvino")
    assert names == [FLOAT, "torch-ao-dynamic", "onnxruntime"]


def test_without_data_static_int8_is_calibrated_on_synthetic_inputs(tmp_path: Path) -> None:
    """An untrained built-in has no dataset: static int8 still runs (latency, memory) and the table says on what."""
    from tests.helpers import save_tiny, tiny_vit
    from tools import ops
    from tools.deployment import deploy

    source = save_tiny(tiny_vit(), tmp_path / "src", 16)
    original = tmp_path / "run" / "models" / "original"
    ops.acquire(str(source), original)
    shape = ops.resolve_input_shape(original)
    spec = ops.EvalSpec(dataset=None, samples=10, progress=False)
    choice = deploy(
        original,
        original,
        [],
        tmp_path / "run" / "models" / "deploy",
        shape,
        spec,
        backends=[FLOAT, "onnxruntime-static"],
        within_budget=lambda drop, paired: True,
        baseline_accuracy=None,
        repeats=3,
    )
    static = next(c for c in choice.candidates if c.backend == "onnxruntime-static")
    assert static.error is None and static.latency_s is not None and static.accuracy is None
    assert "synthetic" in choice.calibration
    assert choice.chosen in {FLOAT, "onnxruntime-static"}
