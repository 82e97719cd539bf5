"""Analysis agent: turn the profile into a layer-wise pruning and quantization plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings, shape_of
from agents.planners import PlanningContext, RoundRecord, get_planner
from graph.context import Context
from graph.state import State
from tools import ops
from tools.artifacts import atomic_write_json, read_json
from tools.schemas import ModelProfile, OptimizationPlan


def planning_context(state: dict[str, Any], ctx: Context) -> PlanningContext:
    """Profile, prunable layers, baseline and every finished round, as a planner sees them."""
    run = paths(state)
    profile = ModelProfile.model_validate(read_json(Path(state["profile_path"])))
    prunable = ops.prunable(run.original, shape_of(state), run.profile)
    history = [
        RoundRecord(
            round=r["round"],
            plan=OptimizationPlan.model_validate(r["plan"]),
            source=r["source"],
            accuracy=r["metrics"].get("accuracy"),
            accuracy_drop_points=r.get("accuracy_drop_points"),
            params=r["metrics"]["params"],
            latency_s=r["metrics"]["latency_s"],
            within_budget=r["within_budget"],
            planner_state=r.get("planner_state") or {},
        )
        for r in state.get("rounds") or []
    ]
    return PlanningContext(
        profile=profile,
        prunable=prunable,
        baseline_accuracy=state["baseline"].get("accuracy"),
        max_accuracy_drop=ctx.max_accuracy_drop,
        max_ratio=ctx.max_pruning_ratio,
        history=history,
    )


def analyze_profile(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    result = get_planner(ctx.planner).analyze(planning_context(data, ctx))
    plan = result.plan.model_dump()
    atomic_write_json(paths(data).root / "plan.json", {"source": result.source, "plan": plan})
    return {
        "plan": plan,
        "plan_source": result.source,
        "current_plan": plan,
        "current_source": result.source,
        "current_planner_state": result.planner_state,
    }
