"""The selection policy: the accuracy budget and the best round, used by the pruning loop and the runner."""

from __future__ import annotations

import math
from typing import Any

from graph.context import Selection
from tools.evaluation.paired import standard_error_points
from tools.schemas import PairedAccuracy


def accuracy_drop_points(baseline: float | None, accuracy: float | None) -> float | None:
    """Points lost against the baseline (negative: a gain); None when either accuracy is unknown."""
    if baseline is None or accuracy is None:
        return None
    return round(100.0 * (baseline - accuracy), 4)


def budget_drop_points(
    drop_points: float | None, paired: PairedAccuracy | dict[str, Any] | None = None
) -> float | None:
    """The drop the budget test holds against ``--max-accuracy-drop``: the measured drop plus one standard
    error of the paired difference (``se`` = the 95 % interval's half-width / 1.96). Without a paired result,
    the point estimate ``drop_points``; None when accuracy is unknown."""
    if paired is None:
        return drop_points
    result = PairedAccuracy.model_validate(paired)
    return -result.delta_points + standard_error_points(result)


def within_budget(
    drop_points: float | None, max_drop: float, paired: PairedAccuracy | dict[str, Any] | None = None
) -> bool:
    """The accuracy budget test, the one place it is decided.

    With a paired comparison (``Metrics.paired``: the candidate and the original on the same images), a
    candidate is within budget when its drop **plus one standard error** is at most ``max_drop``:
    ``-delta + se <= max_drop``. A small evaluation subset has a large standard error, so a candidate whose
    measured drop is just under the budget by chance is not taken; with many images, or few disagreements
    with the original, ``se`` is small and the test is the measured drop. Without a paired result the
    point estimate ``drop_points`` decides; an unknown accuracy (untrained model, no dataset) never rejects.
    """
    drop = budget_drop_points(drop_points, paired)
    return drop is None or drop <= max_drop + 1e-9


def best_round(rounds: list[dict[str, Any]], selection: Selection) -> dict[str, Any] | None:
    """The best round within budget: by accuracy, then params, then latency (or fewest params first).

    Accuracy differences the evaluation cannot resolve are ties: a round whose accuracy is within one
    standard error of the difference from the most accurate round's counts as equally accurate (that
    standard error taken as ``sqrt(se_best^2 + se_round^2)`` from the two rounds' paired differences with the
    original), and the fewest parameters, then the lowest latency, decide among them. Every candidate passed
    the budget test, so its own standard error is at most the accuracy budget. Without paired results,
    accuracies must be equal to tie.
    """
    candidates = [r for r in rounds if r["within_budget"]]
    if not candidates:
        return None

    def accuracy(r: dict[str, Any]) -> float:
        value = r["metrics"].get("accuracy")
        return -1.0 if value is None else float(value)

    def key(r: dict[str, Any]) -> tuple[float, ...]:
        m = r["metrics"]
        if selection == "smallest-within-budget":
            return (m["params"], -accuracy(r), m["latency_s"], r["round"])
        return (-accuracy(r), m["params"], m["latency_s"], r["round"])

    best = min(candidates, key=key)
    if selection == "smallest-within-budget" or best["metrics"].get("accuracy") is None:
        return best

    def se(r: dict[str, Any]) -> float:
        paired = r["metrics"].get("paired")
        return standard_error_points(PairedAccuracy.model_validate(paired)) / 100 if paired else 0.0

    tied = [r for r in candidates if accuracy(r) >= accuracy(best) - math.hypot(se(best), se(r)) - 1e-12]
    return min(tied, key=lambda r: (r["metrics"]["params"], r["metrics"]["latency_s"], -accuracy(r), r["round"]))
