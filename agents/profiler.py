"""Profiling agent: static MACs/params (ptflops) and dynamic latency/memory (torch.profiler, hooks)."""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.common import deployment_runtime, need, paths, settings, shape_of
from graph.context import Context
from graph.state import State
from tools import ops
from tools.profiling.static import uncounted_note
from tools.schemas import ProfileSummary, SensitivitySummary, TopGroup


def profile_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    run = paths(state)
    profile = ops.profile(run.original, shape_of(state), run.profile, device=ctx.device, progress=ctx.progress)
    top = [
        TopGroup(pattern=g.pattern, latency_share=g.latency_share, macs_share=g.macs_share) for g in profile.groups[:5]
    ]
    summary = ProfileSummary(
        total_params=profile.total_params,
        total_macs=profile.total_macs,
        grouped_conv_macs=profile.grouped_conv_macs,
        attention=profile.attention,
        latency_s=profile.latency_s,
        peak_memory_mb=profile.peak_memory_mb,
        trace_path=profile.trace_path,
        top_groups=top,
    )
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
