"""Pruning agent: apply the current plan to an intact copy of the original model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph.runtime import Runtime

from agents.common import need, paths, settings, shape_of
from agents.context import AUTO_STEPS, Context
from agents.evaluation import distill_config, eval_spec
from agents.state import State
from tools.schemas import PendingRound
from tools.stages import ops

if TYPE_CHECKING:
    import torch

    from tools.compression.distill import DistillConfig


def prune_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    index = len(state.rounds)
    run = paths(state)
    planned = need(state.next_plan, "next_plan")
    plan = planned.plan
    artifact = run.round(index) / "model"
    spec = eval_spec(state, ctx)
    calibration = ops.calibration_batch(run.original, shape_of(state), spec)
    finetune, finetune_images, notes = _distillation(state, ctx, spec, index)
    report = ops.prune(
        run.original,
        plan,
        shape_of(state),
        artifact,
        ctx.pruning_config(),
        recovery=ctx.recovery_config(),
        calibration=calibration,
        finetune=finetune,
        finetune_images=finetune_images,
    )
    skipped = [f"{s['target']} ({s['reason']})" for s in report.get("skipped", [])]
    notes += [f"round {index}: skipped " + "; ".join(skipped)] if skipped else []
    if report.get("rebuilt"):  # a model left from an earlier plan or settings is never paired with this plan
        notes.append(f"round {index}: {report['rebuilt']}: rebuilt the pruned model for the current plan")
    pending = PendingRound(
        round=index,
        plan=plan,
        source=planned.source,
        planner_state=planned.planner_state,
        prune_report=report,
        artifact=str(artifact),
    )
    return {"pending_round": pending, "notes": notes}


def _distillation(
    state: State, ctx: Context, spec: ops.EvalSpec, index: int
) -> tuple[DistillConfig | None, torch.Tensor | None, list[str]]:
    """The round's distillation recipe and images (None, None when it is off), and, in round 0 with automatic
    steps, a note saying what was decided and why."""
    from tools.compression.distill_budget import AUTO_DISTILL_IMAGES, AUTO_DISTILL_SECONDS, AUTO_DISTILL_STEPS

    config = distill_config(state, ctx)
    images = ops.finetune_batch(paths(state).original, shape_of(state), spec) if config is not None else None
    if ctx.finetune_steps != AUTO_STEPS:
        return config, images, []
    available = 0 if images is None else len(images)
    if config is None:
        why = f"its {AUTO_DISTILL_STEPS[0]} steps would take more than {AUTO_DISTILL_SECONDS[1]:.0f} s a round"
    elif available < AUTO_DISTILL_IMAGES[0]:
        why = f"{available} unlabelled images are left for it beside evaluation, it needs {AUTO_DISTILL_IMAGES[0]:,}"
    else:
        done = f"distillation: automatic, {config.steps} steps after each prune on {available:,} unlabelled images"
        return config, images, [done] if index == 0 else []
    return None, None, [f"distillation: off ({why}; --finetune-steps N turns it on)"] if index == 0 else []
