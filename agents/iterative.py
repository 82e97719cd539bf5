"""Iterative pruning agent (the paper's Algorithm 1): next plan from the profile and earlier rounds,
and the final choice of the best candidate."""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.analysis import new_notes, planner_for, planning_context
from agents.common import need, paths, pruning_budget, settings
from agents.context import Context
from agents.distillation import distillation_summary
from agents.planning.selection import kept_round
from agents.state import State
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
    """The best round within budget, chosen on the choose images (the evaluation part). Nothing here reads the
    confirm part: the build that ships is judged there once, after the deployment's choice (``confirm_deployment``)."""
    ctx = settings(runtime)
    best = kept_round(list(state.rounds), ctx.selection, pruning_budget(state, ctx), ctx.objective)
    notes: list[str] = []
    if best is None:
        baseline = need(state.baseline, "baseline").model_dump(exclude={"data_parts"})
        pruned = PrunedEntry.model_validate(
            {**baseline, "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
        )
        notes.append(
            f"no pruned candidate stayed within the {pruning_budget(state, ctx)} point accuracy budget: 'pruned' "
            "reports the original model"
        )
    else:
        pruned = pruned_entry(best)
    summary = distillation_summary(state, ctx)
    return {"pruned": pruned, "notes": [*notes, summary] if summary else notes}
