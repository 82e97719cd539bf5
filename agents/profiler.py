"""Profiling agent: static MACs/params (ptflops) and dynamic latency/memory (torch.profiler, hooks)."""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.common import deployment_runtime, need, paths, settings, shape_of
from agents.context import Context
from agents.state import State
from tools.profiling.static import uncounted_note
from tools.schemas import ProfileSummary, SensitivitySummary
from tools.stages import ops


def profile_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    run = paths(state)
    profile = ops.profile(run.original, shape_of(state), run.profile, device=ctx.device, progress=ctx.progress)
    summary = ProfileSummary.of(profile)
    update: dict[str, object] = {"profile_path": str(run.profile / "profile.json"), "profile_summary": summary}
    note = uncounted_note(profile.uncounted_macs)
    return update | {"notes": [note]} if note else update


def profile_sensitivity(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Measure each prunable unit's damage on the calibration images (into ``profile.json``), when possible."""
    from agents.evaluation import eval_spec

    ctx = settings(runtime)
    if not (ctx.sensitivity and ctx.prune):
        return {}
    run = paths(state)
    result = ops.sensitivity(
        run.original,
        shape_of(state),
        run.profile,
        eval_spec(state, ctx),
        ctx.pruning_config(),
        ctx.recovery_config(),
        device=ctx.device,
        samples=ctx.sensitivity_samples,
        latency_runtime=deployment_runtime(state) if ctx.objective == "latency" else None,
    )
    if result is None:
        return {"notes": ["sensitivity profile skipped: no calibration images (a dataset is needed)"]}
    measured = SensitivitySummary(units=len(result.units), samples=result.samples, seconds=result.seconds)
    summary = need(state.profile_summary, "profile_summary").model_copy(update={"sensitivity": measured})
    return {"profile_summary": summary}
