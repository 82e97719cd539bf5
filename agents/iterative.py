"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.analysis import planner_for, planning_context
from agents.common import add_notes, paths, settings
from graph.context import Context, Selection
from graph.state import State


def iterate_pruning(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    result = planner_for(ctx, paths(data).root).next_plan(planning_context(data, ctx))
    return {
        "current_plan": result.plan.model_dump(),
        "current_source": result.source,
        "current_planner_state": result.planner_state,
    }


def best_round(rounds: list[dict[str, Any]], selection: Selection) -> dict[str, Any] | None:
    """The best round within budget: by accuracy, then params, then latency (or fewest params first)."""
    candidates = [r for r in rounds if r["within_budget"]]
    if not candidates:
        return None

    def accuracy(r: dict[str, Any]) -> float:
        value = r["metrics"].get("accuracy")
        return -1.0 if value is None else float(value)

    def key(r: dict[str, Any]) -> tuple[float, ...]:
        m = r["metrics"]
        if selection == "smallest-within-budget":
            return (m["params"], -accuracy(r), m["latency_s"], r["round"])
        return (-accuracy(r), m["params"], m["latency_s"], r["round"])

    return min(candidates, key=key)


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
        return {"pruned": pruned, "notes": add_notes(dict(state), note)}
    pruned = {
        **best["metrics"],
        "round": best["round"],
        "within_budget": True,
        "accuracy_drop_points": best.get("accuracy_drop_points"),
        "plan": best["plan"],
        "source": best["source"],
    }
    return {"pruned": pruned}
