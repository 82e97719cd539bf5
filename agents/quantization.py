"""Quantization and deployment agent: the best pruned model through the fastest runtime within the budget.

With ``--deploy auto`` (the default) every runtime and precision available is built, evaluated and timed
side by side (:func:`tools.stages.deployment.deploy`), and the fastest within the accuracy budget is deployed,
never one slower than the original FP32 model. ``--deploy NAME`` measures and deploys that backend. The
original alone goes through the same runtime (``quantized_original``, as the paper's tables report).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime

from agents.common import baseline_accuracy, budget_points, disagreement_budget, need, paths, settings, shape_of
from agents.context import Context
from agents.evaluation import eval_spec, spec_for
from agents.iterative import pruned_entry
from agents.planning.selection import budget_drop_points
from agents.state import State
from tools.compression.units import sheds_layers
from tools.deploy.choice import (
    TIE_MARGIN,
    DeployCandidate,
    DeployChoice,
    Ships,
    can_outrun_the_original,
    has_pruned_within,
    is_chosen,
)
from tools.deploy.config import QuantizationConfig
from tools.deploy.registry import FLOAT, float_reference_of
from tools.schemas import (
    DeployedBuild,
    InputShape,
    Int8Sensitivity,
    PrunedEntry,
    QuantizationRecommendation,
    RoundResult,
    RuntimeReference,
)
from tools.stages import ops
from tools.stages.deployment import (
    Judging,
    accuracy_control,
    answers_of_copy,
    candidate_backends,
    deploy,
    full_int8,
    is_mixed,
)
from tools.stages.run_data import EvalSpec
from tools.stats import Budget
from tools.store.files import StagingDir, read_json
from tools.store.run_paths import RunPaths


def _artifact(r: RoundResult) -> Path | None:
    return Path(r.metrics.artifact) if r.metrics.artifact else None


def _used(r: RoundResult) -> float:
    """The points of the accuracy budget a round uses: its drop plus one standard error (inf when unknown)."""
    drop = budget_drop_points(r.accuracy_drop_points, r.metrics.paired)
    return float("inf") if drop is None else drop


def _roomier_rounds(state: State, source: Path) -> list[RoundResult]:
    """The rounds within budget with more accuracy headroom than the deployed source's, the roomiest first."""
    rounds = [r for r in state.rounds if r.within_budget and r.metrics.artifact]
    best = next((r for r in rounds if (a := _artifact(r)) is not None and a.resolve() == source.resolve()), None)
    if best is None:
        return []
    return sorted((r for r in rounds if _used(r) < _used(best)), key=_used)


def _cannot_outrun(state: State, r: RoundResult | PrunedEntry) -> bool:
    """Whether none of a round's builds can ship, saving too few of the original's MACs
    (:func:`tools.deploy.choice.can_outrun_the_original`)."""
    macs = r.metrics.macs if isinstance(r, RoundResult) else r.macs
    original_macs = state.baseline.macs if state.baseline is not None else None
    return not can_outrun_the_original(macs, original_macs, sheds_layers=sheds_layers(r.plan))


def _headroom_round(state: State, source: Path) -> RoundResult | None:
    """The round within budget with the most accuracy headroom (smallest drop + 1 se), when it is not the
    deployed source and has more headroom than it: its int8 may fit the budget where the best round's did not. Only a
    round that removes enough MACs to run faster than the original at all is one
    (:func:`tools.deploy.choice.can_outrun_the_original`): building the others costs minutes and cannot ship."""
    return next((r for r in _roomier_rounds(state, source) if not _cannot_outrun(state, r)), None)


def _saved(state: State, round_index: int | None, macs: int | None) -> str:
    """``round N: X %``: the share of the original's MACs a round saves."""
    original_macs = state.baseline.macs if state.baseline is not None and state.baseline.macs else 1
    return f"round {round_index}: {100 * (1 - (macs or 0) / original_macs):.1f} %"


def _left_out_note(left: list[str]) -> list[str]:
    """A note naming the rounds not built because they save too few of the original's MACs, and why."""
    if not left:
        return []
    return [
        f"deployment: nothing built from the rounds that save too few of the original's MACs ({', '.join(left)}): "
        f"a pruned build ships only {100 * TIE_MARGIN:.0f} % faster than the original's, and at batch 1 latency falls "
        "by less than MACs do"
    ]


def _headroom_left_out(state: State, source: Path, headroom: RoundResult | None) -> list[str]:
    """The rounds with more headroom than the kept one that are not built (they cannot outrun the original)."""
    if state.baseline is None or not state.baseline.macs:
        return []
    return [
        f"{_saved(state, r.round, r.metrics.macs)} (more accuracy headroom)"
        for r in _roomier_rounds(state, source)
        if _cannot_outrun(state, r) and (headroom is None or _used(r) < _used(headroom))
    ]


def _kept_cannot_outrun(state: State) -> bool:
    """Whether the kept round saves too few of the original's MACs for any of its builds to ship
    (:func:`tools.deploy.choice.can_outrun_the_original`): every build of it has the original's build in the same
    runtime beside it, at most that margin slower and as a rule more accurate: building it costs minutes for nothing."""
    pruned = state.pruned
    return pruned is not None and pruned.round is not None and bool(pruned.artifact) and _cannot_outrun(state, pruned)


def _second_student(state: State, source: Path) -> Path | None:
    """The kept round's other student when the round was distilled after the search (cross-fitted): its first
    student, the round's model, is judged alone on the half of the evaluation images it was not distilled on, so
    on a few thousand images its deployment can fail the budget by chance where the round passed it on every image;
    the second student, distilled on that half and judged on the other, may then deploy instead."""
    for r in state.rounds:
        students = r.cross_fit.students if r.cross_fit is not None else []
        artifact = _artifact(r)
        if len(students) > 1 and artifact is not None and artifact.resolve() == source.resolve():
            return Path(students[1].artifact)
    return None


def half_luck(state: State, model_dir: Path) -> float:
    """Points a distilled round's student did better on the half of the evaluation images it is judged on than the
    round's cross-fitted estimate on every image (0 for any other model, or where it did worse): the budget test
    takes that much off each of its builds judged there (``tools.deploy.choice.luck_removed``)."""
    for r in state.rounds:
        estimate = r.metrics.paired.delta_points if r.metrics.paired is not None else None
        for student in r.cross_fit.students if r.cross_fit is not None else []:
            if (
                estimate is not None
                and student.paired is not None
                and Path(student.artifact).resolve() == model_dir.resolve()
            ):
                return max(0.0, round(float(student.paired.delta_points) - float(estimate), 4))
    return 0.0


def _second_student_note(round_index: int | None, artifact: Path) -> str:
    return (
        f"deployment: round {round_index}'s second student ({artifact}), distilled on the other half of the "
        "evaluation images, is the pruned model: its build is within the accuracy budget, and the first student's "
        "(the round's model) were over it or not 5 % faster"
    )


#: What the note on an original that outran its pruned model adds with the paper's order (``--objective params``).
LATENCY_OBJECTIVE_HINT = (
    "; at batch 1 a CPU pays per layer, so fewer channels seldom run faster: `--objective latency` ranks rounds by "
    "their latency in the runtime they deploy to and plans whole blocks by what they save there"
)


def _original_note(
    choice: DeployChoice, pruned_source: Path, original_dir: Path, not_built: bool = False, objective: str | None = None
) -> str:
    """Why the unpruned original is deployed: the pruned model was not built (``not_built``: it saves too few MACs),
    no pruned model had a runtime within the accuracy budget, or the original's runtime is faster and no larger than
    the pruned model's fastest within it (:func:`tools.deploy.choice.dominates`); in the last case, with the paper's
    order (``objective`` params), what ``--objective latency`` would aim at instead."""
    round_name = pruned_source.parent.name if pruned_source.name == "model" else pruned_source.name
    kept = "(the pruned model stays in RUN/models and the report)"
    if not_built:
        return (
            f"deployment: nothing of the pruned model ({round_name}) was built, since it saves too few of the "
            f"original's MACs to run faster: the unpruned original is deployed in {choice.chosen} {kept}"
        )
    if has_pruned_within(choice.candidates, original_dir):
        hint = LATENCY_OBJECTIVE_HINT if objective == "params" else ""
        return (
            f"deployment: the unpruned original in {choice.chosen} is faster than every runtime of the pruned model "
            f"({round_name}) within the accuracy budget and no larger, so it is deployed {kept}: pruning gave this "
            f"model nothing the original in that runtime does not give{hint}"
        )
    return (
        f"deployment: no runtime of the pruned model ({round_name}) or of a round with more headroom passed the "
        f"accuracy budget test on the images it is judged on: the unpruned original is deployed in {choice.chosen} "
        f"{kept}"
    )


def _headroom_note(pruned: PrunedEntry) -> list[str]:
    return [
        f"deployment: round {pruned.round} (the most accuracy headroom) deploys faster within the accuracy budget "
        f"than round {pruned.selected_round} (faster runtimes of round {pruned.selected_round} over the budget, "
        "or the same runtime clearly slower), so it is the pruned model"
    ]


def _recommendations(state: State) -> list[QuantizationRecommendation]:
    return need(state.plan, "plan").plan.quantization_recommendations or [
        QuantizationRecommendation(layer="all", dtype="qint8", justification="default: every nn.Linear")
    ]


def _kept_source(state: State) -> Path:
    pruned = state.pruned
    return Path(pruned.artifact) if pruned is not None and pruned.artifact else paths(state).original


def _judging(state: State, ctx: Context, spec: EvalSpec, models: list[Path]) -> dict[Path, Judging]:
    """How each model's deployment candidates are judged: its evaluation (a distilled round's student on the half it
    was not distilled on), the lead it had there, taken off (:func:`half_luck`), and the round's other student
    (:func:`other_student`), whose builds are judged with its own."""
    return {
        m: Judging(spec=spec_for(state, ctx, m, spec), luck_points=half_luck(state, m), twin=other_student(state, m))
        for m in models
    }


def other_student(state: State, model_dir: Path) -> Path | None:
    """The other student of the distilled round ``model_dir`` is one of two students of (None for any other model):
    the deployment judges each build of one with the same build of the other, on every evaluation image."""
    for r in state.rounds:
        students = [Path(s.artifact).resolve() for s in (r.cross_fit.students if r.cross_fit is not None else [])]
        if len(students) == 2 and model_dir.resolve() in students:
            return students[1 - students.index(model_dir.resolve())]
    return None


def quantize_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Every candidate (the kept round, its second student, a round with more headroom, the original) in every
    runtime and precision: built, judged on the choose images, timed interleaved, decided; returns the one
    typed choice of what ships and why. The graph branches on ``choice.ships``; :func:`build_deployed_model`
    builds it. Everything the deployment needs from the run is read here, once, as values: it calls nothing back."""
    ctx = settings(runtime)
    run = paths(state)
    shape = shape_of(state)
    source = _kept_source(state)
    budget = Budget(max_drop_points=budget_points(state, ctx), max_disagreement_pct=disagreement_budget(state, ctx))
    spec = eval_spec(state, ctx)
    backends, forced = candidate_backends(ctx.quant_backend), ctx.quant_backend != "auto"
    headroom = _headroom_round(state, source)
    second = _second_student(state, source)
    left_out = _headroom_left_out(state, source, headroom)
    if not forced and _kept_cannot_outrun(state):  # the kept round's builds cannot ship: neither are built
        pruned = need(state.pruned, "pruned")
        left_out.insert(0, f"{_saved(state, pruned.round, pruned.macs)} (the kept round)")
        second = None
        source = Path(headroom.metrics.artifact) if headroom is not None and headroom.metrics.artifact else run.original
    alternatives = [
        *([second] if second else []),
        *([Path(headroom.metrics.artifact)] if headroom is not None and headroom.metrics.artifact else []),
        *([run.original] if source.resolve() != run.original.resolve() else []),
    ]
    alternatives = [a for a in alternatives if a.resolve() != source.resolve()]
    headroom_dir = Path(headroom.metrics.artifact) if headroom is not None and headroom.metrics.artifact else None
    ships: dict[str, Ships] = {
        **({str(second): "second_student"} if second else {}),
        **({str(headroom_dir): "headroom_round"} if headroom_dir else {}),
        str(run.original): "original",
    }
    ships[""] = ships.get(str(source), "kept_round")  # the model built first: the kept round, unless it cannot ship
    judging = _judging(state, ctx, spec, [source, *alternatives])
    choice = deploy(
        source,
        run.original,
        _recommendations(state),
        run.root / "models" / "deploy",
        shape,
        spec,
        backends=backends,
        within_budget=budget,
        baseline_accuracy=baseline_accuracy(state),
        repeats=ctx.latency_repeats,
        forced=forced,
        alternatives=alternatives,
        prebuilt=[run.root / "models" / "deploy-original"],
        int8_cpu=ctx.int8_cpu,
        control=functools.partial(
            accuracy_control, run.original, shape, spec, budget.max_drop_points, _int8_ranking(state)
        ),
        judging=judging,
        allow_over_budget=ctx.allow_over_budget,
        ships=ships,
    )
    return {"deployment": choice, "notes": [f"deployment: {choice.why}", *_left_out_note(left_out)]}


def adopt_second_student(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """The kept round's second student ships: it becomes the pruned model."""
    choice, pruned = need(state.deployment, "deployment"), need(state.pruned, "pruned")
    second = Path(need(choice.source, "deployment source"))
    return {
        "pruned": pruned.model_copy(update={"artifact": str(second), "student": 2}),
        "notes": [_second_student_note(pruned.round, second)],
    }


def adopt_headroom_round(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """The round with more headroom ships (its builds within budget are faster): it becomes the pruned model."""
    headroom = need(_headroom_round(state, _kept_source(state)), "round with more headroom")
    chosen_round = pruned_entry(headroom).model_copy(
        update={"selected_round": state.pruned.round if state.pruned is not None else None}
    )
    return {"pruned": chosen_round, "notes": _headroom_note(chosen_round)}


def adopt_original(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """The unpruned original ships in the chosen build (no pruned build within budget, or none faster)."""
    choice = need(state.deployment, "deployment")
    kept = _kept_source(state)
    ctx = settings(runtime)
    not_built = ctx.quant_backend == "auto" and _kept_cannot_outrun(state)
    not_built = not_built and _headroom_round(state, kept) is None
    return {"notes": [_original_note(choice, kept, paths(state).original, not_built, ctx.objective)]}


def _int8_ranking(state: State) -> Int8Sensitivity | None:
    """The original's per-block int8 damage, as the int8 profile measured it (None where it did not)."""
    summary = state.int8_profile
    if summary is None or not Path(summary.path).is_file():
        return None
    return Int8Sensitivity.model_validate(read_json(Path(summary.path)))


def _adopt_answers(report: dict[str, Any], artifact: Path, source: Path, state: State, ctx: Context) -> None:
    """A deployed build copied from its deployment candidate answers as the candidate did (evaluated there, on the
    images that judge ``source``): ``evaluate_quantized`` reads those answers instead of evaluating it again."""
    if report.get("copied_from"):
        spec = spec_for(state, ctx, source)
        answers_of_copy(artifact, Path(report["copied_from"]), paths(state).original, shape_of(state), spec)


@dataclass(frozen=True)
class _Inputs:
    """What building the deployment reads of the run, once: its paths, input shape, data and recommendations."""

    run: RunPaths
    shape: InputShape
    spec: EvalSpec
    recs: list[QuantizationRecommendation]


def build_deployed_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """The chosen build of the model that ships into ``RUN/models/quantized``, the original in the same build beside
    it, and the original in that runtime at FP32 (the references of the speed-up's split)."""
    ctx = settings(runtime)
    run = paths(state)
    shape = shape_of(state)
    recs = _recommendations(state)
    choice = need(state.deployment, "deployment")
    source = run.original if choice.ships == "original" else _kept_source(state)
    inputs = _Inputs(run=run, shape=shape, spec=eval_spec(state, ctx), recs=recs)
    chosen = next(c for c in choice.candidates if is_chosen(c.model_dump(), choice.model_dump()))
    built: list[dict[str, Any]] = []  # ops.quantize's reports: "rebuilt" says why a stale artifact was replaced
    if choice.chosen == FLOAT:  # the float models as they are
        quantized = _deployed_build(chosen, source, source)
        # RUN/models/quantized is where the README says the deployed model is: a copy of the float one
        with StagingDir(run.quantized) as staged:
            shutil.copytree(source, staged, dirs_exist_ok=True)
        quantized_original = _deployed_build(chosen, run.original, run.original)
    else:  # the chosen runtime where the deployed model lives (the candidate copied), for the best model and original
        quantized, quantized_original = _build_in_chosen_runtime(state, ctx, inputs, chosen, source, built)
    runtime_fp32_original = _runtime_fp32_original(inputs, choice.chosen, quantized_original, built)
    return {
        "quantized": quantized,
        "quantized_original": quantized_original,
        "runtime_fp32_original": runtime_fp32_original,
        "notes": [
            *(f"deployment: {b['rebuilt']}: rebuilt" for b in built if b["rebuilt"]),
            # fallbacks the backend took (e.g. nothing selected for int8, a preprocessing step that failed)
            *(f"deployment ({choice.chosen}): {note}" for note in (built[0].get("notes") or [] if built else [])),
        ],
    }


def _build_in_chosen_runtime(
    state: State,
    ctx: Context,
    inputs: _Inputs,
    chosen: DeployCandidate,
    source: Path,
    built: list[dict[str, Any]],
) -> tuple[DeployedBuild, DeployedBuild]:
    """Build ``source`` (from the chosen candidate's build where it can) and the original in the chosen runtime, each
    answering as its candidate did where copied from it; ``ops.quantize``'s reports are appended to ``built``."""
    run, shape, spec = inputs.run, inputs.shape, inputs.spec
    images, _ = ops.calibration_images(run.original, shape, spec)
    config = ctx.quantization_config().model_copy(update={"backend": chosen.backend})
    mixed = is_mixed(chosen.backend)
    recs = inputs.recs if mixed else full_int8(inputs.recs)
    controlled = (
        accuracy_control(run.original, shape, spec, budget_points(state, ctx), _int8_ranking(state)) if mixed else None
    )

    def build(model: Path, out: Path, reuse: list[Path]) -> None:
        report = ops.quantize(
            model,
            run.original,
            recs,
            out,
            config,
            shape=shape,
            calibration=images,
            accuracy_control=controlled,
            reuse=reuse,
        )
        built.append(report)
        _adopt_answers(report, out, model, state, ctx)

    build(source, run.quantized, [Path(chosen.artifact)] if chosen.artifact else [])
    quantized = _deployed_build(chosen, run.quantized, source)
    if source.resolve() == run.original.resolve():
        return quantized, quantized
    build(run.original, run.quantized_original, [run.root / "models" / "deploy-original" / chosen.backend])
    return quantized, _deployed_build(chosen, run.quantized_original, run.original)


def _runtime_fp32_original(
    inputs: _Inputs, backend: str, quantized_original: DeployedBuild, built: list[dict[str, Any]]
) -> RuntimeReference:
    """The original in the deployed ``backend``'s runtime at FP32: the reference that separates the runtime's gain
    from int8's, built where it is neither the float model nor the deployed build (its report appended to ``built``)."""
    run = inputs.run
    fp32_backend = float_reference_of(backend)
    reference = RuntimeReference(artifact=str(run.original), backend=fp32_backend)
    if fp32_backend != FLOAT and fp32_backend != backend:
        config = QuantizationConfig(backend=fp32_backend)
        reuse = [run.root / "models" / "deploy-original" / fp32_backend]
        built.append(
            ops.quantize(
                run.original,
                run.original,
                inputs.recs,
                run.runtime_fp32_original,
                config,
                shape=inputs.shape,
                reuse=reuse,
            )
        )
        reference.artifact = str(run.runtime_fp32_original)
    elif fp32_backend == backend:
        reference.artifact = quantized_original.artifact
    return reference


def _deployed_build(chosen: DeployCandidate, artifact: Path, built_from: Path) -> DeployedBuild:
    """The build at ``artifact`` of the model at ``built_from``, in the chosen candidate's runtime and precision."""
    return DeployedBuild(
        artifact=str(artifact),
        source=str(built_from),
        backend=chosen.backend,
        runtime=chosen.runtime,
        precision=chosen.precision,
    )
