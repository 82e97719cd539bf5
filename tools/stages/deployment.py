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
from dataclasses import dataclass
from pathlib import Path

import torch

from tools.artifacts.io import load_compressed
from tools.clock import counts_as
from tools.deploy.accuracy import AccuracyControl
from tools.deploy.base import PRECISION_FP32, BackendNotApplicable
from tools.deploy.budget import mixed_to_build, split_budget
from tools.deploy.choice import (
    DeployCandidate,
    DeployChoice,
    Ships,
    candidate_backends,
    choose,
    faster_over_budget,
    is_mixed,
    luck_removed,
    slower_than_the_original,
)
from tools.deploy.config import QuantizationConfig
from tools.deploy.cpu import int8_settings
from tools.deploy.decide import Decision, DecisionRules, NeedTimes, TimeAlone, decide
from tools.deploy.registry import BACKENDS, FLOAT, ONE_COMMAND_BUILDS, runtime_and_precision
from tools.evaluation.paired import predictions_path
from tools.schemas import InputShape, Int8Sensitivity, PairedAccuracy, QuantizationRecommendation
from tools.stages import not_built, ops
from tools.stages.judging import Judging, judge_together, twin_sources
from tools.stages.ops import calibration_images
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
    """Build ``backend`` from ``source_dir`` into ``artifact_dir`` (reused when complete) and evaluate it (mixed
    precision gets the plan's recommendations and ``control``, the others the full-int8 ones). A marker beside
    ``artifact_dir`` (:func:`attempt_marker`) exists meanwhile: a runtime that kills the process (OpenVINO 2026.4 on a
    GroupNorm of one channel per group) leaves it, and the resumed run leaves that candidate out
    (:func:`_died_in_before`)."""
    runtime, precision = runtime_and_precision(backend, unknown=("?", "?"))
    candidate = DeployCandidate(backend=backend, runtime=runtime, precision=precision, source=source)
    spec, luck = judged.spec, judged.luck_points
    marker = attempt_marker(artifact_dir)
    if _died_in_before(candidate, marker):
        return candidate
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(boot_id())
    try:
        artifact = source_dir
        if backend != FLOAT:
            artifact = artifact_dir
            build = _Recipe(recommendations, images, int8_cpu, control, prebuilt)
            _build_artifact(candidate, source_dir, artifact, original_dir, shape, spec, build)
        metrics = ops.evaluate(artifact, original_dir, shape, spec, desc=f"deploy {candidate.key}")
        drop = drop_points(baseline_accuracy, metrics.accuracy, metrics.paired)
        measured = {key: getattr(metrics, key) for key in ("accuracy", "paired", "throughput_ips", "memory_mb")}
        return candidate.model_copy(
            update={
                **measured,
                "artifact": str(artifact),
                "accuracy_drop_points": drop,
                "within_budget": within_budget(drop, luck_removed(metrics.paired, luck), 1.0),
                "half_luck_points": luck if luck > 0 else None,
                "predictions": str(predictions_path(Path(artifact), spec.part_label("evaluation"))),
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


def _died_in_before(candidate: DeployCandidate, marker: Path) -> bool:
    """Whether an earlier attempt's process died building or running ``candidate`` (its ``marker`` is left; one left
    by a process the machine's restart killed is removed and tried again): then its row says so (``error``)."""
    if marker.exists() and left_by_an_earlier_boot(marker):
        logger.info("deploy candidate %s: the machine restarted while it was built: trying it again", candidate.backend)
        marker.unlink()
    if not marker.exists():
        return False
    logger.warning(
        "deploy candidate %s left out: the process died in it before (delete %s to retry)", candidate.backend, marker
    )
    candidate.error = (
        f"the process died while it was built or run in an earlier attempt (a crash inside {candidate.runtime}, or "
        f"the run was killed then): left out; delete {marker} to try it again"
    )
    return True


@dataclass(frozen=True)
class _Recipe:
    """How a deployment builds its candidates: the plan's recommendations, the calibration images, the CPU kind int8
    is built for, the accuracy control of mixed precision, and the builds made before (copied where the same)."""

    recommendations: list[QuantizationRecommendation]
    images: torch.Tensor
    int8_cpu: str
    control: Callable[[], AccuracyControl | None]
    prebuilt: Sequence[Path]


@counts_as("build")
def _build_artifact(
    candidate: DeployCandidate,
    source_dir: Path,
    artifact: Path,
    original_dir: Path,
    shape: InputShape,
    spec: ops.EvalSpec,
    recipe: _Recipe,
) -> None:
    """Build ``candidate``'s backend from ``source_dir`` into ``artifact``; a copy of a build of the same recipe, or a
    float runtime whose outputs match its model's, takes that one's answers (``candidate.answers_of``)."""
    backend = candidate.backend
    mixed = BACKENDS[backend].mixed_of is not None
    built = ops.quantize(
        source_dir,
        original_dir,
        recipe.recommendations if mixed else full_int8(recipe.recommendations),
        artifact,
        QuantizationConfig(backend=backend, int8_cpu=recipe.int8_cpu),
        shape=shape,
        calibration=recipe.images,
        accuracy_control=recipe.control() if mixed else None,
        reuse=[Path(root) / backend for root in recipe.prebuilt],
    )
    candidate.float_layers = dict(built.get("float_layers") or {})
    if built.get("copied_from"):
        answers_of_copy(artifact, Path(built["copied_from"]), original_dir, shape, spec)
    elif candidate.precision == PRECISION_FP32:
        candidate.answers_of = _float_twin(artifact, source_dir, original_dir, shape, spec)


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
    from tools.stages.run_data import first_evaluated_images

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


@counts_as("time")
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


@dataclass
class _Deployment:
    """What one deployment builds with and judges by: the models, the recipe, the budget test, and how each model's
    candidates are judged and timed again alone."""

    source_dir: Path
    original_dir: Path
    out_root: Path
    shape: InputShape
    spec: ops.EvalSpec
    measure: Callable[..., DeployCandidate]
    judge: _Judge
    within_budget: BudgetTest
    judged_by: Callable[[Path], Judging]
    repeats: int
    int8_cpu: str
    originals: dict[str, str]

    def retime(self, close: dict[str, Path]) -> dict[str, float]:
        """``close`` timed again alone, interleaved, with three times the repeats."""
        return ops.compare_latency(
            close, self.shape, repeats=3 * self.repeats, seed=self.spec.seed, max_seconds=RETIMING_SECONDS
        )

    def time(self, candidates: list[DeployCandidate]) -> float | None:
        return _time(candidates, self.original_dir, self.shape, self.repeats, self.spec.seed)

    def build(self, backend: str, source_dir: Path, artifact_dir: Path, source: str | None = None) -> DeployCandidate:
        judged = self.judged_by(source_dir)
        return self.measure(backend, source_dir, artifact_dir, judged=judged, **({"source": source} if source else {}))

    def build_either(self, backend: str, of_the_original: bool, alt: Path) -> DeployCandidate:
        """``backend`` built from the model, or from the original into ``alt`` (a copy of its earlier build)."""
        if of_the_original:
            return self.build(backend, self.original_dir, alt / backend, str(self.original_dir))
        return self.build(backend, self.source_dir, self.out_root / backend)


def _own_candidates(
    d: _Deployment, backends: list[str], forced: bool, at: int | None
) -> tuple[list[DeployCandidate], list[DeployCandidate], float | None, list[str]]:
    """The model's candidates in every backend (mixed precision where its full int8 is over the budget and can
    outrun the original's builds), the original's one-command builds that mixed precision must outrun (``at``: the
    original's index among the alternatives), the original FP32 model's latency where they were timed, and the
    one-command builds worth making here."""
    full = [b for b in backends if b not in BACKENDS or BACKENDS[b].mixed_of is None]
    pointless = [] if forced else not_built.linear_only_pointless(full, d.source_dir, d.shape)
    pointless += [] if forced else not_built.off_target(full, d.int8_cpu)
    left_out = {c.backend for c in pointless}
    one_command = [b for b in ONE_COMMAND_BUILDS if b in full and b not in left_out]
    alt = d.out_root / f"alt-{at}"
    own: dict[str, DeployCandidate] = {}
    rivals: list[DeployCandidate] = []
    if not forced and at is not None:  # no int8 build in a runtime where the model's float one cannot outrun
        build = functools.partial(d.build_either, alt=alt)
        own, rivals, cannot_win = not_built.cannot_outrun_in_float(full, left_out, d.originals, build, d.retime)
        pointless += cannot_win
        left_out |= {c.backend for c in cannot_win}
    candidates = [own.get(b) or d.build_either(b, False, alt) for b in full if b not in left_out]
    candidates += pointless
    mixed_backends = [b for b in backends if b not in full]
    timed = bool(mixed_backends) and not forced  # whether full int8 beats float decides whether mixed is worth it
    if timed and at is not None:  # copies of the int8 profile's builds of the original, so cheap
        done = {c.backend: c for c in rivals}
        rivals = [done.get(b) or d.build_either(b, True, alt) for b in one_command]
    latency = d.time([*candidates, *rivals]) if timed else None
    mixed, skipped = _mixed_for(
        mixed_backends,
        candidates,
        d.judge,
        d.within_budget,
        original_dir=d.original_dir,
        always=forced,
        rivals=rivals,
        time_alone=d.retime,
    )
    candidates += [d.build(b, d.source_dir, d.out_root / b) for b in mixed] + skipped
    if mixed or not timed:  # timed again only when mixed candidates joined
        latency = d.time(candidates)
    return candidates, rivals, latency, one_command


def _alternatives_built(
    d: _Deployment,
    candidates: list[DeployCandidate],
    rivals: list[DeployCandidate],
    alternatives: Sequence[Path],
    one_command: list[str],
    latency: float | None,
) -> list[DeployCandidate]:
    """The other models' builds worth making: where the model's faster builds were over the budget, those backends
    from each alternative; from the original (copies of its prebuilt builds), every one-command build too, and the
    model's fastest within budget, against which the others are timed."""
    lead, _ = choose(candidates, latency)  # what the others must beat (the choice is decide's)
    faster = faster_over_budget(candidates, lead)
    retry = list(dict.fromkeys([*faster, *([lead] if lead != FLOAT else [])]))
    built: list[DeployCandidate] = []
    for i, other in enumerate(alternatives):
        is_the_original = Path(other).resolve() == Path(d.original_dir).resolve()
        rebuilt = list(dict.fromkeys([*retry, *one_command])) if is_the_original else faster
        if not rebuilt:
            continue
        logger.info("deploy: building %s from %s too", ", ".join(rebuilt), other)
        done = {c.backend: c for c in rivals} if is_the_original else {}
        here = d.out_root / f"alt-{i}"
        rows = [done.get(b) or d.build(b, other, here / b, str(other)) for b in rebuilt if not is_mixed(b)]
        mixed, skipped = _mixed_for(
            [b for b in rebuilt if is_mixed(b)],
            [*candidates, *built, *rows],
            d.judge,
            d.within_budget,
            original_dir=d.original_dir,
            source=str(other),
            rivals=[] if is_the_original else rivals,
            time_alone=d.retime,
        )
        built += rows + [d.build(b, other, here / b, str(other)) for b in mixed] + skipped
    return built


#: How many groups of candidates a decision may ask to time again alone (runoff, alternative, floor, forced).
MAX_TIMINGS = 6


def _decided(candidates: list[DeployCandidate], rules: DecisionRules, retime: TimeAlone) -> Decision:
    """:func:`decide`, with every group of artifacts it asks for timed together alone first."""
    alone: dict[frozenset[str], dict[str, float]] = {}
    for _ in range(MAX_TIMINGS):
        try:
            return decide(candidates, rules, alone)
        except NeedTimes as need:
            times = retime(need.models)
            alone[frozenset(str(p) for p in need.models.values())] = {
                str(path): times[name] for name, path in need.models.items()
            }
    raise RuntimeError(f"the deployment's decision asked for more than {MAX_TIMINGS} timings")


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
    ships: Mapping[str, Ships] | None = None,
) -> DeployChoice:
    """Build, judge and time every backend of ``backends`` on ``source_dir`` (and, unless ``forced``, on the
    ``alternatives`` where they can win: a round with more headroom, the original), then :func:`decide` what ships.

    ``out_root / <backend>`` holds each candidate (``alt-<i>/<backend>`` an alternative's; reused when complete).
    ``within_budget``: the run's budget test. ``forced`` (``--deploy NAME``, the last of ``backends``): that backend
    deploys unless it failed or is over the budget (``allow_over_budget`` deploys it anyway). ``prebuilt``: builds
    of the original made before, copied where their recipe is the same. A mixed-precision backend is built only where
    its full int8 ran over the budget and can outrun the original's builds, judged by ``control``. ``judging``: how
    each model's candidates are judged (default ``spec``, no luck). ``ships``: the model each source is."""
    images, calibrated_on = calibration_images(original_dir, shape, spec)
    judge = _Judge(control)
    measure = functools.partial(
        _measure, original_dir=original_dir, shape=shape, within_budget=within_budget,
        baseline_accuracy=baseline_accuracy, recommendations=recommendations, images=images, int8_cpu=int8_cpu,
        control=judge, prebuilt=prebuilt,
    )  # fmt: skip
    judged_on = {Path(p).resolve(): j for p, j in (judging or {}).items()}
    d = _Deployment(
        source_dir, original_dir, out_root, shape, spec, measure, judge, within_budget,
        lambda model: judged_on.get(Path(model).resolve(), Judging(spec=spec)), repeats, int8_cpu,
        _original_builds(prebuilt),
    )  # fmt: skip
    others = [] if forced else list(alternatives)
    at = next((i for i, a in enumerate(others) if Path(a).resolve() == Path(original_dir).resolve()), None)
    candidates, rivals, latency, one_command = _own_candidates(d, backends, forced, at)
    twins = twin_sources(source_dir, alternatives, d.judged_by)
    tries = judge_together(candidates, within_budget, original_dir, twins)
    if others:
        candidates += _alternatives_built(d, candidates, rivals, others, one_command, latency)
        latency = d.time(candidates)
        tries = judge_together(candidates, within_budget, original_dir, twins)
    rules = DecisionRules(
        original_dir=str(original_dir), original_latency_s=latency, alternatives=[str(a) for a in others],
        forced=backends[-1] if forced else None, allow_over_budget=allow_over_budget,
        original_builds=_original_builds(prebuilt), ships=dict(ships or {}),
    )  # fmt: skip
    decision = _decided(candidates, rules, d.retime)
    return _choice(decision, latency, calibrated_on, int8_cpu, tries, judge)


def _original_builds(prebuilt: Sequence[Path]) -> dict[str, str]:
    """The original's one-command builds made before (``<dir>/<backend>``), backend -> artifact."""
    return {b: str(Path(root) / b) for root in prebuilt for b in ONE_COMMAND_BUILDS if (Path(root) / b).is_dir()}


def _choice(
    decision: Decision, latency: float | None, calibrated_on: str, int8_cpu: str, tries: int, judge: _Judge
) -> DeployChoice:
    """The typed choice the run keeps: the decision, the candidates and how they were judged."""
    built_from = f" from {decision.source}" if decision.source else ""
    logger.info("deploy: %s%s (%s)", decision.chosen, built_from, decision.why)
    control = judge() if judge.made else None
    shipped = [c for c in decision.candidates if c.backend == decision.chosen and c.source == decision.source]
    return DeployChoice(
        **decision.model_dump(),  # what ships, why, the steps, the candidates as the decision left them
        original_latency_s=latency,
        calibration=calibrated_on,
        int8=int8_settings(int8_cpu),
        tries=tries,
        budget_z=next((c.budget_z for c in shipped), None),
        accuracy_control=(
            f"tuned on {len(control.images)} calibration images (the original's answers, a "
            f"{control.max_drop_points:g}-point budget with one standard error), judged on the choose images"
            if control is not None
            else None
        ),
    )
