"""Analysis agent: turn the profile into a layer-wise pruning and quantization plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.common import baseline_accuracy, need, paths, pruning_budget, settings, shape_of
from agents.context import Context
from agents.evaluation import rescues_wanted
from agents.planning.base import Planner, PlanningContext, RoundRecord
from agents.planning.registry import get_planner
from agents.planning.selection import distillation_target
from agents.state import State
from tools.compression.reports import PrunableLayers
from tools.schemas import ModelProfile
from tools.stages import ops
from tools.store.files import atomic_write_json, read_json


def planning_context(state: State, ctx: Context) -> PlanningContext:
    """Profile, prunable layers, baseline and every finished round, as a planner sees them."""
    run = paths(state)
    profile = ModelProfile.model_validate(read_json(Path(need(state.profile_path, "profile_path"))))
    prunable = PrunableLayers.model_validate(ops.prunable(run.original, shape_of(state), run.profile))
    history = [RoundRecord.of(r) for r in state.rounds]
    return PlanningContext(
        profile=profile,
        prunable=prunable,
        baseline_accuracy=baseline_accuracy(state),
        max_accuracy_drop=pruning_budget(state, ctx),
        max_ratio=ctx.pruning_config().max_ratio,
        history=history,
        importance=ctx.importance,
        # recovery needs calibration images: without a dataset every prune goes unrepaired
        recovery=ctx.recovery if state.dataset and ctx.calibration_samples > 0 else "none",
        int8_reserve_points=state.accuracy_budget.int8_reserve_points if state.accuracy_budget is not None else 0.0,
        distillation_target_points=distillation_target(state.rounds, pruning_budget(state, ctx)),
        kinds=ctx.pruning_config().kinds,
        objective=ctx.objective,
        distills=rescues_wanted(state, ctx) > 0,
    )


def new_notes(planner_state: dict[str, Any], state: State) -> list[str]:
    """The planner's notes for the report (e.g. a shortened LLM prompt) that the run does not have yet."""
    return [n for n in planner_state.get("report_notes") or [] if n not in state.notes]


def planner_for(ctx: Context, run_dir: Path) -> Planner:
    """The run's planner: the LLM planner (exchanges logged in ``RUN/llm``) or one from the registry."""
    if ctx.planner == "llm":
        from agents.planning.llm_planner import llm_planner_for_run

        return llm_planner_for_run(
            run_dir,
            model=ctx.llm_model,
            base_url=ctx.llm_base_url,
            timeout_s=ctx.llm_timeout,
            max_attempts=ctx.llm_max_attempts,
            context_tokens=ctx.llm_context_tokens,
        )
    return get_planner(ctx.planner)


def analyze_profile(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    result = planner_for(ctx, paths(state).root).analyze(planning_context(state, ctx))
    planned = result.model_dump()
    atomic_write_json(paths(state).root / "plan.json", {k: planned[k] for k in ("source", "plan", "planner_state")})
    return {"plan": result, "next_plan": result, "notes": new_notes(result.planner_state, state)}
