"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from pathlib import Path

from langgraph.runtime import Runtime

from agents.analysis import new_notes, planner_for, planning_context
from agents.common import disagreement_budget, need, paths, pruning_budget, settings, shape_of
from agents.distillation import distillation_summary
from agents.evaluation import eval_spec, round_zs
from agents.planning.selection import kept_round, within_budget
from graph.context import Context
from graph.state import State
from tools import ops
from tools.evaluation.sources import DatasetError
from tools.schemas import PrunedEntry, RoundResult


def iterate_pruning(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    result = planner_for(ctx, paths(state).root).next_plan(planning_context(state, ctx))
    return {"next_plan": result, "notes": new_notes(result.planner_state, state)}


def pruned_entry(round_result: RoundResult) -> PrunedEntry:
    """The state's ``pruned`` entry for a round within budget: its metrics, round, drop, plan and source."""
    return PrunedEntry(
        **round_result.metrics.model_dump(exclude={"within_budget"}),
        round=round_result.round,
        within_budget=True,
        accuracy_drop_points=round_result.accuracy_drop_points,
        plan=round_result.plan,
        source=round_result.source,
    )


def select_best_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """The best round within budget, chosen on the evaluation subset; with ``--holdout-samples``, confirmed on
    the holdout images, which neither calibration nor selection saw (``pruned.holdout``): a round that fails
    the budget test there gives way to the next by the same selection order (the original when none holds)."""
    ctx = settings(runtime)
    rounds = list(state.rounds)
    zs = round_zs(state, ctx)
    notes: list[str] = []
    while True:
        best, why = kept_round(rounds, ctx.selection, pruning_budget(state, ctx), ctx.objective, zs)
        if why and why not in notes:
            notes.append(why)
        if best is None:
            baseline = need(state.baseline, "baseline").model_dump(exclude={"data_parts"})
            pruned = PrunedEntry.model_validate(
                {**baseline, "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
            )
            notes.append(
                f"no pruned candidate stayed within the {pruning_budget(state, ctx)} point accuracy budget"
                + (" on both the evaluation and the holdout images" if ctx.holdout_samples > 0 else "")
                + ": 'pruned' reports the original model"
            )
            break
        pruned = pruned_entry(best)
        if ctx.holdout_samples <= 0:
            break
        pruned, holdout_notes = evaluate_holdout(state, ctx, pruned)
        notes += [note for note in holdout_notes if note not in notes]
        failed = _holdout_failure(pruned, pruning_budget(state, ctx), disagreement_budget(state, ctx))
        if failed is None:
            break
        notes.append(failed)
        rounds = [r for r in rounds if r.round != best.round]
    summary = distillation_summary(state, ctx, zs)
    return {"pruned": pruned, "notes": [*notes, summary] if summary else notes}


def _holdout_failure(pruned: PrunedEntry, budget: float, disagreement: float | None = None) -> str | None:
    """Why ``pruned`` fails the pruning budget test on the holdout images (None: it holds, or there is no holdout)."""
    holdout = pruned.holdout
    if holdout is None or holdout.paired is None:
        return None
    paired = holdout.paired
    if within_budget(holdout.accuracy_drop_points, budget, paired, disagreement):
        return None
    return (
        f"round {pruned.round} held the budget on the evaluation images but not on the {paired.samples} "
        f"holdout images (Δ {paired.delta_points:+.2f} [{paired.ci95_low_points:+.2f}, "
        f"{paired.ci95_high_points:+.2f}] points): the next round by the selection order"
    )


def evaluate_holdout(state: State, ctx: Context, pruned: PrunedEntry) -> tuple[PrunedEntry, list[str]]:
    """The chosen model with its and the original's accuracy on the holdout images (``pruned.holdout``); notes."""
    try:
        holdout = ops.evaluate_accuracy_on(
            Path(need(pruned.artifact, "pruned model's artifact")),
            paths(state).original,
            shape_of(state),
            eval_spec(state, ctx),
            "holdout",
        )
    except DatasetError as exc:
        return pruned, [f"no holdout evaluation: {exc}"]
    if holdout is None:
        return pruned, []
    pruned = pruned.model_copy(update={"holdout": holdout})
    rows = need(state.baseline, "baseline").data_parts.get("holdout", ctx.holdout_samples)
    if rows < ctx.holdout_samples:
        return pruned, [
            f"the holdout holds {rows} of the {ctx.holdout_samples} images asked for: the dataset split has no "
            "more beyond the calibration and evaluation images"
        ]
    return pruned, []
