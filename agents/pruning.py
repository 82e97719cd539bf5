"""Pruning agent: apply the current plan to an intact copy of the original model."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.common import add_notes, paths, settings, shape_of
from graph.context import Context
from graph.state import State
from tools import ops
from tools.schemas import OptimizationPlan


def prune_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    index = len(state.get("rounds") or [])
    run = paths(data)
    plan = OptimizationPlan.model_validate(state["current_plan"])
    artifact = run.round(index) / "model"
    report = ops.prune(
        run.original,
        plan,
        shape_of(data),
        artifact,
        importance=ctx.importance,
        round_to=ctx.round_to,
        seed=ctx.seed,
    )
    skipped = [f"{s['target']} ({s['reason']})" for s in report.get("skipped", [])]
    notes = [f"round {index}: skipped " + "; ".join(skipped)] if skipped else []
    pending = {
        "round": index,
        "plan": plan.model_dump(),
        "source": state.get("current_source", ctx.planner),
        "planner_state": state.get("current_planner_state") or {},
        "prune_report": report,
        "artifact": str(artifact),
    }
    return {"pending_round": pending, "notes": add_notes(data, *notes)}
