"""A deployed model's speed-up over the original FP32 PyTorch model, decomposed into what caused it.

    t(PyTorch FP32, original) / t(deployed)
        = runtime   t(PyTorch FP32, original) / t(runtime FP32, original)
        x precision t(runtime FP32, original) / t(runtime at the deployed precision, original)
        x pruning   t(runtime at the deployed precision, original) / t(deployed: same runtime and precision, pruned)

The four latencies come from one interleaved timing run, so the three factors multiply exactly to the
total. A factor whose two sides are the same artifact (no runtime switch for PyTorch, no precision change
for an FP32 deployment, nothing pruned) is 1 by construction and says so.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from tools.deploy.registry import runtime_and_precision

__all__ = ["SpeedupFactors"]


def _ratio(before: float, after: float) -> float:
    return before / after if after > 0 else float("nan")


def _factor(before: str, after: str) -> Any:
    """A computed field: the ratio of the latencies in the fields named ``before`` and ``after``."""
    return computed_field(return_type=float)(property(lambda self: _ratio(getattr(self, before), getattr(self, after))))


class SpeedupFactors(BaseModel):
    """The deployed model's batch-1 latency against the original's, step by step (seconds, one timing run)."""

    backend: str = Field(description="The deployed backend (tools.deploy.registry.DEPLOYMENTS).")
    runtime: str
    precision: str
    original_s: float = Field(description="The original model, PyTorch FP32.")
    runtime_fp32_s: float = Field(description="The original model in the deployed runtime, FP32.")
    runtime_original_s: float = Field(description="The original model in the deployed runtime and precision.")
    deployed_s: float = Field(description="The deployed model: pruned, in the deployed runtime and precision.")
    pruned: bool = Field(description="Whether the deployed model is a pruned one (else pruning is 1 by construction).")
    same_as: list[str] = Field(
        default_factory=list, description="Steps that compare an artifact with itself (their factor is exactly 1)."
    )

    runtime_factor = _factor("original_s", "runtime_fp32_s")
    precision_factor = _factor("runtime_fp32_s", "runtime_original_s")
    pruning_factor = _factor("runtime_original_s", "deployed_s")
    total = _factor("original_s", "deployed_s")

    @classmethod
    def measure(
        cls,
        backend: str,
        times: dict[str, float],
        *,
        original: str,
        runtime_fp32: str,
        runtime_original: str,
        deployed: str,
    ) -> SpeedupFactors:
        """From one interleaved timing run ``times`` (key -> seconds) and the keys of the four models.

        Keys that name the same artifact are the same measurement: their step is listed in ``same_as``.
        """
        runtime, precision = runtime_and_precision(backend)
        same = []
        if runtime_fp32 == original:
            same.append("runtime")
        if runtime_original == runtime_fp32:
            same.append("precision")
        if deployed == runtime_original:
            same.append("pruning")
        return cls(
            backend=backend,
            runtime=runtime,
            precision=precision,
            original_s=times[original],
            runtime_fp32_s=times[runtime_fp32],
            runtime_original_s=times[runtime_original],
            deployed_s=times[deployed],
            pruned="pruning" not in same,
            same_as=same,
        )

    def lines(self) -> list[str]:
        """One line per step, for reports: ``runtime: PyTorch FP32 -> onnxruntime FP32 1.21x (1.07 -> 0.88 ms)``."""

        def ms(seconds: float) -> str:
            return f"{1e3 * seconds:.2f} ms"

        steps = (
            ("runtime", f"PyTorch FP32 → {self.runtime} FP32", self.original_s, self.runtime_fp32_s),
            ("precision", f"{self.runtime} FP32 → {self.precision}", self.runtime_fp32_s, self.runtime_original_s),
            ("pruning", "original → pruned, same runtime and precision", self.runtime_original_s, self.deployed_s),
        )
        out = []
        for name, what, before, after in steps:
            if name in self.same_as:
                out.append(f"{name}: 1.00x (same model on both sides: {what})")
            else:
                out.append(f"{name}: {_ratio(before, after):.2f}x ({what}, {ms(before)} → {ms(after)})")
        out.append(f"total: {self.total:.2f}x ({ms(self.original_s)} → {ms(self.deployed_s)})")
        return out
