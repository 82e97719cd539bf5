"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.analysis import new_notes, planner_for, planning_context
from agents.common import paths, settings, shape_of
from agents.evaluation import eval_spec
from agents.planning.selection import best_round
from graph.context import Context
from graph.state import State
from tools import ops
from tools.evaluation.sources import DatasetError


def iterate_pruning(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    result = planner_for(ctx, paths(data).root).next_plan(planning_context(data, ctx))
    return {"next_plan": result.model_dump(), "notes": new_notes(result.planner_state, data)}


def pruned_entry(round_result: dict[str, Any]) -> dict[str, Any]:
    """The state's ``pruned`` entry for a round within budget: its metrics, round, drop, plan and source."""
    return {
        **round_result["metrics"],
        "round": round_result["round"],
        "within_budget": True,
        "accuracy_drop_points": round_result.get("accuracy_drop_points"),
        "plan": round_result["plan"],
        "source": round_result["source"],
    }


def select_best_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """The best round within budget, chosen on the evaluation subset; with ``--holdout-samples``, the chosen
    model (and the original) evaluated again on the holdout images, which neither calibration nor
    selection saw (``pruned.holdout``)."""
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    rounds = state.get("rounds") or []
    best = best_round(rounds, ctx.selection)
    notes: list[str] = []
    if best is None:
        baseline = {k: v for k, v in state["baseline"].items() if k != "data_parts"}
        pruned = {**baseline, "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
        notes.append(
            f"no pruned candidate stayed within the {ctx.max_accuracy_drop} point accuracy budget: "
            "'pruned' reports the original model"
        )
    else:
        pruned = pruned_entry(best)
    if ctx.holdout_samples > 0 and pruned.get("artifact"):
        notes += evaluate_holdout(data, ctx, pruned)
    return {"pruned": pruned, "notes": notes}


def evaluate_holdout(state: dict[str, Any], ctx: Context, pruned: dict[str, Any]) -> list[str]:
    """Evaluate the chosen model and the original on the holdout images into ``pruned["holdout"]``; notes."""
    try:
        holdout = ops.evaluate_accuracy_on(
            Path(pruned["artifact"]), paths(state).original, shape_of(state), eval_spec(state, ctx), "holdout"
        )
    except DatasetError as exc:
        return [f"no holdout evaluation: {exc}"]
    if holdout is None:
        return []
    pruned["holdout"] = holdout.model_dump()
    rows = (state["baseline"].get("data_parts") or {}).get("holdout", ctx.holdout_samples)
    if rows < ctx.holdout_samples:
        return [
            f"the holdout holds {rows} of the {ctx.holdout_samples} images asked for: the dataset split has no "
            "more beyond the calibration and evaluation images"
        ]
    return []
