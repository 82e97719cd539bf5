"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.analysis import new_notes, planner_for, planning_context
from agents.common import disagreement_budget, paths, pruning_budget, settings, shape_of
from agents.evaluation import eval_spec
from agents.planning.selection import kept_round, within_budget
from graph.context import Context
from graph.state import State
from tools import ops
from tools.evaluation.sources import DatasetError
from tools.schemas import PairedAccuracy


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
    """The best round within budget, chosen on the evaluation subset; with ``--holdout-samples``, confirmed on
    the holdout images, which neither calibration nor selection saw (``pruned.holdout``): a round that fails
    the budget test there gives way to the next by the same selection order (the original when none holds)."""
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    rounds = list(state.get("rounds") or [])
    notes: list[str] = []
    while True:
        best, why = kept_round(rounds, ctx.selection, pruning_budget(data, ctx), ctx.objective)
        if why and why not in notes:
            notes.append(why)
        if best is None:
            baseline = {k: v for k, v in state["baseline"].items() if k != "data_parts"}
            pruned = {**baseline, "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
            notes.append(
                f"no pruned candidate stayed within the {pruning_budget(data, ctx)} point accuracy budget"
                + (" on both the evaluation and the holdout images" if ctx.holdout_samples > 0 else "")
                + ": 'pruned' reports the original model"
            )
            break
        pruned = pruned_entry(best)
        if ctx.holdout_samples <= 0:
            break
        notes += [note for note in evaluate_holdout(data, ctx, pruned) if note not in notes]
        failed = _holdout_failure(pruned, pruning_budget(data, ctx), disagreement_budget(data, ctx))
        if failed is None:
            break
        notes.append(failed)
        rounds = [r for r in rounds if r["round"] != best["round"]]
    return {"pruned": pruned, "notes": notes}


def _holdout_failure(pruned: dict[str, Any], budget: float, disagreement: float | None = None) -> str | None:
    """Why ``pruned`` fails the pruning budget test on the holdout images (None: it holds, or there is no holdout)."""
    holdout = pruned.get("holdout")
    if not holdout or holdout.get("paired") is None:
        return None
    if within_budget(holdout.get("accuracy_drop_points"), budget, holdout["paired"], disagreement):
        return None
    paired = PairedAccuracy.model_validate(holdout["paired"])
    return (
        f"round {pruned['round']} held the budget on the evaluation images but not on the {paired.samples} "
        f"holdout images (Δ {paired.delta_points:+.2f} [{paired.ci95_low_points:+.2f}, "
        f"{paired.ci95_high_points:+.2f}] points): the next round by the selection order"
    )


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
