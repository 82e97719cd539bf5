"""The deployment choice: the fastest runtime within the budget, never one slower than the original FP32 model."""

from __future__ import annotations

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
