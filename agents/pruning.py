"""Pruning agent: apply the current plan to an intact copy of the original model."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings, shape_of
from agents.evaluation import eval_spec
from agents.planning.base import PlanResult
from graph.context import Context
from graph.state import State
from tools import ops


def prune_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    index = len(state.get("rounds") or [])
    run = paths(data)
    planned = PlanResult.model_validate(state["next_plan"])
    plan = planned.plan
    artifact = run.round(index) / "model"
    spec = eval_spec(data, ctx)
    calibration = ops.calibration_batch(run.original, shape_of(data), spec)
    finetune = finetune_images = None
    if ctx.finetune_steps > 0:
        from tools.compression.distill import DistillConfig

        finetune = DistillConfig(steps=ctx.finetune_steps, device=ctx.device, seed=ctx.seed)
        finetune_images = ops.finetune_batch(run.original, shape_of(data), spec)
    report = ops.prune(
        run.original,
        plan,
        shape_of(data),
        artifact,
        ctx.pruning_config(),
        recovery=ctx.recovery_config(),
        calibration=calibration,
        finetune=finetune,
        finetune_images=finetune_images,
    )
    skipped = [f"{s['target']} ({s['reason']})" for s in report.get("skipped", [])]
    notes = [f"round {index}: skipped " + "; ".join(skipped)] if skipped else []
    if report.get("rebuilt"):  # a model left from an earlier plan or settings is never paired with this plan
        notes.append(f"round {index}: {report['rebuilt']}: rebuilt the pruned model for the current plan")
    pending = {
        "round": index,
        "plan": plan.model_dump(),
        "source": planned.source,
        "planner_state": planned.planner_state,
        "prune_report": report,
        "artifact": str(artifact),
    }
    return {"pending_round": pending, "notes": notes}
