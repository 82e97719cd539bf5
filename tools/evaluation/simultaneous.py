"""The budget test for the best of several candidates judged on the same images: a step-down simultaneous test.

A candidate chosen as the fastest of several that pass the budget test favours those the evaluation images happened
to be kind to, so each must pass with more than one standard error. Bonferroni (:func:`tools.stats.selection_z`)
splits the test's level over the tries as if they were unrelated; the builds of one model in several runtimes and
precisions give nearly the same answers, so it asks far more than the level needs (33 builds of a Swin-tiny: 2.59
standard errors each). :func:`stepdown_z` asks what the tries need together (Romano and Wolf's step-down, 2005): the
critical value is the bootstrap quantile of the largest of the candidates' standardised errors, resampling the
images, so that the images' luck is shared as it is; the candidates that pass at it leave the family, and the rest
are judged again by the largest error among themselves, until no more pass. The value at each step is held between
one standard error (one try) and Holm's for the candidates left, so the test never asks more than Bonferroni did.

A candidate far over its budget (a collapsed round, a broken build) could pass only by an error of many standard
errors, yet its error counts in the largest as fully as a candidate's at the budget's edge. CIFAR ResNet-56's latency
run: 13 rounds, five of them 2.1-33.6 points down before distillation, and the step-down held the rest to 1.94
standard errors; its distilled 22.8 % round (+0.05 in the run, +0.28 unseen) passes under 1.92. So the test takes
Romano, Shaikh and Wolf's two steps (2014): first a simultaneous lower bound on every candidate's drop at a small share
of the level (:data:`SELECTION_SHARE`), which says by how many of its standard errors each is surely over its budget
(its *slack*, 0 for those that may be within it); then the step-down above at the rest of the level, each
candidate's error less its slack (that run: 1.86, and the 22.8 % round is kept). A candidate over its budget by its
slack can then pass only by an error of more than the critical value plus its slack, so the chance that any
candidate over its budget passes stays within the level (the first step's share covers its bound being wrong).

:func:`budget_zs` reads each candidate's per-image predictions beside its artifact (``tools.evaluation.paired``)
and falls back on Bonferroni for all when any is missing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tools.evaluation.paired import ImagePredictions
from tools.schemas import PairedAccuracy
from tools.stats import ONE_SE_LEVEL, paired_accuracy, selection_z
from tools.store.files import read_json

logger = logging.getLogger(__name__)

__all__ = ["RESAMPLES", "SELECTION_SHARE", "budget_zs", "cross_fitted", "per_image_drops", "stepdown_z"]

#: Paired bootstrap resamples of the evaluation images (seeded: the same answers give the same test).
RESAMPLES = 2000
#: The share of the test's level its first step spends on bounding each candidate's drop from below; the step-down
#: runs at the rest. Romano, Shaikh and Wolf suggest a tenth; on a few hundred images the quantiles move in steps,
#: and a tenth cost EfficientNet-Lite2's rounds (375 images, none surely over) 1.73 standard errors instead of 1.52,
#: where 3 % cost nothing. Replayed on five runs' rounds (CIFAR ResNet-20 and -56, the latter and ViT-tiny with the
#: latency objective, Lite2: a validation), 1 %, 3 % and 10 % keep the same rounds.
SELECTION_SHARE = 0.03


def per_image_drops(
    original: ImagePredictions, candidates: Sequence[ImagePredictions]
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(drops, judged)``, candidates x the original's images: 1 where the original is right and the candidate
    wrong, -1 the other way, 0 otherwise; ``judged`` marks the images each candidate was judged on (a student's half,
    the first images of one stopped early). None when a candidate was judged on an image the original was not."""
    indices = list(original.key.get("indices") or [])
    position = {int(i): k for k, i in enumerate(indices)}
    right = np.asarray(original.correct, dtype=np.float32)
    if len(right) != len(indices):
        return None
    drops = np.zeros((len(candidates), len(indices)), dtype=np.float32)
    judged = np.zeros_like(drops, dtype=bool)
    for row, candidate in enumerate(candidates):
        rows = [position.get(int(i), -1) for i in list(candidate.key.get("indices") or [])[: len(candidate.correct)]]
        if not rows or min(rows) < 0:
            return None
        judged[row, rows] = True
        drops[row, rows] = right[rows] - np.asarray(candidate.correct, dtype=np.float32)
    return drops, judged


def stepdown_z(
    drops: np.ndarray,
    judged: np.ndarray,
    passes: Callable[[int, float], bool],
    *,
    budgets: Sequence[float] | None = None,
    level: float = ONE_SE_LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[float]:
    """The standard errors each candidate's drop is held to (``passes(i, z)``: candidate ``i``'s budget test at
    ``z``): the critical value of the step at which it passed, or of the last step for those that did not. With
    ``budgets`` (each candidate's budget, in points of the drop ``drops`` measure), two steps (the module's
    docstring): each candidate's slack from a lower bound at ``SELECTION_SHARE`` of ``level``, then the step-down at
    the rest, each error less its candidate's slack; without, the step-down alone at ``level``."""
    count = judged.sum(axis=1).astype(np.float64)
    mean = drops.sum(axis=1) / np.maximum(count, 1.0)
    centred = np.where(judged, drops - mean[:, None], 0.0)
    se = np.sqrt((centred**2).sum(axis=1) / np.maximum(count - 1.0, 1.0) / np.maximum(count, 1.0))
    weights = _weights(drops.shape[1], resamples, seed)
    resampled = (weights @ drops.T) / np.maximum(weights @ judged.T.astype(np.float32), 1.0)
    spread = se > 0
    scale = np.where(spread, se, 1.0)[None, :]
    # a resample's error, in standard errors, in the direction that would let a candidate over the budget pass
    errors = np.where(spread[None, :], (mean[None, :] - resampled) / scale, -np.inf)
    slack = np.zeros(len(drops))
    if budgets is not None:
        # the other direction: how far a drop may lie below the one measured, for the first step's lower bounds
        under = np.where(spread[None, :], (resampled - mean[None, :]) / scale, -np.inf)
        bound_z = _quantile_of_largest(under, 1.0 - SELECTION_SHARE * level, default=0.0)
        over = (100.0 * mean - np.asarray(budgets, dtype=np.float64)) / (100.0 * scale[0])
        slack = np.where(spread, np.maximum(over - bound_z, 0.0), 0.0)
        level -= SELECTION_SHARE * level
    left = list(range(len(drops)))
    z_of: dict[int, float] = {}
    while left:
        quantile = _quantile_of_largest(errors[:, left] - slack[left][None, :], 1.0 - level, default=1.0)
        z = round(min(max(quantile, 1.0), selection_z(len(left))), 3)
        passed = [i for i in left if passes(i, z)]
        for i in passed or left:
            z_of[i] = z
        if not passed:
            break
        left = [i for i in left if i not in passed]
    return [z_of[i] for i in range(len(drops))]


def _quantile_of_largest(errors: np.ndarray, share: float, default: float) -> float:
    """The ``share`` quantile over the resamples of their largest error (rows: resamples); ``default`` when no
    candidate has any spread."""
    largest = errors.max(axis=1)
    return float(np.quantile(largest, share)) if np.isfinite(largest).any() else default


@functools.lru_cache(maxsize=2)
def _weights(images: int, resamples: int, seed: int) -> np.ndarray:
    """How often each image is drawn in each resample (resamples x images), the same for a run's every test."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(images, np.full(images, 1.0 / images), size=resamples).astype(np.float32)


def _read(files: Sequence[str | Path]) -> ImagePredictions | None:
    """The predictions in ``files`` as one (a distilled round's students, each on its half); None if any is
    missing or unreadable."""
    parts: list[ImagePredictions] = []
    for file in files:
        try:
            parts.append(ImagePredictions.model_validate(read_json(Path(file))))
        except (OSError, ValueError):
            return None
    if not parts:
        return None
    indices = [i for p in parts for i in list(p.key.get("indices") or [])[: len(p.correct)]]
    return ImagePredictions(
        key={"indices": indices},
        predictions=[a for p in parts for a in p.predictions],
        correct=[c for p in parts for c in p.correct],
    )


def cross_fitted(original: Path, halves: Sequence[str | Path]) -> PairedAccuracy | None:
    """One model recipe's result on every evaluation image, paired with the original's: ``halves`` holds the
    per-image predictions of its builds from a distilled round's students, each on the half of the images its
    student was not distilled on. None unless together they cover each of the original's images once (a build
    stopped early, a file missing)."""
    base, joined = _read([original]), _read(halves)
    if base is None or joined is None:
        return None
    indices = [int(i) for i in base.key.get("indices") or []]
    at = {int(i): k for k, i in enumerate(joined.key.get("indices") or [])}
    if len(indices) != len(base.correct) or len(at) != len(joined.correct) or sorted(at) != sorted(indices):
        return None
    rows = [at[i] for i in indices]
    return paired_accuracy(
        base.correct, [joined.correct[k] for k in rows], base.predictions, [joined.predictions[k] for k in rows]
    )


def budget_zs(
    original: Path | None,
    predictions: Sequence[Sequence[str | Path] | None],
    passes: Callable[[int, float], bool],
    *,
    budgets: Sequence[float] | None = None,
    simultaneous: bool = True,
) -> list[float]:
    """Each candidate's standard errors for the budget test as one of ``len(predictions)`` tries: :func:`stepdown_z`
    on the per-image predictions in each candidate's files (``predictions[i]``) paired with the original's at
    ``original``, with the first step where ``budgets`` (each candidate's, in points of drop) are given; Bonferroni
    (:func:`tools.stats.selection_z` for all) without ``simultaneous`` (a budget in changed answers, which this
    resampling does not cover) or when any file is missing or for other images."""
    bonferroni = [round(selection_z(len(predictions)), 3)] * len(predictions)
    if not simultaneous or original is None or len(predictions) < 2 or any(not p for p in predictions):
        return bonferroni
    base = _read([original])
    loaded = [_read(p or []) for p in predictions]
    drops = None
    if base is not None and all(p is not None for p in loaded):
        drops = per_image_drops(base, [p for p in loaded if p is not None])
    if drops is None:
        logger.info("budget test: per-image predictions missing or for other images: Bonferroni over the tries")
        return bonferroni
    return stepdown_z(*drops, passes, budgets=budgets)
