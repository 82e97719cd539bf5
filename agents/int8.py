"""Int8 profiling agent: what int8 does to this model on this CPU, measured before pruning starts.

* the original through every runtime and precision available (``tools.stages.deployment.deploy``): the int8 damage of
  the deployment that would be chosen, which the pruning search keeps in reserve (``accuracy_budget``): pruning rounds
  are held to ``--max-accuracy-drop`` less that (with the parameters objective, less what it surely loses), so that
  int8 does not push the best pruned round over the budget;
* the per-block int8 sensitivity (ONNX Runtime static int8 of one block at a time, on calibration images, with the
  int8 settings of the CPU kind: ``tools.stages.ops.int8_sensitivity``), into the profile, for the planners' per-layer
  quantization decisions, where the original's full int8 is over the budget (else the profile says why not).
"""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.common import baseline_accuracy, budget_points, disagreement_budget, paths, settings, shape_of
from agents.context import Context
from agents.evaluation import eval_spec
from agents.state import State
from tools.deploy.budget import Hold
from tools.deploy.choice import DeployChoice
from tools.deploy.registry import FLOAT
from tools.schemas import Int8ProfileSummary, QuantizationRecommendation
from tools.stages import deployment, ops
from tools.stats import Budget
from tools.text import first_line

#: Every layer at int8: how the original is deployed before there is a plan.
ALL_INT8 = [QuantizationRecommendation(layer="all", dtype="qint8", justification="the original, every layer")]
#: How much of the original's int8 loss each ``--objective`` keeps back from pruning (``tools.deploy.budget.Hold``):
#: rounds kept for their size hold back only what the images show int8 surely loses; rounds kept for their int8
#: build's speed, the loss measured.
HOLD_BY_OBJECTIVE: dict[str, Hold] = {"params": "sure", "latency": "expected"}


def profile_int8(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Build, judge and time the original in every runtime and precision; split the accuracy budget between pruning
    and int8 (state ``accuracy_budget``; the original's runtime table is ``original_deployment``); measure int8's
    damage per block where it decides something (:func:`_blocks_needless`)."""
    ctx = settings(runtime)
    if not ctx.quantize:
        return {}
    run, shape, spec = paths(state), shape_of(state), eval_spec(state, ctx)
    update: dict[str, object] = {}
    notes: list[str] = []
    baseline = baseline_accuracy(state)
    if ctx.prune and baseline is not None and ctx.quant_backend != FLOAT:
        backends = [b for b in deployment.candidate_backends(ctx.quant_backend) if not deployment.is_mixed(b)]
        budget = Budget(max_drop_points=budget_points(state, ctx), max_disagreement_pct=disagreement_budget(state, ctx))
        choice = deployment.deploy(
            run.original,
            run.original,
            ALL_INT8,
            run.root / "models" / "deploy-original",
            shape,
            spec,
            backends=backends,
            within_budget=budget,
            baseline_accuracy=baseline,
            repeats=ctx.latency_repeats,
            int8_cpu=ctx.int8_cpu,
        )
        split = deployment.split_budget(choice, budget_points(state, ctx), HOLD_BY_OBJECTIVE[ctx.objective])
        notes.append(f"accuracy budget: {split.why}")
        update |= {"original_deployment": choice, "accuracy_budget": split}
        if (needless := _blocks_needless(choice, ctx.quant_backend)) is not None:
            ops.record_int8_not_measured(run.profile, needless)
            return {**update, "notes": [*notes, f"int8 sensitivity per block not measured: {needless}"]}
    # a model ONNX cannot export (Dinov2 with registers: bicubic resizing with antialiasing; MobileViTV2: col2im)
    # must not end the run: its other runtimes may take it, and the deployment table says which
    try:
        sensitivity = ops.int8_sensitivity(run.original, shape, run.profile, spec, int8_cpu=ctx.int8_cpu)
    except (RuntimeError, ValueError) as exc:
        sensitivity = None
        why = first_line(exc)
        ops.record_int8_not_measured(run.profile, why)
        notes.append(f"int8 sensitivity not measured: {why}; the plan's int8 decisions are not per block")
    if sensitivity is not None:
        target = sensitivity.int8.get("target")
        update["int8_profile"] = Int8ProfileSummary(
            path=str(run.profile / "int8_sensitivity.json"),
            blocks=len(sensitivity.groups),
            full_flips_pct=sensitivity.full_flips_pct,
            seconds=sensitivity.seconds,
            int8_target=None if target is None else str(target),
        )
    return {**update, "notes": notes} if notes else update


def _blocks_needless(choice: DeployChoice, quant_backend: str) -> str | None:
    """Why int8's damage per block decides nothing, or None where it may: a full static int8 build of the original
    is within the accuracy budget (judged with every try counted), so every layer goes int8 and no block needs float;
    a mixed-precision build of a pruned round, where one is built later, ranks its own blocks. Measured anyway when
    ``--deploy`` names a mixed-precision backend. At 260 px the table costs EfficientNet-Lite2 87 s of its run."""
    if deployment.is_mixed(quant_backend):
        return None
    within = [c for c in choice.candidates if c.ran and c.within_budget and c.precision.startswith("int8 static")]
    if not within:
        return None
    names = ", ".join(c.backend for c in within)
    return (
        f"the original's full static int8 ({names}) is within the accuracy budget, so every layer goes int8 and no "
        "block needs to stay in float (a mixed-precision build, where one is needed later, ranks its own blocks)"
    )
