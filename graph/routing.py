"""Routers: pure functions of state and settings (no side effects), tested directly."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from agents.context import Context, context_of
from agents.state import State


def after_pruning_stage(ctx: Context) -> Literal["quantize_model", "confirm_deployment"]:
    """Quantize and deploy, or with ``--no-quantize`` confirm the kept round's float model as what ships."""
    return "quantize_model" if ctx.quantize else "confirm_deployment"


def route_after_analyze_profile(
    state: State, runtime: Runtime[Context]
) -> Literal["review_plan", "prune_model", "quantize_model", "confirm_deployment"]:
    ctx = context_of(runtime)
    if not ctx.prune:
        return after_pruning_stage(ctx)
    return "review_plan" if ctx.approve_plan else "prune_model"


def route_after_iterate_pruning(state: State, runtime: Runtime[Context]) -> Literal["review_plan", "prune_model"]:
    ctx = context_of(runtime)
    return "review_plan" if ctx.approve_plan and ctx.approve_rounds else "prune_model"


def route_after_review_plan(
    state: State, runtime: Runtime[Context]
) -> Literal["prune_model", "select_best_model", "quantize_model", "confirm_deployment"]:
    if state.review is None or state.review.action != "reject":
        return "prune_model"
    if state.rounds:
        return "select_best_model"  # a rejected round ends the loop; earlier rounds still count
    return after_pruning_stage(context_of(runtime))


def rounds_wanted(ctx: Context) -> int:
    """The first candidate (from the analysis plan) plus T iterative rounds."""
    return 1 + (ctx.iterations if ctx.iterate else 0)


def after_search(state: State, ctx: Context) -> Literal["distill_over_budget_round", "select_best_model"]:
    """Distil a round over the budget when one is worth it (``agents.distillation``), else select the best."""
    from agents.distillation import next_round_to_distill

    return "distill_over_budget_round" if next_round_to_distill(state, ctx) else "select_best_model"


def reached_target_speedup(state: State, ctx: Context) -> bool:
    """``--target-speedup X``: a round within the budget runs at least X times faster than the original in the build
    the original deploys in (``Metrics.deploy_speedup``): the search stops there."""
    if not ctx.target_speedup:
        return False
    return any(r.within_budget and float(r.metrics.deploy_speedup or 0.0) >= ctx.target_speedup for r in state.rounds)


def route_after_evaluate_model(
    state: State, runtime: Runtime[Context]
) -> Literal["iterate_pruning", "distill_over_budget_round", "select_best_model"]:
    from agents.distillation import ladder_round_left, target_rounds_left

    ctx = context_of(runtime)
    if reached_target_speedup(state, ctx):
        return "select_best_model"
    if len(state.rounds) < rounds_wanted(ctx):
        return "iterate_pruning"
    then = after_search(state, ctx)  # past the T rounds: a round at a distillation target may take more tries,
    more = target_rounds_left(state, ctx) or ladder_round_left(state, ctx, rounds_wanted(ctx))  # or the depth ladder
    return "iterate_pruning" if then == "select_best_model" and ctx.iterate and more else then


def route_after_distill_over_budget_round(
    state: State, runtime: Runtime[Context]
) -> Literal["distill_over_budget_round", "iterate_pruning", "select_best_model"]:
    """Another round worth distilling, else, while distillations are left, one more planned round (the search goes
    on from the distilled rounds: past one back within the budget, at the drop its recovery can bring back; short
    of one still over it), else the end."""
    from agents.distillation import distillations_left

    ctx = context_of(runtime)
    then = after_search(state, ctx)
    if then == "select_best_model" and ctx.iterate and distillations_left(state, ctx):
        return "iterate_pruning"
    return then


def route_after_select_best_model(
    state: State, runtime: Runtime[Context]
) -> Literal["quantize_model", "confirm_deployment"]:
    return after_pruning_stage(context_of(runtime))


#: The node that makes each model the deployment may ship the pruned model (``DeployChoice.ships``).
AfterDeployChoice = Literal["adopt_second_student", "adopt_headroom_round", "adopt_original", "build_deployed_model"]
ADOPT_NODE: dict[str, AfterDeployChoice] = {
    "second_student": "adopt_second_student",
    "headroom_round": "adopt_headroom_round",
    "original": "adopt_original",
    "kept_round": "build_deployed_model",
}


def route_after_quantize_model(state: State) -> AfterDeployChoice:
    """What ships decides the branch: another model than the kept round is adopted first, then it is built."""
    return ADOPT_NODE[state.deployment.ships if state.deployment is not None else "kept_round"]


def route_after_confirm_deployment(state: State) -> Literal["build_deployed_model", "measure_latencies"]:
    """A build that failed its confirmation gives way to the next of the declared sequence, which is built first."""
    confirmation = state.confirmation
    return "build_deployed_model" if confirmation is not None and not confirmation.done else "measure_latencies"
