"""Evaluation agent: accuracy, latency, memory and size of every model the run produces."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from langgraph.runtime import Runtime

from agents.common import (
    at_chance,
    baseline_accuracy,
    budget_points,
    disagreement_budget,
    need,
    paths,
    pruning_budget,
    settings,
    shape_of,
    unlabelled,
)
from agents.context import AUTO_STEPS, Context
from agents.planning.selection import accuracy_drop_points, within_budget
from agents.state import State
from tools.deploy.registry import FLOAT
from tools.evaluation.accuracy import chance_note
from tools.evaluation.paired import predictions_path
from tools.schemas import (
    BaselineEntry,
    DeployedBuild,
    DeployedEntry,
    Metrics,
    ModelEntry,
    RoundResult,
    RuntimeReference,
)
from tools.stages import ops
from tools.stages.run_data import part_label
from tools.stats import at_chance_note, drop_points, resolution_note, unlabelled_note
from tools.store.files import atomic_write_json

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig, PrecisionSetting
    from tools.compression.distill_budget import DistilledPair

logger = logging.getLogger(__name__)

#: The pruning factor (unpruned / pruned latency, same runtime and precision) under which the run says pruning
#: made the deployed model slower.
SLOWER_FACTOR = 0.95

#: The fewest evaluation images distillation after the search splits into halves (each student is judged on one).
MIN_CROSS_FIT_IMAGES = 100


def distill_precision(ctx: Context) -> PrecisionSetting:
    """``--distill-precision``, with ``auto`` resolved: bf16 on a GPU with bf16 tensor cores; on a CPU that computes
    bf16 natively (AMX-BF16 or AVX512-BF16, ``tools.deploy.cpu``), the faster of the two for the model, timed
    (``fastest``: CIFAR ViT-tiny's steps are faster in FP32 there, ResNet-20's in bf16); else fp32."""
    if ctx.distill_precision != "auto":
        return "bf16" if ctx.distill_precision == "bf16" else "fp32"
    import torch

    from tools.deploy.cpu import detect_cpu
    from tools.models.base import resolve_device

    device = resolve_device(ctx.device)
    if device.type == "cuda":  # bf16 tensor cores from Ampere (compute capability 8.0) on; older GPUs emulate it
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp32"
    return "fastest" if detect_cpu().bf16 else "fp32"


def total_macs(state: State) -> int | None:
    """The original's MACs per image (None before the profile)."""
    return state.profile_summary.total_macs if state.profile_summary is not None else None


def has_attention(state: State) -> bool:
    """Whether the original has attention modules (False before the profile)."""
    return state.profile_summary.attention if state.profile_summary is not None else False


def grouped_conv_macs(state: State) -> int:
    """Of the original's MACs per image, those of grouped (depthwise) convolutions (0 before the profile)."""
    return state.profile_summary.grouped_conv_macs if state.profile_summary is not None else 0


def data_parts(state: State) -> dict[str, int]:
    """Rows each disjoint part of the data holds (the baseline's ``data_parts``; empty before the baseline)."""
    return state.baseline.data_parts if state.baseline is not None else {}


def distill_config(state: State, ctx: Context) -> DistillConfig | None:
    """The run's distillation recipe (None: off): the settings' steps, or with ``--finetune-steps auto`` what the
    model's MACs allow (``tools.compression.distill_budget.auto_distill_config``; none before the profile)."""
    from tools.compression.distill import DistillConfig
    from tools.compression.distill_budget import auto_distill_config

    precision = distill_precision(ctx)
    if ctx.finetune_steps == AUTO_STEPS:
        return auto_distill_config(
            total_macs(state), device=ctx.device, seed=ctx.seed, precision=precision, attention=has_attention(state)
        )
    if not ctx.finetune_steps:
        return None
    return DistillConfig(steps=ctx.finetune_steps, device=ctx.device, seed=ctx.seed, precision=precision)


def rescue_config(state: State, ctx: Context, *, sheds_layers: bool = False) -> DistillConfig | None:
    """The recipe of distillation after the search (``--distill-rescues``): automatic distillation's, when the rounds
    were not distilled already (``--finetune-steps 0``), the run has a dataset, calibration images and at least
    :data:`MIN_CROSS_FIT_IMAGES` evaluation images, and the model is small enough for it (``auto_rescue_config``,
    its steps after the pairs distilled so far); with ``auto``, not for an original at chance level (untrained, or
    labels that do not match). None otherwise. ``sheds_layers``: for a round that removes whole layers (more steps:
    ``DEPTH_STEPS_FACTOR``)."""
    from tools.compression.distill_budget import auto_rescue_config

    if ctx.distill_rescues == 0 or ctx.finetune_steps != 0 or not state.dataset:
        return None
    if ctx.distill_rescues == AUTO_STEPS and at_chance(state):
        return None  # an original at chance level has nothing to teach: minutes spent for no answer (said at its start)
    parts = data_parts(state)
    if not parts.get("calibration") or int(parts.get("evaluation") or 0) < MIN_CROSS_FIT_IMAGES:
        return None
    precision = distill_precision(ctx)
    return auto_rescue_config(
        total_macs(state),
        device=ctx.device,
        seed=ctx.seed,
        precision=precision,
        sheds_layers=sheds_layers,
        pairs=distilled_pairs(state) if ctx.distill_rescues == AUTO_STEPS else (),  # --distill-rescues N: steps kept
        attention=has_attention(state),
    )


def distilled_pairs(state: State) -> list[DistilledPair]:
    """The pairs distilled after the search so far, with the time they took (``tools.compression.distill``)."""
    from tools.compression.distill_budget import SOLO_STEPS_FACTOR, DistilledPair, training_seconds
    from tools.compression.units import sheds_layers

    return [
        DistilledPair(
            seconds=sum(training_seconds(s.distilled) for s in r.cross_fit.students),
            # a lone student's steps, as the pair of the same time would have taken them each
            steps=max((int(s.distilled.get("steps") or 0) for s in r.cross_fit.students), default=0)
            // (SOLO_STEPS_FACTOR if len(r.cross_fit.students) == 1 else 1),
            sheds_layers=sheds_layers(r.plan),
        )
        for r in state.rounds
        if r.cross_fit is not None
    ]


def rescues_wanted(state: State, ctx: Context) -> int:
    """Cross-fitted distillations after the search the run makes at most: ``--distill-rescues N``, or with ``auto``
    what the model's MACs allow, or more where the pairs distilled so far took less time than that assumed
    (``tools.compression.distill_budget.auto_rescues``); 0 where :func:`rescue_config` is off."""
    from tools.compression.distill_budget import auto_rescues

    if rescue_config(state, ctx) is None:
        return 0
    if ctx.distill_rescues != AUTO_STEPS:
        return ctx.distill_rescues
    return auto_rescues(total_macs(state), distilled_pairs(state))


def round_files(r: RoundResult) -> list[Path]:
    """The files of a round's per-image answers on the evaluation images: its model's, or a distilled round's
    students', each on the half it was not distilled on; empty when the round kept no artifact."""
    if r.cross_fit is not None:
        return [
            predictions_path(Path(s.artifact), part_label("evaluation", s.judged_on_half)) for s in r.cross_fit.students
        ]
    return [predictions_path(Path(r.metrics.artifact), "evaluation")] if r.metrics.artifact else []


def finetune_samples(state: State, ctx: Context) -> int:
    """Unlabelled images asked for distillation: the settings', or with automatic steps up to 4,096 where the
    model is distilled at all."""
    if ctx.finetune_steps != AUTO_STEPS:
        return ctx.finetune_samples
    from tools.compression.distill_budget import AUTO_DISTILL_IMAGES

    return (ctx.finetune_samples or AUTO_DISTILL_IMAGES[1]) if distill_config(state, ctx) else 0


def eval_spec(state: State, ctx: Context) -> ops.EvalSpec:
    """The run's data: its disjoint fit (calibration, finetune), choose (evaluation) and confirm parts, where their
    reads are recorded, and how to batch it."""
    from tools.evaluation.twin import float_runtime_for

    points = budget_points(state, ctx)
    finetune = finetune_samples(state, ctx)
    macs = total_macs(state)
    samples = ctx.eval_samples or ops.auto_eval_samples(macs, budget_points=points)
    evaluated = int(data_parts(state).get("evaluation") or samples)
    # the automatic size takes the rows no part takes (split_indices); a run whose baseline was judged on exactly
    # the asked rows (made before this rule) keeps them, so that its rounds stay on the same images when resumed
    spare = not ctx.eval_samples and (state.baseline is None or evaluated != samples)
    return ops.EvalSpec(
        dataset=state.dataset,
        split=state.dataset_split,
        label_match=state.label_match.model_dump() if state.label_match is not None else None,
        samples=samples,
        spare_to_evaluation=spare,
        float_runtime=float_runtime_for(macs, evaluated, ctx.device, grouped_conv_macs(state)),
        calibration_samples=ctx.calibration_samples,
        confirm_samples=ctx.confirm_samples,
        reads_log=str(paths(state).data_reads) if state.run_dir else None,
        finetune_samples=finetune,
        extra_images=ctx.extra_images or None,
        seed=ctx.seed,
        batch_size=ctx.batch_size,
        device=ctx.device,
        progress=ctx.progress,
        stop_beyond_points=points,  # sequential: a candidate clearly over the budget stops early
    )


def spec_for(state: State, ctx: Context, artifact: Path, spec: ops.EvalSpec | None = None) -> ops.EvalSpec:
    """:func:`eval_spec` (or ``spec``, the run's, where the caller has it) for judging ``artifact`` or a model built
    from it: for a round distilled after the search (cross-fitted), only the half of the evaluation images its model
    (or its second student) was not distilled on."""
    base = spec or eval_spec(state, ctx)
    wanted = Path(artifact).resolve()
    for r in state.rounds:
        cross_fit = r.cross_fit
        if cross_fit is None:
            continue
        if r.metrics.artifact and Path(r.metrics.artifact).resolve() == wanted:
            return base.model_copy(update={"evaluation_half": cross_fit.judged_on_half})
        for student in cross_fit.students:  # the second student: judged on the other half
            if Path(student.artifact).resolve() == wanted:
                return base.model_copy(update={"evaluation_half": student.judged_on_half})
    return base


def _evaluate(state: State, ctx: Context, artifact: Path, desc: str, source: Path | None = None) -> Metrics:
    spec = spec_for(state, ctx, source or artifact)
    # the batch throughput is the deployment table's (its candidates'), not the rounds' or the summary's
    return ops.evaluate(artifact, paths(state).original, shape_of(state), spec, desc, throughput=False)


def evaluate_baseline(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Evaluate the original model (the dataset's labels were matched at acquisition).

    The entry also records ``data_parts``: how many rows each disjoint part of the data holds.
    """
    ctx = settings(runtime)
    metrics = _evaluate(state, ctx, paths(state).original, "baseline")
    matched = len(state.label_match.mapping) if state.label_match is not None else 0
    note = None
    if not unlabelled(state):
        classes = matched or need(state.model_info, "model_info").num_labels
        note = chance_note(metrics.accuracy, metrics.samples, classes, ctx.max_accuracy_drop)
    notes = [note] if note else []
    if metrics.accuracy is not None and metrics.samples:  # said at the start: the data may not resolve the budget
        if unlabelled(state):
            resolution: str | None = unlabelled_note(metrics.samples, budget_points(state, ctx))
        elif note and ctx.max_disagreement is None:  # the agreement budget holds too (common.disagreement_budget)
            resolution = at_chance_note(metrics.samples, ctx.max_accuracy_drop)
        else:
            resolution = resolution_note(metrics.samples, ctx.max_accuracy_drop)
        if resolution:
            logger.warning("%s", resolution)
            notes.append(resolution)
    baseline = BaselineEntry(
        **metrics.model_dump(), data_parts=ops.part_sizes(eval_spec(state, ctx)), at_chance=bool(note)
    )
    return {"baseline": baseline, "notes": notes}


def evaluate_model(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Evaluate the round just pruned and append it to ``rounds``."""
    ctx = settings(runtime)
    pending = need(state.pending_round, "pending_round")
    metrics = _evaluate(state, ctx, Path(pending.artifact), f"round {pending.round}")
    drop = accuracy_drop_points(baseline_accuracy(state), metrics.accuracy)
    record = RoundResult(
        round=pending.round,
        plan=pending.plan,
        source=pending.source,
        planner_state=pending.planner_state,
        prune_report=pending.prune_report,
        metrics=metrics,
        accuracy_drop_points=drop,
        within_budget=within_budget(drop, pruning_budget(state, ctx), metrics.paired, disagreement_budget(state, ctx)),
    )
    timed = with_deploy_latency(state, ctx, record) if ctx.objective == "latency" else [record]
    atomic_write_json(paths(state).round(record.round) / "round.json", timed[-1].model_dump())  # its evaluation log
    return {"rounds": timed, "pending_round": None}


#: With each new round (``--objective latency``), the earlier rounds timed again beside it: every one within the
#: budget (they compete to be kept) and this many of the fastest others (they compete to be distilled); the rest
#: keep their last timing. Timing them all made each round cost more than the one before: CIFAR ResNet-56's took
#: 35 s a round, 7 s of them timing five builds beside the sixth round's.
RETIMED_OVER_BUDGET = 3


def _timed_again(rounds: list[RoundResult]) -> list[RoundResult]:
    """Of the earlier rounds timed in the deployment's build, those timed again with a new one (see
    :data:`RETIMED_OVER_BUDGET`)."""
    over = sorted((r for r in rounds if not r.within_budget), key=lambda r: -(r.metrics.deploy_speedup or 0.0))
    again = {r.round for r in rounds if r.within_budget} | {r.round for r in over[:RETIMED_OVER_BUDGET]}
    return [r for r in rounds if r.round in again]


def with_deploy_latency(state: State, ctx: Context, record: RoundResult) -> list[RoundResult]:
    """``record`` with its batch-1 latency in the build the original deploys in (``--objective latency``), and the
    earlier rounds built there timed again with it: one interleaved timing with the original's own build, so that the
    ratios that rank the rounds come from the same moment (CIFAR Swin-tiny's depth round and kept round, timed
    minutes apart with another job on the machine, ran 1.086x the original each; together on an idle machine 1.13x
    and 1.03x). ``[record]`` as it was where the original's deployment is not known (no int8 profile), with only
    the backend where the build fails; the earlier rounds come before it, each with its round.json written again."""
    from tools.stages.ops import latency_in_build

    choice = state.original_deployment
    if choice is None or record.metrics.artifact is None:
        return [record]
    backend = choice.chosen
    reference = next((c.artifact for c in choice.candidates if c.backend == backend and not c.source), None)
    if not backend or not reference:
        return [record]
    timed_before = [
        r
        for r in state.rounds
        if r.round != record.round
        and r.metrics.artifact
        and r.metrics.deploy_backend == backend
        and r.metrics.deploy_speedup
    ]
    earlier = {str(r.round): Path(str(r.metrics.artifact)) for r in _timed_again(timed_before)}
    try:
        times = latency_in_build(
            Path(record.metrics.artifact),
            paths(state).original,
            backend,
            Path(reference),
            shape_of(state),
            eval_spec(state, ctx),
            int8_cpu=ctx.int8_cpu,
            repeats=ctx.latency_repeats,
            earlier=earlier,
        )
    except Exception as exc:  # a build that fails ranks the round last (selection.cost_of)
        logger.warning("round latency in %s not measured: %s", backend, exc)
        return [record.model_copy(update={"metrics": record.metrics.model_copy(update={"deploy_backend": backend})})]

    def timed(r: RoundResult, seconds: float) -> RoundResult:
        speedup = round(times["reference"] / seconds, 4) if seconds > 0 else None
        update = {"deploy_latency_s": seconds, "deploy_backend": backend, "deploy_speedup": speedup}
        return r.model_copy(update={"metrics": r.metrics.model_copy(update=update)})

    again = [timed(r, times[str(r.round)]) for r in state.rounds if str(r.round) in times]
    for r in again:
        atomic_write_json(paths(state).round(r.round) / "round.json", r.model_dump())
    return [*again, timed(record, times["model"])]


def evaluate_quantized(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Evaluate the quantized best model and the quantized original (once when they are the same)."""
    ctx = settings(runtime)
    baseline_acc = baseline_accuracy(state)
    update: dict[str, object] = {}
    done: dict[str, DeployedEntry] = {}
    for key, entry in (("quantized", state.quantized), ("quantized_original", state.quantized_original)):
        if entry is None or not entry.artifact:
            continue
        artifact = entry.artifact
        if artifact not in done:
            source = Path(entry.source) if entry.source else None
            metrics = _evaluate(state, ctx, Path(artifact), key.replace("_", " "), source)
            drop = drop_points(baseline_acc, metrics.accuracy, metrics.paired)
            done[artifact] = DeployedEntry.model_validate(
                {**entry.model_dump(), **metrics.model_dump(), "accuracy_drop_points": drop}
            )
        update[key] = done[artifact]
    return update


def measure_latencies(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Batch-1 latency of original, best pruned and deployed models, interleaved in one timing run.

    The same run times the original in the deployed runtime at FP32, so that the deployed model's speed-up
    over the original splits into runtime x precision x pruning (``speedup``, :class:`SpeedupFactors`).
    """
    ctx = settings(runtime)
    entries: dict[str, ModelEntry | DeployedBuild | RuntimeReference | None] = {
        "baseline": state.baseline,
        "pruned": state.pruned,
        "quantized": state.quantized,
        "quantized_original": state.quantized_original,
        "runtime_fp32_original": state.runtime_fp32_original,
    }
    artifacts = {key: Path(e.artifact) for key, e in entries.items() if e is not None and e.artifact}
    unique = {str(p): p for p in artifacts.values()}
    times = ops.compare_latency(  # a slow PyTorch FP32 model (224-260 px) takes part in fewer repetitions
        unique, shape_of(state), repeats=ctx.latency_repeats, seed=ctx.seed, device=ctx.device, max_seconds=4.0
    )
    update: dict[str, object] = {}
    for key, entry in entries.items():
        if isinstance(entry, ModelEntry) and key in artifacts:  # the FP32 reference is timed, not reported
            update[key] = entry.model_copy(
                update={
                    "latency_s": times[str(artifacts[key])],
                    "latency_measured": "interleaved",
                    "latency_device": ops.latency_device(artifacts[key], ctx.device),
                }
            )
    steps = ("baseline", "runtime_fp32_original", "quantized_original", "quantized")
    if all(key in artifacts for key in steps):
        update |= _speedup_split(state, ctx, {key: artifacts[key] for key in steps}, times)
    return update


def _speedup_split(
    state: State, ctx: Context, artifacts: dict[str, Path], times: dict[str, float]
) -> dict[str, object]:
    """The deployed model's speed-up split into runtime x precision x pruning from the interleaved ``times`` of the
    four models in ``artifacts`` (``speedup``), with a note where pruning made the deployed model slower."""
    from tools.deploy.speedup import SpeedupFactors

    by_time = {key: str(path.resolve()) for key, path in artifacts.items()}
    factors = SpeedupFactors.measure(
        (state.quantized.backend if state.quantized is not None else None) or FLOAT,
        {path: times[str(artifacts[key])] for key, path in by_time.items()},
        original=by_time["baseline"],
        runtime_fp32=by_time["runtime_fp32_original"],
        runtime_original=by_time["quantized_original"],
        deployed=by_time["quantized"],
    )
    update: dict[str, object] = {"speedup": factors}
    pruned_params = state.pruned.params if state.pruned is not None else None
    smaller = pruned_params is not None and pruned_params < (state.baseline.params if state.baseline else 0)
    # a "pruned" model whose every step was skipped has the original's parameters: only timing noise differs
    if factors.pruned and smaller and factors.pruning_factor < SLOWER_FACTOR:  # where the user sees it
        slower = _slower_when_alone(artifacts["quantized_original"], artifacts["quantized"], state, ctx)
        if slower is not None:
            update["notes"] = [_slower_note(factors.backend, slower, ctx)]
    return update


def _slower_note(backend: str, slower: tuple[float, float], ctx: Context) -> str:
    """The note that pruning made the deployed model slower in ``backend`` (``slower``: the unpruned and pruned
    latencies timed alone), with the channel rounding that fills the CPU's kernel blocks where the run's is finer."""
    from tools.deploy.base import PRECISION_BF16
    from tools.deploy.cpu import channel_block
    from tools.deploy.registry import runtime_and_precision

    _, precision = runtime_and_precision(backend)
    block = channel_block(precision == PRECISION_BF16)
    hint = f" (try --round-to {block} --head-round-to {block})" if block > ctx.round_to else ""
    unpruned_s, pruned_s = slower
    return (
        f"pruning made the deployed model slower in {backend} ({1e3 * unpruned_s:.2f} ms "
        f"unpruned, {1e3 * pruned_s:.2f} ms pruned, batch 1, the two timed again alone, interleaved): "
        f"the pruned widths may not fill this CPU's {precision} kernel blocks{hint}, or deploy "
        "RUN/models/quantized-original"
    )


def _slower_when_alone(unpruned: Path, pruned: Path, state: State, ctx: Context) -> tuple[float, float] | None:
    """(unpruned, pruned) latencies when the two deployed models, timed again alone with three times the repeats,
    still show the pruned one slower than :data:`SLOWER_FACTOR` allows; None when they do not. Sub-millisecond
    models move 15-20 % with what runs between two calls: a CIFAR ResNet-20 in OpenVINO bf16 timed 0.354 ms pruned
    and 0.351 ms unpruned among the deployment's candidates, 0.37 and 0.30 among the final table's five models."""
    from tools.stages.deployment import RETIMING_SECONDS

    times = ops.compare_latency(
        {"unpruned": unpruned, "pruned": pruned},
        shape_of(state),
        repeats=3 * ctx.latency_repeats,
        seed=ctx.seed,
        device=ctx.device,
        max_seconds=RETIMING_SECONDS,
    )
    if times["unpruned"] >= SLOWER_FACTOR * times["pruned"]:
        return None
    return times["unpruned"], times["pruned"]
