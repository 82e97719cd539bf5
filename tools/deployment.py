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
from collections.abc import Callable
from pathlib import Path

import torch

from tools import ops
from tools.deploy.base import BackendNotApplicable
from tools.deploy.choice import DeployCandidate, DeployChoice, available_backends, choose
from tools.deploy.config import QuantizationConfig
from tools.deploy.registry import AUTO, BACKENDS, FLOAT, available, runtime_and_precision
from tools.schemas import InputShape, PairedAccuracy, QuantizationRecommendation
from tools.text import first_line

logger = logging.getLogger(__name__)

__all__ = ["calibration_images", "candidate_backends", "deploy"]

BudgetTest = Callable[[float | None, PairedAccuracy | None], bool]

#: Synthetic inputs static int8 is calibrated on when the run has no data.
SYNTHETIC_SAMPLES = 32


def candidate_backends(choice: str) -> list[str]:
    """The backends ``--deploy choice`` measures: all available for ``auto``, else ``torch`` and that one."""
    if choice != AUTO:
        return [FLOAT] if choice == FLOAT else [FLOAT, choice]
    return available_backends(list(BACKENDS), available)


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


def _drop(baseline: float | None, accuracy: float | None) -> float | None:
    return None if baseline is None or accuracy is None else round(100.0 * (baseline - accuracy), 4)


def _measure(
    backend: str,
    source_dir: Path,
    artifact_dir: Path,
    *,
    original_dir: Path,
    recommendations: list[QuantizationRecommendation],
    shape: InputShape,
    spec: ops.EvalSpec,
    images: torch.Tensor,
    within_budget: BudgetTest,
    baseline_accuracy: float | None,
    source: str | None = None,
) -> DeployCandidate:
    """Build ``backend`` from ``source_dir`` into ``artifact_dir`` (reused when complete) and evaluate it."""
    runtime, precision = runtime_and_precision(backend, unknown=("?", "?"))
    candidate = DeployCandidate(backend=backend, runtime=runtime, precision=precision, source=source)
    try:
        artifact = source_dir
        if backend != FLOAT:
            artifact = artifact_dir
            config = QuantizationConfig(backend=backend)
            ops.quantize(source_dir, original_dir, recommendations, artifact, config, shape=shape, calibration=images)
        metrics = ops.evaluate(artifact, original_dir, shape, spec, desc=f"deploy {candidate.key}")
        drop = _drop(baseline_accuracy, metrics.accuracy)
        return candidate.model_copy(
            update={
                "artifact": str(artifact),
                "accuracy": metrics.accuracy,
                "paired": metrics.paired,
                "accuracy_drop_points": drop,
                "within_budget": within_budget(drop, metrics.paired),
                "throughput_ips": metrics.throughput_ips,
                "memory_mb": metrics.memory_mb,
            }
        )
    except Exception as exc:  # one runtime that cannot take this model must not cost the others
        level = logging.INFO if isinstance(exc, BackendNotApplicable) else logging.WARNING
        logger.log(level, "deploy candidate %s failed: %s", backend, first_line(exc))
        candidate.error = first_line(exc)[:300]
        return candidate


def _time(
    candidates: list[DeployCandidate], original_dir: Path, shape: InputShape, repeats: int, seed: int
) -> float | None:
    """Time every candidate that ran, interleaved with the original FP32 model; the original's latency."""
    timed = {c.key: Path(c.artifact) for c in candidates if c.error is None and c.artifact}
    times = ops.compare_latency({"__original__": original_dir, **timed}, shape, repeats=repeats, seed=seed)
    for candidate in candidates:
        candidate.latency_s = times.get(candidate.key, candidate.latency_s)
    return times.get("__original__")


def _faster_over_budget(candidates: list[DeployCandidate], chosen: str) -> list[str]:
    """Backends that ran faster than the chosen candidate (all, when none is within budget) but were over the
    accuracy budget."""
    usable = [c.latency_s for c in candidates if c.backend == chosen and c.within_budget and c.latency_s]
    limit = min(usable, default=None)
    return [
        c.backend
        for c in candidates
        if c.error is None and not c.within_budget and c.latency_s and (limit is None or c.latency_s < limit)
    ]


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
    headroom_source: Path | None = None,
) -> DeployChoice:
    """Build, evaluate and time every backend of ``backends`` on ``source_dir``; see the module doc.

    ``out_root / <backend>`` holds each candidate's artifact (reused when complete). ``within_budget`` is
    the run's accuracy budget test. With ``forced`` (``--deploy NAME``), that backend is deployed whatever
    the timing says, unless it failed. ``headroom_source``: a model with more accuracy headroom (another
    round within budget); when candidates faster than the chosen one were over the budget, those backends are
    built from it too (``out_root / headroom / <backend>``), everything is timed again together, and the
    fastest within budget of either source is chosen (``DeployChoice.source`` says which).
    """
    images, calibrated_on = calibration_images(original_dir, shape, spec)
    measure = functools.partial(
        _measure,
        original_dir=original_dir,
        recommendations=recommendations,
        shape=shape,
        spec=spec,
        images=images,
        within_budget=within_budget,
        baseline_accuracy=baseline_accuracy,
    )
    candidates = [measure(b, source_dir, out_root / b) for b in backends]
    original_latency = _time(candidates, original_dir, shape, repeats, spec.seed)
    chosen, why = choose(candidates, original_latency)
    retry = _faster_over_budget(candidates, chosen) if headroom_source is not None and not forced else []
    if headroom_source is not None and retry:
        logger.info("deploy: %s over budget; building them from %s", ", ".join(retry), headroom_source)
        headroom = str(headroom_source)
        candidates += [measure(b, headroom_source, out_root / "headroom" / b, source=headroom) for b in retry]
        original_latency = _time(candidates, original_dir, shape, repeats, spec.seed)
        chosen, why = choose(candidates, original_latency)
    if forced and backends[-1] != chosen:
        wanted = next(c for c in candidates if c.backend == backends[-1])
        if wanted.error is None:
            chosen, why = wanted.backend, f"--deploy {wanted.backend} forces it ({why})"
    usable = [c for c in candidates if c.backend == chosen and c.error is None and c.within_budget and c.latency_s]
    source = min(usable, key=lambda c: c.latency_s or 0.0).source if usable and not forced else None
    logger.info("deploy: %s%s (%s)", chosen, f" from {source}" if source else "", why)
    return DeployChoice(
        chosen=chosen,
        why=why,
        source=source,
        original_latency_s=original_latency,
        candidates=candidates,
        calibration=calibrated_on,
    )
