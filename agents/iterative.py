"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.analysis import planner_for, planning_context
from agents.common import paths, settings
from agents.planning.selection import best_round
from graph.context import Context
from graph.state import State


def iterate_pruning(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    result = planner_for(ctx, paths(data).root).next_plan(planning_context(data, ctx))
    return {"next_plan": result.model_dump()}


def select_best_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    rounds = state.get("rounds") or []
    best = best_round(rounds, ctx.selection)
    if best is None:
        pruned = {**state["baseline"], "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
        note = (
            f"no pruned candidate stayed within the {ctx.max_accuracy_drop} point accuracy budget: "
            "'pruned' reports the original model"
        )
        return {"pruned": pruned, "notes": [note]}
    pruned = {
        **best["metrics"],
        "round": best["round"],
        "within_budget": True,
        "accuracy_drop_points": best.get("accuracy_drop_points"),
        "plan": best["plan"],
        "source": best["source"],
    }
    return {"pruned": pruned}
