"""Quantization agent: dynamic quantization of the best pruned model, and of the original alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings, shape_of
from graph.context import Context
from graph.state import State
from tools import ops
from tools.schemas import OptimizationPlan, QuantizationRecommendation


def quantize_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    run = paths(data)
    shape = shape_of(data)
    recs = OptimizationPlan.model_validate(state["plan"]["plan"]).quantization_recommendations or [
        QuantizationRecommendation(layer="all", dtype="qint8", justification="default: every nn.Linear")
    ]
    pruned = state.get("pruned")
    source = Path(pruned["artifact"]) if pruned and pruned.get("artifact") else run.original
    config = ctx.quantization_config()
    original_report = ops.quantize(run.original, run.original, recs, run.quantized_original, config, shape=shape)
    quantized_original = {
        "artifact": str(run.quantized_original),
        "source": str(run.original),
        "layers": len(original_report["layers"]),
        "backend": original_report["backend"],
    }
    notes = list(original_report.get("notes") or [])
    if source.resolve() == run.original.resolve():
        quantized = dict(quantized_original)
    else:
        report = ops.quantize(source, run.original, recs, run.quantized, config, shape=shape)
        quantized = {
            "artifact": str(run.quantized),
            "source": str(source),
            "layers": len(report["layers"]),
            "backend": report["backend"],
        }
        notes += report.get("notes") or []
    update: dict[str, Any] = {"quantized": quantized, "quantized_original": quantized_original}
    if notes:
        update["notes"] = [f"quantization: {note}" for note in notes]
    return update
