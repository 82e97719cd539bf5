"""Distillation after the search: a round the pruning search left over the accuracy budget, distilled from the
original and judged cross-fitted on the evaluation images, becomes a round of its own. Once one came back within
budget, what it recovered sets how large the next may be (``agents.planning.recovery``).

Measured on CIFAR ResNet-56 (default run, 5,000 unseen images): its 18.4 % round, repaired, lost 1.14 points and was
refused; two students distilled from it on halves of the evaluation images lost nothing (+0.70, +0.10), and their
answers on the halves they did not see gave +0.77 +/- 0.72 on the run's images (``benchmarks/cross_fit_distill.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from langgraph.runtime import Runtime

from agents.common import baseline_accuracy, disagreement_budget, need, paths, pruning_budget, settings, shape_of
from agents.context import AUTO_STEPS, Context
from agents.evaluation import (
    MIN_CROSS_FIT_IMAGES,
    data_parts,
    distilled_pairs,
    eval_spec,
    rescue_config,
    rescues_wanted,
    total_macs,
    with_deploy_latency,
)
from agents.planning.base import RoundRecord
from agents.planning.recovery import AT_TARGET, DEPTH_KEY
from agents.planning.selection import (
    accuracy_drop_points,
    blocks_removed,
    distillation_target,
    kept_round,
    ladder_starts,
    ladder_step_wanted,
    planned_since_recovery,
    round_to_distill,
    within_budget,
)
from agents.state import State
from tools.compression.distill import DistillConfig
from tools.compression.distill_budget import AUTO_DISTILL_SECONDS, SOLO_STEPS_FACTOR, auto_distill_floor_seconds
from tools.compression.units import sheds_layers
from tools.deploy.choice import TIE_MARGIN
from tools.schemas import CrossFit, RoundResult
from tools.stages import ops
from tools.stages.cross_fit import CrossFitResult, cross_fit_distill, distil_solo, extends_by_blocks, solo
from tools.store.files import atomic_write_json

logger = logging.getLogger(__name__)

#: Rounds the search plans at a distillation target before it gives up on it (the rules planner's damage budgets:
#: the target's, then 0.9x and 0.8x). Measured: CIFAR ResNet-20's first round at its target lost 5.26 points where
#: 1.1 were aimed at (its stage stream was pruned), and the search ended there.
TARGET_TRIES = 3


def next_round_to_distill(state: State, ctx: Context) -> RoundResult | None:
    """The round distillation after the search takes next (None: off, unaffordable, or none left)."""
    rescues = rescues_wanted(state, ctx)
    if rescues == 0:
        return None
    original_params = state.baseline.params if state.baseline is not None else 0
    budget = pruning_budget(state, ctx)
    return round_to_distill(
        state.rounds,
        ctx.selection,
        budget,
        rescues,
        original_params,
        search_goes_on=ctx.iterate,
        objective=ctx.objective,
        targets_done=not (ctx.iterate and _target_tries_left(state.rounds)),
    )


def distillations_left(state: State, ctx: Context) -> bool:
    """Whether distillation after the search is on, affordable and has distillations left (``--distill-rescues``),
    and, once a distilled round came back within budget, whether what it recovered leaves room for a larger one
    (``selection.distillation_target``) or, with the latency objective, the depth ladder has its next step to take
    (``selection.ladder_step_wanted``: half as many again as the blocks of a round within budget; CIFAR
    ResNet-56's three blocks came back at -0.13 points and the run ended there, at 1.12x, where nine come back
    within a point at 1.49x)."""
    rounds = state.rounds
    if _rescues_spent(state, ctx):
        return False
    if _ladder_step_left(state, ctx):
        return True
    if planned_since_recovery(rounds) is not None:  # after one came back: while it can grow
        return distillation_target(rounds, pruning_budget(state, ctx)) is not None
    return True


def ladder_round_left(state: State, ctx: Context, searched: int) -> bool:
    """Whether, past the search's ``searched`` rounds, the search should plan the depth ladder's next step: the
    latency objective, distillations left to bring it back, and a step wanted (``selection.ladder_step_wanted``: a
    round within budget removed blocks, and half as many again were not planned yet); past them, only while the last
    round was the ladder's (a planner that planned something else ends it). CIFAR ResNet-56: the search's last
    round removed three blocks within budget training-free (0.54 points lost), no round was worth distilling (none
    3 % faster than the kept two blocks, 1.10x the original), and the run ended there with its distillation unspent,
    where the benchmark's nine blocks come back within a point at 1.49x."""
    rounds = state.rounds
    if not ctx.iterate or len(rounds) < searched:
        return False
    if len(rounds) > searched and DEPTH_KEY not in rounds[-1].planner_state:
        return False
    return not _rescues_spent(state, ctx) and _ladder_step_left(state, ctx)


def _rescues_spent(state: State, ctx: Context) -> bool:
    """Whether the run made every distillation after the search it may (:func:`rescues_wanted`)."""
    return sum(1 for r in state.rounds if r.cross_fit is not None) >= rescues_wanted(state, ctx)


def _ladder_step_left(state: State, ctx: Context) -> bool:
    """Whether the latency objective's depth ladder wants its next step (``selection.ladder_step_wanted``)."""
    return ctx.objective == "latency" and bool(ladder_step_wanted([RoundRecord.of(r) for r in state.rounds]))


def _target_tries_left(rounds: list[RoundResult]) -> bool:
    """Whether the last round was planned at the distillation target and fewer than :data:`TARGET_TRIES` were since
    the last distilled round came back within budget."""
    planned = planned_since_recovery(rounds)
    return (
        planned is not None and bool(planned) and AT_TARGET in planned[-1].planner_state and len(planned) < TARGET_TRIES
    )


def target_rounds_left(state: State, ctx: Context) -> bool:
    """Whether the search should plan one more round at the distillation target: a distilled round came back
    within budget, distillations are left (:func:`distillations_left`), the last round was planned at the target
    (its planner says so, ``recovery.AT_TARGET``; one planned otherwise ends the tries) and fewer than
    :data:`TARGET_TRIES` rounds were planned since the last one came back (a round that overshot the target moves
    the damage line: the next is planned from it)."""
    return _target_tries_left(state.rounds) and distillations_left(state, ctx)


def distill_over_budget_round(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Distil the most promising round over the budget twice, cross-fitted on the evaluation images, and append
    the first student as a new round judged by both students' answers on the halves they did not see; with extra
    images enough, once on the fit images, the student judged on every evaluation image (:func:`_students`)."""
    ctx = settings(runtime)
    source = next_round_to_distill(state, ctx)
    config = rescue_config(state, ctx, sheds_layers=source is not None and sheds_layers(source.plan))
    if source is None or config is None:
        return {}
    index, run, shape = len(state.rounds), paths(state), shape_of(state)
    folder, spec = run.round(index), eval_spec(state, ctx)
    artifact = Path(need(source.metrics.artifact, f"round {source.round}'s artifact"))
    start = _ladder_start(state.rounds, source, artifact)
    result = _students(state, spec, source, artifact, config, None if start is None else _student_artifacts(start))
    first = result.students[0]
    half = spec.model_copy(update={"evaluation_half": first.judged_on_half})
    measured = ops.evaluate(Path(first.artifact), run.original, shape, half, f"round {index}", throughput=False)
    merged = {"accuracy": result.accuracy, "samples": result.samples, "paired": result.paired}
    metrics = measured.model_copy(update=merged)  # its cost as measured; its accuracy from both students
    drop = accuracy_drop_points(baseline_accuracy(state), result.accuracy)
    budget = pruning_budget(state, ctx)
    record = RoundResult(
        round=index,
        plan=source.plan,
        source=source.source,
        planner_state=source.planner_state,  # the planner's search reads it as the level it tried
        prune_report=_distilled_report(source, result, start),
        metrics=metrics,
        accuracy_drop_points=drop,
        within_budget=within_budget(drop, budget, result.paired, disagreement_budget(state, ctx)),
        cross_fit=CrossFit(
            source_round=source.round,
            judged_on_half=first.judged_on_half,
            images_per_student=result.images_per_student,
            students=result.students,
            started_from_round=None if start is None else start.round,
        ),
    )
    timed = with_deploy_latency(state, ctx, record) if ctx.objective == "latency" else [record]
    record = timed[-1]
    notes = [
        _note(record, source, budget, start, extra=spec.extra_images is not None),
        *_worse_note(index, source, result),
    ]
    atomic_write_json(folder / "round.json", record.model_dump())
    return {"rounds": timed, "notes": notes}


def _distilled_report(source: RoundResult, result: CrossFitResult, start: RoundResult | None) -> dict[str, object]:
    """The distilled round's prune report: its source's, with how its (first) student was distilled (``finetune``)."""
    first = result.students[0]
    return {
        **(source.prune_report or {}),
        "finetune": {
            **first.distilled,
            "cross_fitted_from_round": source.round,
            **({"solo": True} if first.judged_on_half is None else {}),  # one student, on the fit images
            **({"started_from_round": start.round} if start is not None else {}),
        },
    }


def _worse_note(index: int, source: RoundResult, result: CrossFitResult) -> list[str]:
    """A note where the students did worse than the round they started from, on the same images: with the same
    parameters, selection (accuracy first) keeps the round's own model wherever both are within the budget."""
    before, after = source.metrics.paired, result.paired
    if before is not None and after is not None and after.delta_points < before.delta_points:
        return [
            f"round {index}: distillation made round {source.round} worse on the images its students did not see "
            f"(Δ {after.delta_points:+.2f} against {before.delta_points:+.2f} "
            f"points before): where both are within the budget, round {source.round}'s own model is kept"
        ]
    return []


def _students(
    state: State,
    spec: ops.EvalSpec,
    source: RoundResult,
    artifact: Path,
    config: DistillConfig,
    starts: tuple[Path, ...] | None,
) -> CrossFitResult:
    """The students of round ``source`` (saved at ``artifact``) in the next round's folder: one on the fit images
    where the run's extra images are enough (``tools.stages.cross_fit.solo``: twice the steps), else two cross-fitted on
    halves of the evaluation images; each from its ladder start where ``starts`` names them."""
    index, run, shape = len(state.rounds), paths(state), shape_of(state)
    folder = run.round(index)
    if solo(spec, ops.extra_images_used(spec, shape), int(data_parts(state).get("evaluation") or 0)):
        logger.info("round %d: distilling round %d once, on the fit and extra images", index, source.round)
        longer = config.model_copy(update={"steps": SOLO_STEPS_FACTOR * config.steps})
        begin = None if starts is None else starts[0]
        return distil_solo(artifact, run.original, shape, spec, folder / "model", longer, begin)
    logger.info("round %d: distilling round %d twice, cross-fitted", index, source.round)
    pair = None if starts is None or len(starts) != 2 else (starts[0], starts[1])
    return cross_fit_distill(
        artifact, run.original, shape, spec, (folder / "model", folder / "model-second"), config, pair
    )


def _ladder_start(rounds: list[RoundResult], source: RoundResult, artifact: Path) -> RoundResult | None:
    """The distilled round whose students ``source``'s start from (``selection.ladder_starts``, the first whose
    saved students ``source``'s model extends by blocks removed alone); None: they start from ``source``'s."""
    for start in ladder_starts(rounds, source):
        if all(Path(p).is_dir() and extends_by_blocks(artifact, Path(p)) for p in _student_artifacts(start)):
            return start
    return None


def _student_artifacts(start: RoundResult) -> tuple[Path, ...]:
    """A distilled round's students, in the order they were distilled (the first on half 0; a lone one alone)."""
    students = sorted(need(start.cross_fit, "cross_fit").students, key=lambda s: -(s.judged_on_half or 0))
    return tuple(Path(s.artifact) for s in students)


def _note(
    record: RoundResult, source: RoundResult, budget: float, start: RoundResult | None = None, extra: bool = False
) -> str:
    """The run's note on a distillation after the search (``extra``: the run's extra images trained it too)."""
    cross_fit = need(record.cross_fit, "cross_fit")
    paired = need(record.metrics.paired, "paired accuracy")
    steps = int(cross_fit.students[0].distilled.get("steps") or 0)
    verdict = "within" if record.within_budget else "still over"
    lone = cross_fit.judged_on_half is None  # one student, on the fit images (the extra images among them)
    begun = (
        ""
        if start is None
        else (
            f", starting from round {start.round}'s student"
            if lone
            else f", each student starting from round {start.round}'s of the same half"
        )
        + f" ({len(blocks_removed(start))} of its {len(blocks_removed(source))} blocks removed and distilled already)"
    )
    why = (
        f"within the {budget:g}-point budget alone, refused as the best of several"
        if source.within_budget
        else f"over the {budget:g}-point budget"
    )
    result = (
        f"Δ {paired.delta_points:+.2f} [{paired.ci95_low_points:+.2f}, {paired.ci95_high_points:+.2f}] on "
        f"{paired.samples:,} images: {verdict} the budget"
    )
    head = (
        f"round {record.round}: round {source.round} ({why}, drop {source.accuracy_drop_points or 0.0:.2f}) distilled "
        f"from the original, {steps} steps"
    )
    extra_text = " + extra images" if extra else ""
    if lone:
        return (
            f"{head}, once{begun}: on {cross_fit.images_per_student:,} images (calibration + extra images), none of "
            f"the evaluation images; judged on all of them, {result}"
        )
    return (
        f"{head}, twice{begun}: each student on {cross_fit.images_per_student:,} images (calibration{extra_text} + one "
        f"half of the evaluation images), judged on the other half; together {result}. The first student is the "
        f"round's model; it and its int8 builds are judged on half {cross_fit.judged_on_half} only"
    )


def _shrunk_steps_note(state: State) -> str:
    """Where the later pairs' students took fewer steps than the first's (``rescue_steps``), how many and why."""
    from tools.compression.distill_budget import AUTO_RESCUE_SECONDS, DEPTH_STEPS_FACTOR, MIN_RESCUES

    pairs = distilled_pairs(state)
    widths = [p.steps // DEPTH_STEPS_FACTOR if p.sheds_layers else p.steps for p in pairs if p.steps]
    if len(set(widths)) < 2:
        return ""
    first, last = widths[0], widths[-1]
    return (
        f" (students of {first:,} steps, then {last:,}: at the time the first pair took, {MIN_RESCUES} pairs of "
        f"{first:,} would not fit the {AUTO_RESCUE_SECONDS[0]:,.0f} s budget)"
    )


def distillation_summary(state: State, ctx: Context) -> str | None:
    """One line for the run's notes on distillation after the search: why it was off, or how many rounds it
    distilled of how many the run allowed and why it stopped. None where the settings turned it off
    (``--distill-rescues 0``, rounds distilled already, no pruning or no dataset) or the original is at chance
    level (said at the run's start). A run that distilled nothing said nothing of it: CIFAR Swin-tiny with
    ``--objective latency`` ended at 700 s where no round ran 3 % faster than the kept one, and a 260-px
    EfficientNet-Lite2 run never said that automatic distillation was off for a model of its size."""
    if not (ctx.prune and state.dataset) or ctx.distill_rescues == 0 or ctx.finetune_steps != 0:
        return None
    if state.baseline is None or state.baseline.at_chance:
        return None
    head = "distillation after the search"
    if rescue_config(state, ctx) is None:
        parts, macs = data_parts(state), total_macs(state) or 0
        if not parts.get("calibration") or int(parts.get("evaluation") or 0) < MIN_CROSS_FIT_IMAGES:
            return (
                f"{head}: off: its students need calibration images and at least {MIN_CROSS_FIT_IMAGES} evaluation "
                f"images to be judged on (this run: {int(parts.get('calibration') or 0)} and "
                f"{int(parts.get('evaluation') or 0)})"
            )
        if macs <= 0:
            return f"{head}: off: the model's MACs were not counted, so its cost cannot be planned"
        return (
            f"{head}: off: {macs / 1e6:,.0f} M MACs per image make its fewest steps take about "
            f"{auto_distill_floor_seconds(macs):,.0f} s at one core's planned rate, over the "
            f"{AUTO_DISTILL_SECONDS[1]:.0f} s a round may take"
        )
    done, wanted = sum(1 for r in state.rounds if r.cross_fit is not None), rescues_wanted(state, ctx)
    made = f"{head}: {done} distillation(s) made of at most {wanted}" + _shrunk_steps_note(state)
    if done >= wanted:
        return made + (
            " (as many as --distill-rescues auto's time allows)" if ctx.distill_rescues == AUTO_STEPS else ""
        )
    budget = pruning_budget(state, ctx)
    if planned_since_recovery(state.rounds) is not None and distillation_target(state.rounds, budget) is None:
        return f"{made}: what the distilled rounds gave back leaves no room for a larger round within the budget"
    kept = kept_round(state.rounds, ctx.selection, budget, ctx.objective)
    if ctx.objective == "latency":
        than = "the original"
        if kept is not None:
            speedup, where = kept.metrics.deploy_speedup, kept.metrics.deploy_backend
            timed = f" ({float(speedup):.2f}x the original in {where})" if speedup and where else ""
            than = f"round {kept.round}, the kept one{timed}"
        return (
            f"{made}: no round left worth one: none not distilled yet ran more than {TIE_MARGIN * 100:g} % faster than "
            f"{than}, within what distillation may bring back"
        )
    than = (
        f"round {kept.round}, the kept one ({kept.metrics.params:,} parameters)" if kept is not None else "the original"
    )
    return f"{made}: no round left worth one: none not distilled yet is smaller than {than}"
