"""The paper's uniform pruning baselines: every prunable layer at one ratio, and the ratio matching a size.

``profiling-agent bench`` (:mod:`graph.bench`) prunes the original with :func:`uniform_plan` at fixed ratios
and at :func:`matched_ratio`, the uniform ratio whose model is as small as the agent's, with each
importance criterion, once without recovery and once with the run's recovery. A model's parameter count
depends on the ratio only (not on the criterion, nor on recovery, which refits weights in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tools.compression.pruning import apply_pruning, count_params
from tools.compression.recipes import PruningConfig
from tools.compression.reports import PrunableLayers
from tools.compression.units import UNIT_KINDS
from tools.models.base import example_input
from tools.schemas import InputShape, OptimizationPlan, PruningRecommendation


def uniform_plan(ratio: float, prunable: dict[str, Any]) -> OptimizationPlan:
    """The baseline: every prunable layer at the same ratio, by each uniform unit kind the model has (the paper's:
    channels, and heads where there are any)."""
    why = f"uniform baseline: every prunable layer at ratio {ratio}"
    record = PrunableLayers.model_validate(prunable)
    return OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=".*", pruning_type=kind.name, pruning_ratio=ratio, justification=why)
            for kind in UNIT_KINDS.values()
            if kind.uniform and kind.selectable(record)
        ]
    )


def _params_at(fresh_model: Callable[[], nn.Module], shape: InputShape, ratio: float, prunable: dict[str, Any]) -> int:
    model = fresh_model()
    # the count does not depend on which channels go: a data-free criterion, no calibration needed
    config = PruningConfig(importance="l1")
    apply_pruning(model, uniform_plan(ratio, prunable).pruning_recommendations, example_input(shape), config)
    return count_params(model)


def matched_ratio(
    fresh_model: Callable[[], nn.Module], shape: InputShape, prunable: dict[str, Any], target_params: int
) -> float:
    """The uniform ratio whose pruned model has (about) ``target_params`` parameters, by bisection.

    ``fresh_model()`` gives a new copy of the original model at each call (each probe prunes one in place)."""
    counts = {0.0: _params_at(fresh_model, shape, 0.0, prunable), 0.9: _params_at(fresh_model, shape, 0.9, prunable)}
    low, high = 0.0, 0.9
    for _ in range(7):
        mid = round((low + high) / 2, 4)
        counts[mid] = _params_at(fresh_model, shape, mid, prunable)
        if counts[mid] > target_params:
            low = mid
        else:
            high = mid
    # channel and head counts are integers: take whichever bracket lands closer to the target
    return min((low, high), key=lambda r: abs(counts[r] - target_params))


__all__ = ["matched_ratio", "uniform_plan"]
