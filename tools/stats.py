"""The paired statistics of the accuracy budget: a candidate against the original on the same images.

Two accuracies measured on the same images differ by the mean of the per-image differences
``d_i = c_cand_i - c_ref_i`` (each +1, 0 or -1, where ``c`` is 1 for a correct top-1 prediction). Its standard
error comes from the images on which the two models *disagree*, so it is far smaller than the error of either
accuracy alone. :func:`paired_accuracy` gives the difference with its 95 % interval; :func:`within_budget` is the
budget test every stage uses (the pruning rounds, the deployment candidates, accuracy-controlled int8).
Pure Python: no torch, no I/O, so every layer of the tools can use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from pydantic import BaseModel

from tools.schemas import PairedAccuracy

__all__ = [
    "ASSUMED_CHANGE_RATE",
    "CHOOSE_Z",
    "SEQUENTIAL_Z",
    "Z95",
    "agreement_images_needed",
    "agreement_resolution",
    "at_chance_note",
    "budget_drop_points",
    "clearly_over_budget",
    "disagreement_bound_pct",
    "drop_points",
    "images_needed",
    "is_budget_note",
    "paired_accuracy",
    "resolution_note",
    "resolution_points",
    "selection_z",
    "sequential_looks",
    "standard_error_points",
    "unlabelled_note",
    "within_budget",
]

#: The two-sided 95 % quantile of the normal distribution used for the intervals.
Z95 = 1.96
#: Points a mean of per-image differences in {-1, 0, 1} can take at most either way.
_FULL_RANGE = 100.0
#: The share of images whose correctness a candidate near the budget changes (gained + lost), assumed before any
#: candidate is measured, to size the evaluation: 5 % is what the pruned rounds of the shared CIFAR models measured
#: around a 1-point budget (agreement 93-96 %, correctness changed on 4-6 % of the images).
ASSUMED_CHANGE_RATE = 0.05
#: Sequential evaluation: a candidate is looked at after these shares of the evaluation images (each look at least
#: ``SEQUENTIAL_MIN_IMAGES``), and its evaluation stops there when even the optimistic end of a ``SEQUENTIAL_Z``
#: standard-error interval loses more than the budget (:func:`clearly_over_budget`). Three looks at 3 standard
#: errors stop a candidate whose true drop is within the budget with probability below 0.4 %, so the test at the
#: end, on every image, decides every candidate that could pass it.
SEQUENTIAL_LOOKS = (0.125, 0.25, 0.5)
SEQUENTIAL_MIN_IMAGES = 100
SEQUENTIAL_Z = 3.0


def resolution_points(images: int, change_rate: float = ASSUMED_CHANGE_RATE) -> float:
    """Half-width of the 95 % interval of a paired accuracy change on ``images`` images, in points."""
    return _FULL_RANGE if images < 2 else 100.0 * Z95 * math.sqrt(change_rate / images)


def images_needed(budget_points: float, change_rate: float = ASSUMED_CHANGE_RATE) -> int:
    """Images the budget test needs: a candidate that truly loses half the budget passes it (drop + one standard
    error within the budget) only when the standard error is at most half the budget, ``n >= rate / (B/2)^2``."""
    if budget_points <= 0:
        return 0
    return math.ceil(change_rate / (budget_points / 200.0) ** 2)


def resolution_note(images: int, budget_points: float) -> str | None:
    """One line when ``images`` evaluation images cannot resolve the accuracy budget (None when they can)."""
    needed = images_needed(budget_points)
    if images >= needed:
        return None
    return (
        f"{images:,} evaluation images resolve about ±{resolution_points(images):.1f} points (95 %); the "
        f"{budget_points:g}-point budget needs about {needed:,} (a candidate that loses half the budget passes the "
        "test, drop + one standard error, only on that many), so pruned and int8 candidates will mostly be refused: "
        "give more images or raise --max-accuracy-drop, or budget the share of answers changed against the original, "
        f"which needs no labels and bounds the drop: --max-disagreement PCT on a folder of unlabelled images (about "
        f"{agreement_images_needed(budget_points):,} resolve {budget_points:g} %)"
    )


def is_budget_note(note: str) -> bool:
    """Whether a run's note is :func:`resolution_note`'s, :func:`unlabelled_note`'s or :func:`at_chance_note`'s: what
    the budget is and what the data resolves, which a report says in its first lines."""
    return note.startswith(("no labels:", "at chance:")) or " evaluation images resolve about " in note


def agreement_images_needed(budget_pct: float, z: float = 1.0) -> int:
    """Images the agreement budget needs: a candidate that changes half the budget's share of answers passes it
    (changed + ``z`` binomial standard errors within the budget) only on ``n >= z² (1 - p) / p`` images, ``p`` half
    the budget as a fraction (about 200 for 1 % and one standard error)."""
    half = budget_pct / 200.0
    return 0 if half <= 0 else math.ceil(z * z * (1.0 - half) / half)


def agreement_resolution(images: int, budget_pct: float, more: str = "unlabelled images") -> str:
    """What ``images`` resolve of an agreement budget of ``budget_pct`` % of answers changed, for a candidate judged
    alone (one standard error); ``more``: what to give more of."""
    needed = agreement_images_needed(budget_pct)
    if images >= needed:
        return f"{images:,} images resolve it"
    return f"{images:,} images resolve it only roughly (about {needed:,} are needed: give more {more})"


def unlabelled_note(images: int, budget_pct: float) -> str:
    """What the budget of an unlabelled dataset is and what it bounds, and what its images resolve
    (:func:`agreement_resolution`)."""
    resolved = agreement_resolution(images, budget_pct)
    return (
        f"no labels: each image's target is the original's top-1 answer, so 'accuracy' is the agreement with the "
        f"original (its own is 100 %) and a drop is the share of answers changed; the budget is {budget_pct:g} % of "
        f"answers changed (+ one standard error), which bounds the accuracy drop on any labelled images of this kind "
        f"to {budget_pct:g} points; {resolved}"
    )


def at_chance_note(images: int, budget_pct: float) -> str:
    """The budget of a run whose original scores at or near chance on its labelled images, where the share of answers
    changed holds besides the accuracy budget (``agents.common.disagreement_budget``), and what the images resolve."""
    return (
        f"at chance: the original's accuracy cannot tell what a candidate costs, so a candidate must also change at "
        f"most {budget_pct:g} % of its top-1 answers (+ one standard error; --max-disagreement, here "
        f"--max-accuracy-drop's {budget_pct:g}); {agreement_resolution(images, budget_pct, 'images')}; check that "
        "the labels match the model's classes"
    )


def sequential_looks(total: int) -> list[int]:
    """The image counts after which a candidate's evaluation on ``total`` images may stop (none for small parts)."""
    return sorted({int(total * share) for share in SEQUENTIAL_LOOKS if int(total * share) >= SEQUENTIAL_MIN_IMAGES})


def clearly_over_budget(paired: PairedAccuracy, budget_points: float, z: float = SEQUENTIAL_Z) -> bool:
    """True when the candidate loses more than ``budget_points`` even at the optimistic end of its ``z``-standard-
    error interval: more images would not bring it within the budget (sequential evaluation's stop)."""
    if paired.samples < 2:
        return False
    return paired.delta_points + z * standard_error_points(paired) < -budget_points


def paired_accuracy(
    reference_correct: Sequence[int | bool],
    candidate_correct: Sequence[int | bool],
    reference_pred: Sequence[int],
    candidate_pred: Sequence[int],
) -> PairedAccuracy:
    """The candidate's accuracy change against the reference on the same images, with its 95 % interval.

    Inputs are per image, in the same order: correctness (0/1 or bool) and top-1 class of each model.
    ``delta_points = 100 · mean(c_cand - c_ref)``; the interval is ``delta ± 1.96 · s / sqrt(n)`` with the
    sample standard deviation ``s`` (n - 1) of the differences. With fewer than two images the spread is
    unknown and the interval is the whole range, -100 to +100 points (with none, the change is 0 and the
    agreement 1: nothing was seen to differ).
    """
    n = len(reference_correct)
    if not (len(candidate_correct) == len(reference_pred) == len(candidate_pred) == n):
        raise ValueError(
            f"per-image results must align: {n} and {len(candidate_correct)} correct, "
            f"{len(reference_pred)} and {len(candidate_pred)} predictions"
        )
    diffs = [int(bool(c)) - int(bool(r)) for r, c in zip(reference_correct, candidate_correct, strict=True)]
    gained = sum(1 for d in diffs if d > 0)
    lost = sum(1 for d in diffs if d < 0)
    same = sum(1 for r, c in zip(reference_pred, candidate_pred, strict=True) if int(r) == int(c))
    if n == 0:
        return PairedAccuracy(
            delta_points=0.0,
            ci95_low_points=-_FULL_RANGE,
            ci95_high_points=_FULL_RANGE,
            agreement=1.0,
            samples=0,
            gained=0,
            lost=0,
        )
    mean = sum(diffs) / n
    if n < 2:
        low, high = -_FULL_RANGE, _FULL_RANGE
    else:
        variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
        half = Z95 * math.sqrt(variance / n)
        low, high = 100.0 * (mean - half), 100.0 * (mean + half)
    return PairedAccuracy(
        delta_points=round(100.0 * mean, 4),
        ci95_low_points=round(low, 4),
        ci95_high_points=round(high, 4),
        agreement=round(same / n, 6),
        samples=n,
        gained=gained,
        lost=lost,
    )


def standard_error_points(paired: PairedAccuracy | dict[str, float]) -> float:
    """One standard error of the paired difference, in points: the interval's half-width / 1.96."""
    result = PairedAccuracy.model_validate(paired)
    return (result.ci95_high_points - result.ci95_low_points) / (2 * Z95)


def drop_points(
    baseline: float | None, accuracy: float | None, paired: PairedAccuracy | dict[str, float] | None = None
) -> float | None:
    """Points lost against the original (negative: a gain): from the paired result when there is one (the two
    models on the same images, whichever images they were), else ``baseline - accuracy``; None when unknown."""
    if paired is not None:
        return round(-PairedAccuracy.model_validate(paired).delta_points, 4)
    return None if baseline is None or accuracy is None else round(100.0 * (baseline - accuracy), 4)


def budget_drop_points(
    drop_points: float | None, paired: PairedAccuracy | dict[str, float] | None = None, z: float = 1.0
) -> float | None:
    """The drop the budget test holds against ``--max-accuracy-drop``: the measured drop plus ``z`` (one, for one
    candidate) standard errors of the paired difference (``se`` = the 95 % interval's half-width / 1.96). Without a
    paired result, the point estimate ``drop_points``; None when accuracy is unknown."""
    if paired is None:
        return drop_points
    result = PairedAccuracy.model_validate(paired)
    return -result.delta_points + z * standard_error_points(result)


#: Standard errors every choice on the choose images holds a candidate's drop under the budget by: one, each
#: candidate judged alone (``within_budget``'s default). What ships is judged again on the confirm images, which
#: nothing chose on (``tools.evaluation.confirm``), so the choice needs no margin for the number of candidates.
CHOOSE_Z = 1.0

#: The one-sided level of the budget test for one candidate: drop + one standard error (z = 1).
ONE_SE_LEVEL = 1.0 - NormalDist().cdf(1.0)


def selection_z(candidates: int) -> float:
    """How many standard errors a candidate's drop must stay under the budget by when it was the best of
    ``candidates`` tried: the budget test's one-sided level (one standard error for one) split over the tries
    (Bonferroni): 1.00 for one, 1.75 for four, 1.94 for six, 2.24 for twelve."""
    return NormalDist().inv_cdf(1.0 - ONE_SE_LEVEL / max(1, candidates))


def disagreement_bound_pct(paired: PairedAccuracy | dict[str, float], z: float = 1.0) -> float:
    """The share of images whose top-1 answer changed against the original, plus ``z`` standard errors of it
    (binomial), in percent: what the agreement budget (``--max-disagreement``) holds against."""
    result = PairedAccuracy.model_validate(paired)
    changed = 1.0 - result.agreement
    if result.samples < 1:
        return _FULL_RANGE
    return 100.0 * (changed + z * math.sqrt(max(changed * (1.0 - changed), 0.0) / result.samples))


def within_budget(
    drop_points: float | None,
    max_drop: float,
    paired: PairedAccuracy | dict[str, float] | None = None,
    max_disagreement: float | None = None,
    z: float = 1.0,
) -> bool:
    """The accuracy budget test, the one place it is decided.

    With a paired comparison (``Metrics.paired``: the candidate and the original on the same images), a
    candidate is within budget when its drop **plus one standard error** is at most ``max_drop``:
    ``-delta + se <= max_drop``. A small evaluation subset has a large standard error, so a candidate whose
    measured drop is just under the budget by chance is not taken; with many images, or few disagreements
    with the original, ``se`` is small and the test is the measured drop. Without a paired result the
    point estimate ``drop_points`` decides; an unknown accuracy (untrained model, no dataset) never rejects.
    With ``max_disagreement`` (percent), the agreement budget must hold too: the share of images whose answer
    changed, plus one standard error, at most that (:func:`disagreement_bound_pct`; it needs the paired result).
    ``z``: standard errors instead of one, for a candidate that was the best of several tried (:func:`selection_z`).
    """
    drop = budget_drop_points(drop_points, paired, z)
    changed = disagreement_bound_pct(paired, z) if max_disagreement is not None and paired is not None else None
    if changed is not None and max_disagreement is not None and changed > max_disagreement + 1e-9:
        return False
    return drop is None or drop <= max_drop + 1e-9


class Budget(BaseModel):
    """The run's budget test of one candidate as a value: ``budget(drop, paired, z)`` is :func:`within_budget` with
    ``max_drop_points`` and, where given, ``max_disagreement_pct``."""

    max_drop_points: float
    max_disagreement_pct: float | None = None

    def __call__(
        self, drop_points: float | None, paired: PairedAccuracy | dict[str, float] | None, z: float = 1.0
    ) -> bool:
        return within_budget(drop_points, self.max_drop_points, paired, self.max_disagreement_pct, z)
