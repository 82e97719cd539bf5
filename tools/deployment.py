"""Deploy through the fastest runtime: build every candidate, evaluate and time them together, keep one.

:func:`deploy` applies each candidate backend (:mod:`tools.deploy.choice`) to the model at ``source_dir``
(the best pruned model, or the original), evaluates each on the run's evaluation images (paired with the
original), times all of them at batch 1 interleaved in one process with the original FP32 model, and
chooses with :func:`tools.deploy.choice.choose`. A candidate that cannot be built or run is kept in the
table with its one-line error; nothing else is lost.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from tools import ops
from tools.artifacts.io import load_compressed, load_module
from tools.deploy.accuracy import AccuracyControl
from tools.deploy.base import PRECISION_BF16, PRECISION_FP32, BackendNotApplicable
from tools.deploy.budget import mixed_to_build, split_budget
from tools.deploy.choice import (
    ALTERNATIVE_MARGIN,
    DeployCandidate,
    DeployChoice,
    candidate_backends,
    choose,
    eligible,
    faster_over_budget,
    is_mixed,
    luck_removed,
    never_slower,
    own_source,
    preferred,
    runoff,
    slower_than_the_original,
    unconfirmed_alternative,
)
from tools.deploy.config import QuantizationConfig
from tools.deploy.cpu import detect_cpu, int8_settings, resolve_target
from tools.deploy.registry import BACKENDS, FLOAT, ONE_COMMAND_BUILDS, runtime_and_precision
from tools.evaluation.paired import predictions_path
from tools.judging import Judging, judge_together, twin_sources
from tools.models.base import example_input
from tools.profiling.static import mac_shares
from tools.schemas import InputShape, Int8Sensitivity, PairedAccuracy, QuantizationRecommendation
from tools.stats import drop_points
from tools.store.files import boot_id, left_by_an_earlier_boot
from tools.text import first_line

logger = logging.getLogger(__name__)

__all__ = [
    "Judging",
    "accuracy_control",
    "answers_of_copy",
    "attempt_marker",
    "calibration_images",
    "candidate_backends",
    "deploy",
    "full_int8",
    "is_mixed",
    "split_budget",
]

#: The run's budget test of one candidate: (drop, paired result, z: standard errors for the tries) -> within.
BudgetTest = Callable[[float | None, PairedAccuracy | None, float], bool]
#: What mixed-precision candidates are judged on, or how to get it (called once, only when one is built).
ControlSource = AccuracyControl | Callable[[], AccuracyControl | None] | None


class _Judge:
    """The accuracy control of a deployment, made on first use (it preprocesses every evaluation image)."""

    def __init__(self, source: ControlSource) -> None:
        self._source, self._value, self.made = source, None, not callable(source)
        if isinstance(source, AccuracyControl):
            self._value = source

    def __call__(self) -> AccuracyControl | None:
        if not self.made:
            self.made = True
            self._value = self._source() if callable(self._source) else None
        return self._value


#: Synthetic inputs static int8 is calibrated on when the run has no data.
SYNTHETIC_SAMPLES = 32
#: A float runtime (ONNX Runtime or OpenVINO FP32) computes what the PyTorch model computes, up to rounding: when its
#: logits on the first FLOAT_CHECK_IMAGES evaluation images are within FLOAT_TOLERANCE of the model's (relative to
#: their largest magnitude), with the same top-1 answers, it takes the model's answers on every evaluation image
#: instead of running them all (a 224-px EfficientNet-B0: two runtimes of 375 images, about 20 s a deployment).
FLOAT_CHECK_IMAGES = 32
FLOAT_TOLERANCE = 1e-3
#: Seconds a candidate's timing takes at most over the run's repeats: a slower one (a 224-260 px model in PyTorch FP32)
#: takes part in fewer interleaved repetitions, at least three (``tools.evaluation.cost.compare_latencies``).
TIMING_SECONDS = 2.0
#: The same for the timings again of close candidates (runoff, alternatives, never slower, mixed or not), at three
#: times the repeats: the three 25-ms builds of EfficientNet-Lite2's original in a runoff took 28 s, 300 calls in all.
RETIMING_SECONDS = 4.0
#: Seconds of calls at least behind a round's latency in the build the original deploys in (``latency_in_build``):
#: the rounds of ``--objective latency`` differ by a few per cent (CIFAR ResNet-20's 2.9 %-MACs round timed 1.078x
#: under load, 0.985x in 400 repetitions idle). Under load it is when they are timed that misleads, not how long.
ROUND_TIMING_SECONDS = 1.0
#: Dynamic int8 of Linear layers is not built for a model whose Linear layers do less than this share of its MACs.
MIN_LINEAR_SHARE = 0.05


def calibration_images(original_dir: Path, shape: InputShape, spec: ops.EvalSpec) -> tuple[torch.Tensor, str]:
    """What static int8 is calibrated on, and a description: the run's calibration images, or, with no data
    (an untrained built-in), seeded synthetic N(0, 1) inputs, which give static int8's latency and memory but
    say nothing of its accuracy."""
    calibration = ops.calibration_batch(original_dir, shape, spec)
    if calibration is not None:
        return calibration.images, f"{calibration.images.shape[0]} calibration images"
    generator = torch.Generator().manual_seed(spec.seed)
    images = torch.randn((SYNTHETIC_SAMPLES, *shape.as_tuple()), generator=generator)
    return images, f"{SYNTHETIC_SAMPLES} synthetic N(0, 1) inputs (no dataset: static int8 accuracy is unknown)"


def accuracy_control(
    original_dir: Path,
    shape: InputShape,
    spec: ops.EvalSpec,
    budget_points: float,
    int8_ranking: Int8Sensitivity | None = None,
) -> AccuracyControl | None:
    """What the mixed-precision candidates are tuned on: the calibration images with their classes, the original's
    answers on them, and the accuracy budget (None without a labelled dataset, or for an untrained model). Not the
    evaluation images: the budget test then judges the tuned build on them, which a build tuned until it passed there
    would pass by construction. ``int8_ranking``: the original's per-block int8 damage, where the run measured it
    (:class:`~tools.deploy.accuracy.AccuracyControl`)."""
    from tools.evaluation.labels import LabelMatch

    evaluation = ops.calibration_batch(original_dir, shape, spec, part="calibration")
    unlabelled = bool((spec.label_match or {}).get("unlabelled"))
    if evaluation is None or spec.label_match is None or (evaluation.targets is None and not unlabelled):
        return None
    reference = ops.predictions_on(original_dir, original_dir, shape, spec, "calibration", desc="original")
    if reference is None or reference.samples == 0:
        return None
    # an unlabelled dataset's targets are the original's answers
    targets = torch.tensor(reference.predictions) if evaluation.targets is None else evaluation.targets
    keep = targets >= 0
    if int(keep.sum()) != reference.samples:
        return None
    return AccuracyControl(
        images=evaluation.images[keep],
        targets=[int(t) for t in targets[keep]],
        reference_pred=reference.predictions,
        reference_correct=reference.correct,
        max_drop_points=budget_points,
        same_class=dict(LabelMatch.model_validate(spec.label_match).same_class),
        int8_ranking=int8_ranking,
    )


def full_int8(recommendations: list[QuantizationRecommendation]) -> list[QuantizationRecommendation]:
    """The plan's recommendations without its float32 ones: every layer the plan quantizes at all is int8."""
    return [r for r in recommendations if r.dtype != "float32"]


def _measure(
    backend: str,
    source_dir: Path,
    artifact_dir: Path,
    *,
    original_dir: Path,
    recommendations: list[QuantizationRecommendation],
    shape: InputShape,
    judged: Judging,
    images: torch.Tensor,
    within_budget: BudgetTest,
    baseline_accuracy: float | None,
    int8_cpu: str = "auto",
    control: Callable[[], AccuracyControl | None] = lambda: None,
    prebuilt: Sequence[Path] = (),
    source: str | None = None,
) -> DeployCandidate:
    """Build ``backend`` from ``source_dir`` into ``artifact_dir`` (reused when complete) and evaluate it. A
    mixed-precision backend gets the plan's recommendations and ``control``; the others the full-int8 ones.

    A marker beside ``artifact_dir`` (:func:`attempt_marker`) exists while it is built and evaluated: a runtime that
    kills the process (OpenVINO 2026.4 segfaults compiling a GroupNorm of one channel per group) leaves it, and the
    resumed run leaves that candidate out, saying so, instead of dying at the same place again; one left by a process
    that the machine's restart killed (another boot id) is tried again."""
    runtime, precision = runtime_and_precision(backend, unknown=("?", "?"))
    candidate = DeployCandidate(backend=backend, runtime=runtime, precision=precision, source=source)
    spec, luck = judged.spec, judged.luck_points
    marker = attempt_marker(artifact_dir)
    if marker.exists() and left_by_an_earlier_boot(marker):
        logger.info("deploy candidate %s: the machine restarted while it was built: trying it again", backend)
        marker.unlink()
    if marker.exists():
        logger.warning(
            "deploy candidate %s left out: the process died in it before (delete %s to try it again)", backend, marker
        )
        candidate.error = (
            f"the process died while it was built or run in an earlier attempt (a crash inside {runtime}, or the "
            f"run was killed then): left out; delete {marker} to try it again"
        )
        return candidate
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(boot_id())
    try:
        artifact = source_dir
        if backend != FLOAT:
            artifact = artifact_dir
            mixed = BACKENDS[backend].mixed_of is not None
            config = QuantizationConfig(backend=backend, int8_cpu=int8_cpu)
            built = ops.quantize(
                source_dir,
                original_dir,
                recommendations if mixed else full_int8(recommendations),
                artifact,
                config,
                shape=shape,
                calibration=images,
                accuracy_control=control() if mixed else None,
                reuse=[Path(root) / backend for root in prebuilt],
            )
            candidate.float_layers = dict(built.get("float_layers") or {})
            if built.get("copied_from"):
                answers_of_copy(artifact, Path(built["copied_from"]), original_dir, shape, spec)
            elif precision == PRECISION_FP32:
                candidate.answers_of = _float_twin(artifact, source_dir, original_dir, shape, spec)
        metrics = ops.evaluate(artifact, original_dir, shape, spec, desc=f"deploy {candidate.key}")
        drop = drop_points(baseline_accuracy, metrics.accuracy, metrics.paired)
        return candidate.model_copy(
            update={
                "artifact": str(artifact),
                "accuracy": metrics.accuracy,
                "paired": metrics.paired,
                "accuracy_drop_points": drop,
                "within_budget": within_budget(drop, luck_removed(metrics.paired, luck), 1.0),
                "half_luck_points": luck if luck > 0 else None,
                "predictions": str(predictions_path(Path(artifact), spec.part_label("evaluation"))),
                "throughput_ips": metrics.throughput_ips,
                "memory_mb": metrics.memory_mb,
            }
        )
    except BackendNotApplicable as exc:  # not a failure: the row says why it was not built
        logger.info("deploy candidate %s not built: %s", backend, first_line(exc))
        candidate.skipped = first_line(exc)[:300]
        return candidate
    except Exception as exc:  # one runtime that cannot take this model must not cost the others
        logger.warning("deploy candidate %s failed: %s", backend, first_line(exc))
        candidate.error = first_line(exc)[:300]
        return candidate
    finally:
        marker.unlink(missing_ok=True)


def answers_of_copy(artifact: Path, built: Path, original_dir: Path, shape: InputShape, spec: ops.EvalSpec) -> None:
    """A candidate copied from a build of the same recipe (the original's, built by the int8 profile; the deployed
    model, copied from its candidate) answers as that build did: its predictions on the evaluation images are taken as
    the copy's instead of evaluated again (at 260 px, six seconds a build)."""
    from tools.evaluation.paired import adopt_predictions

    source = ops.predictions_on(built, original_dir, shape, spec, "evaluation", desc=f"deploy {built.name}")
    if source is not None and not source.stopped_early:
        label = spec.part_label("evaluation")
        adopt_predictions(artifact, label, spec.part("evaluation"), spec.model_dump(), source, f"copied from {built}")


def _float_twin(
    artifact: Path, source_dir: Path, original_dir: Path, shape: InputShape, spec: ops.EvalSpec
) -> str | None:
    """When the float-runtime ``artifact`` matches the PyTorch model at ``source_dir`` (see :data:`FLOAT_TOLERANCE`),
    that model's answers saved as its own and a line saying how closely it matched; else None (it is evaluated on
    every image like any other candidate)."""
    from tools.evaluation.paired import adopt_predictions
    from tools.models.base import logits_of
    from tools.run_data import first_evaluated_images

    try:
        images = first_evaluated_images(original_dir, shape, spec, FLOAT_CHECK_IMAGES)
        source = ops.predictions_on(source_dir, original_dir, shape, spec, "evaluation", desc="float model")
        if images is None or source is None or source.stopped_early:
            return None
        with torch.no_grad():
            want = logits_of(load_compressed(source_dir)(images)).float()
            got = logits_of(load_compressed(artifact)(images)).float()
    except Exception as exc:  # the check is a shortcut: the full evaluation follows, and says what is wrong
        logger.info("float runtime %s not checked against its model: %s", artifact, first_line(exc))
        return None
    scale = max(float(want.abs().max()), 1e-6)
    gap = float((want - got).abs().max()) if want.shape == got.shape else float("inf")
    if gap > FLOAT_TOLERANCE * scale or not torch.equal(want.argmax(-1), got.argmax(-1)):
        return None
    how = (
        f"logits within {gap:.1e} of the PyTorch model's (largest {scale:.3g}), the same top-1, on the first "
        f"{images.shape[0]} evaluation images: takes its answers on all {len(source.predictions):,}"
    )
    adopt_predictions(artifact, spec.part_label("evaluation"), spec.part("evaluation"), spec.model_dump(), source, how)
    return how


def attempt_marker(artifact_dir: Path) -> Path:
    """The file that exists while the candidate at ``artifact_dir`` is built and evaluated (see :func:`_measure`);
    it holds the machine's boot id."""
    return artifact_dir.parent / f".{artifact_dir.name}.attempt"


def _linear_only_pointless(backends: list[str], source_dir: Path, shape: InputShape) -> list[DeployCandidate]:
    """Rows for the backends that quantize only Linear layers (dynamic int8) of a model whose Linear layers do less
    than :data:`MIN_LINEAR_SHARE` of its MACs (a CNN's classifier): no faster than float, not built."""
    linear_only = [b for b in backends if b in BACKENDS and tuple(BACKENDS[b].layer_kinds) == (nn.Linear,)]
    if not linear_only:
        return []
    share = mac_shares(load_module(source_dir), example_input(shape)).get(nn.Linear, 1.0)
    if share >= MIN_LINEAR_SHARE:
        return []
    why = f"it quantizes only Linear layers, which do {100 * share:.2g} % of this model's MACs (no faster than float)"
    return [
        DeployCandidate(backend=b, runtime=BACKENDS[b].runtime, precision=BACKENDS[b].precision, skipped=why)
        for b in linear_only
    ]


def _off_target(backends: list[str], int8_cpu: str) -> list[DeployCandidate]:
    """Rows for the bf16 backends when the deployment is built for CPUs without VNNI (``--int8-cpu no-vnni`` on a
    CPU with it): none of those computes bf16 (AVX512-BF16 and AMX came after VNNI), so there a bf16 model runs in
    FP32, and this CPU's bf16 timing says nothing of the target. Not built."""
    if resolve_target(int8_cpu) != "no-vnni" or detect_cpu().kind == "no-vnni":
        return []
    why = "built for CPUs without VNNI (--int8-cpu no-vnni), which compute no bf16: it would run in FP32 there"
    return [
        DeployCandidate(backend=b, runtime=BACKENDS[b].runtime, precision=BACKENDS[b].precision, skipped=why)
        for b in backends
        if b in BACKENDS and BACKENDS[b].precision == PRECISION_BF16
    ]


def _time(
    candidates: list[DeployCandidate], original_dir: Path, shape: InputShape, repeats: int, seed: int
) -> float | None:
    """Time every candidate that ran, interleaved with the original FP32 model; the original's latency."""
    timed = {c.key: Path(c.artifact) for c in candidates if c.ran and c.artifact}
    times = ops.compare_latency(
        {"__original__": original_dir, **timed}, shape, repeats=repeats, seed=seed, max_seconds=TIMING_SECONDS
    )
    for candidate in candidates:
        candidate.latency_s = times.get(candidate.key, candidate.latency_s)
    return times.get("__original__")


def _mixed_for(
    backends: list[str],
    candidates: list[DeployCandidate],
    control: Callable[[], AccuracyControl | None],
    within_budget: BudgetTest,
    *,
    original_dir: Path,
    always: bool = False,
    source: str | None = None,
    rivals: Sequence[DeployCandidate] = (),
    time_alone: Callable[[dict[str, Path]], dict[str, float]] | None = None,
) -> tuple[list[str], list[DeployCandidate]]:
    """``mixed_to_build`` after judging the candidates and ``rivals`` (the original's one-command builds) as the final
    test will, each try counted: a full int8 passing alone, not as one of the tries, gets its mixed precision (Lite0's
    original's ORT static int8 under the AVX2 cap was refused so); none where that full int8, timed alone beside the
    fastest of ``rivals``, cannot outrun it (``slower_than_the_original``)."""
    judge_together([*candidates, *rivals], within_budget, original_dir)
    fulls = {BACKENDS[b].mixed_of for b in backends if b in BACKENDS}
    over = [c for c in candidates if c.source == source and c.backend in fulls and c.ran and not c.within_budget]
    slower = slower_than_the_original(over, rivals, original_dir, time_alone) if time_alone and not always else {}
    return mixed_to_build(backends, candidates, control, always=always, source=source, slower=slower)


def deploy(
    source_dir: Path,
    original_dir: Path,
    recommendations: list[QuantizationRecommendation],
    out_root: Path,
    shape: InputShape,
    spec: ops.EvalSpec,
    *,
    backends: list[str],
    within_budget: BudgetTest,
    baseline_accuracy: float | None,
    repeats: int = 20,
    forced: bool = False,
    alternatives: Sequence[Path] = (),
    prebuilt: Sequence[Path] = (),
    int8_cpu: str = "auto",
    control: ControlSource = None,
    judging: Mapping[Path, Judging] | None = None,
    allow_over_budget: bool = False,
) -> DeployChoice:
    """Build, evaluate and time every backend of ``backends`` on ``source_dir``; see the module doc.

    ``out_root / <backend>`` holds each candidate's artifact (reused when complete). ``within_budget`` is
    the run's accuracy budget test. With ``forced`` (``--deploy NAME``), that backend is deployed whatever
    the timing says, unless it failed or is over the budget (refused, with a note: ``allow_over_budget`` deploys it
    anyway). ``alternatives``: other models to deploy instead of ``source_dir``, in order
    of preference (a round with more accuracy headroom; the unpruned original): the chosen backend and those that
    ran faster but over the budget are built from each too (``out_root / alt-<i> / <backend>``), everything is
    timed again together, and the fastest within budget is chosen, one of another source only when at least
    :data:`ALTERNATIVE_MARGIN` faster than the best model's, the original's only when no pruned one is within budget
    (``DeployChoice.source`` says which). ``prebuilt``:
    directories of candidates built before (``<dir>/<backend>``), copied instead of built again when their recipe
    is the same (the original's deployment table).

    int8 is built for ``int8_cpu`` (:mod:`tools.deploy.cpu`). A mixed-precision backend (``*-mixed``) is built only
    when its full-int8 backend ran over the budget and faster than the original's builds, judged by ``control``
    (:func:`accuracy_control`, or a function that makes it, called only then); its row says why it was not otherwise.

    ``judging[model_dir]``: how a model's candidates are judged (:class:`Judging`; default ``spec``, no luck).
    """
    images, calibrated_on = calibration_images(original_dir, shape, spec)
    judge = _Judge(control)
    measure = functools.partial(
        _measure,
        original_dir=original_dir,
        recommendations=recommendations,
        shape=shape,
        images=images,
        within_budget=within_budget,
        baseline_accuracy=baseline_accuracy,
        int8_cpu=int8_cpu,
        control=judge,
        prebuilt=prebuilt,
    )
    full = [b for b in backends if b not in BACKENDS or BACKENDS[b].mixed_of is None]
    mixed_backends = [b for b in backends if b not in full]
    pointless = [] if forced else _linear_only_pointless(full, source_dir, shape) + _off_target(full, int8_cpu)
    left_out = {c.backend for c in pointless}
    judged_on = {Path(p).resolve(): j for p, j in (judging or {}).items()}

    def judged_by(model_dir: Path) -> Judging:
        return judged_on.get(Path(model_dir).resolve(), Judging(spec=spec))

    twins = twin_sources(source_dir, alternatives, judged_by)

    def retime(close: dict[str, Path]) -> dict[str, float]:
        return ops.compare_latency(close, shape, repeats=3 * repeats, seed=spec.seed, max_seconds=RETIMING_SECONDS)

    candidates = [measure(b, source_dir, out_root / b, judged=judged_by(source_dir)) for b in full if b not in left_out]
    candidates += pointless
    timed = bool(mixed_backends) and not forced  # whether full int8 beats float decides whether mixed is worth it
    one_command = [b for b in ONE_COMMAND_BUILDS if b in full and b not in left_out]
    at = next((i for i, a in enumerate(alternatives) if Path(a).resolve() == Path(original_dir).resolve()), None)
    rivals: list[DeployCandidate] = []  # the original's one-command builds: a mixed build must be able to outrun them
    if timed and at is not None:  # copies of the int8 profile's builds, so cheap; the loop below takes them as built
        original = functools.partial(measure, source_dir=original_dir, judged=judged_by(original_dir))
        rivals = [original(b, artifact_dir=out_root / f"alt-{at}" / b, source=str(original_dir)) for b in one_command]
    if timed:
        original_latency = _time([*candidates, *rivals], original_dir, shape, repeats, spec.seed)
    mixed, skipped = _mixed_for(
        mixed_backends,
        candidates,
        judge,
        within_budget,
        original_dir=original_dir,
        always=forced,
        rivals=rivals,
        time_alone=retime,
    )
    candidates += [measure(b, source_dir, out_root / b, judged=judged_by(source_dir)) for b in mixed] + skipped
    if mixed or not timed:  # timed again only when mixed candidates joined
        original_latency = _time(candidates, original_dir, shape, repeats, spec.seed)
    tries = judge_together(candidates, within_budget, original_dir, twins)
    chosen, why = choose(candidates, original_latency)
    pool = [c for c in candidates if c.source is None]  # the candidates the deployed one is taken from
    own: str | None = None  # the source counted as the best model's
    order: list[str | None] = [None]  # the sources in order of preference
    if alternatives and not forced:
        faster = faster_over_budget(candidates, chosen)
        retry = list(dict.fromkeys([*faster, *([chosen] if chosen != FLOAT else [])]))
        for i, other in enumerate(alternatives):
            # a round with more headroom is built only where the best model's faster builds were over the budget; the
            # original (copies of its prebuilt builds) in every one-command build too: the last timing holds them all
            is_the_original = i == at
            rebuilt = list(dict.fromkeys([*retry, *one_command])) if is_the_original else faster
            if not rebuilt:
                continue
            logger.info("deploy: building %s from %s too", ", ".join(rebuilt), other)
            build = functools.partial(measure, source_dir=other, source=str(other), judged=judged_by(other))
            done = {c.backend: c for c in rivals} if is_the_original else {}
            rows = [done.get(b) or build(b, artifact_dir=out_root / f"alt-{i}" / b) for b in rebuilt if not is_mixed(b)]
            mixed, skipped = _mixed_for(
                [b for b in rebuilt if is_mixed(b)],
                [*candidates, *rows],
                judge,
                within_budget,
                original_dir=original_dir,
                source=str(other),
                rivals=[] if is_the_original else rivals,
                time_alone=retime,
            )
            candidates += rows + [build(b, artifact_dir=out_root / f"alt-{i}" / b) for b in mixed] + skipped
        original_latency = _time(candidates, original_dir, shape, repeats, spec.seed)
        tries = judge_together(candidates, within_budget, original_dir, twins)
        sources = [None, *(str(p) for p in alternatives)]
        own = own_source(candidates, sources)
        order = [own, *(s for s in sources if s != own)]  # the best model's, then the alternatives in order
        pool = eligible(candidates, original_dir, own)
        chosen, why = choose(pool, original_latency)
        doubt = unconfirmed_alternative(pool, chosen, retime, own)
        if doubt:  # the margin was timing noise: the best model deploys
            pool = [c for c in candidates if c.source == own]
            chosen, why = choose(pool, original_latency)
            why = f"{why}; {doubt}"
    picked: DeployCandidate | None = None  # the runoff's winner, when there was one
    if not forced:
        chosen, why, picked = runoff(
            pool, chosen, why, retime, other_source_margin=ALTERNATIVE_MARGIN, preference=order
        )
    refused: str | None = None
    if forced and backends[-1] != chosen:
        wanted = next(c for c in candidates if c.backend == backends[-1])
        if wanted.ran and (wanted.within_budget or allow_over_budget):
            over = "" if wanted.within_budget else ", over the accuracy budget (--allow-over-budget)"
            chosen, why = wanted.backend, f"--deploy {wanted.backend} forces it{over} ({why})"
        elif wanted.ran:  # over the budget: refused, and the fastest within it deploys instead
            refused = (
                f"--deploy {wanted.backend} refused: it is over the accuracy budget (drop "
                f"{wanted.accuracy_drop_points or 0.0:.2f} points, tested with {tries} tries counted); {chosen} "
                "deploys instead; add --allow-over-budget to deploy it anyway"
            )
            why = f"{refused}; {why}"
        else:  # say why the backend asked for is not the one deployed
            reason = f"could not run: {wanted.error}" if wanted.error else f"was not built: {wanted.skipped}"
            why = f"--deploy {wanted.backend} {reason}; {why}"
    usable = [c for c in pool if c.backend == chosen and c.ran and c.within_budget and c.latency_s]
    source: str | None = None
    if picked is not None and picked.backend == chosen:
        source = picked.source
    elif usable and not forced:
        source = preferred(usable, {c.key: c.latency_s or 0.0 for c in usable}, order, ALTERNATIVE_MARGIN).source
    if not forced:
        rival, slower = never_slower(candidates, chosen, source, original_dir, retime)
        if rival is not None:
            chosen, source, why = rival.backend, rival.source, f"{slower}; {why}"
    logger.info("deploy: %s%s (%s)", chosen, f" from {source}" if source else "", why)
    return DeployChoice(
        chosen=chosen,
        why=why,
        source=source,
        original_latency_s=original_latency,
        candidates=candidates,
        calibration=calibrated_on,
        int8=int8_settings(int8_cpu),
        tries=tries,
        refused=refused,
        budget_z=max((c.budget_z for c in candidates if c.budget_z is not None), default=None),
        accuracy_control=(
            f"tuned on {len(judged.images)} calibration images (the original's answers, a "
            f"{judged.max_drop_points:g}-point budget with one standard error), judged on the evaluation images"
            if judge.made and (judged := judge()) is not None
            else None
        ),
    )


def latency_in_build(
    source_dir: Path,
    original_dir: Path,
    backend: str,
    reference: Path,
    shape: InputShape,
    spec: ops.EvalSpec,
    *,
    int8_cpu: str = "auto",
    repeats: int = 20,
    earlier: Mapping[str, Path] | None = None,
) -> dict[str, float]:
    """Batch-1 seconds of ``source_dir`` built in ``backend`` as ``<dir>-<backend>`` (int8 as the deployment
    calibrates; a mixed backend's full int8), ``"model"``; of ``reference``, the original's build; of ``earlier``
    source dirs built so before, by name: one interleaved timing, ``--objective latency``'s measure of the rounds."""
    name = BACKENDS[backend].mixed_of or backend if backend in BACKENDS else backend

    def build_of(source: Path) -> Path:
        return source if name == FLOAT else source.with_name(f"{source.name}-{backend}")

    if name != FLOAT:
        images, _ = calibration_images(original_dir, shape, spec)
        config = QuantizationConfig(backend=name, int8_cpu=int8_cpu)
        recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="every layer, for its latency")]
        ops.quantize(source_dir, original_dir, recs, build_of(source_dir), config, shape=shape, calibration=images)
    models = {key: build_of(source) for key, source in (earlier or {}).items() if build_of(source).exists()}
    return ops.compare_latency(
        {**models, "model": build_of(source_dir), "reference": reference},
        shape,
        repeats=repeats,
        seed=spec.seed,
        min_seconds=ROUND_TIMING_SECONDS,
    )
