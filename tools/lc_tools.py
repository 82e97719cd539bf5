"""The operations of :mod:`tools.ops` as LangChain tools, so that LLM agents can call them.

Arguments and results are JSON: paths, plans and metrics, never modules or tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, tool

from tools import ops
from tools.compression.recipes import PruningConfig
from tools.schemas import InputShape, OptimizationPlan, QuantizationRecommendation


@tool
def acquire_model_tool(model: str, out_dir: str, device: str = "cpu") -> dict[str, Any]:
    """Load an image classifier (HF id, save_pretrained dir or built-in name) and save it to out_dir."""
    return ops.acquire(model, Path(out_dir), device=device).model_dump()


@tool
def resolve_input_shape_tool(model_dir: str) -> dict[str, Any]:
    """Derive (channels, height, width) for a saved model and prove it with a dry forward pass."""
    return ops.resolve_input_shape(Path(model_dir)).model_dump()


@tool
def profile_model_tool(model_dir: str, input_shape: InputShape, out_dir: str) -> dict[str, Any]:
    """Profile a saved model: MACs/params per layer (ptflops), latency per layer and operator (torch.profiler)."""
    return ops.profile(Path(model_dir), input_shape, Path(out_dir)).model_dump()


@tool
def prune_model_tool(
    model_dir: str, plan: OptimizationPlan, input_shape: InputShape, out_dir: str, importance: str = "l1"
) -> dict[str, Any]:
    """Apply a plan's structured/head pruning to an intact copy of the saved original; save to out_dir."""
    return ops.prune(Path(model_dir), plan, input_shape, Path(out_dir), PruningConfig(importance=importance))


@tool
def quantize_model_tool(
    model_dir: str, original_dir: str, recommendations: list[QuantizationRecommendation], out_dir: str
) -> dict[str, Any]:
    """Dynamically quantize the model at model_dir (original or pruned) and save it as deployed."""
    return ops.quantize(Path(model_dir), Path(original_dir), recommendations, Path(out_dir))


@tool
def evaluate_model_tool(
    model_dir: str,
    original_dir: str,
    input_shape: InputShape,
    dataset: str | None = None,
    samples: int = 500,
    seed: int = 0,
) -> dict[str, Any]:
    """Accuracy (when a dataset is given), batch-1 latency, memory and parameters of a saved model."""
    label_match = (
        ops.match_dataset_labels(Path(original_dir), dataset, None, samples, seed) if dataset is not None else None
    )
    spec = ops.EvalSpec(dataset=dataset, label_match=label_match, samples=samples, seed=seed, progress=False)
    return ops.evaluate(Path(model_dir), Path(original_dir), input_shape, spec).model_dump()


TOOLS: list[BaseTool] = [
    acquire_model_tool,
    resolve_input_shape_tool,
    profile_model_tool,
    prune_model_tool,
    quantize_model_tool,
    evaluate_model_tool,
]
