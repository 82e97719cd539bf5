"""The selection policy: the accuracy budget and the best round, used by the pruning loop and the runner."""

from __future__ import annotations

import math
from typing import Any

from graph.context import Selection
from tools.schemas import PairedAccuracy
from tools.stats import budget_drop_points, standard_error_points, within_budget

__all__ = ["accuracy_drop_points", "best_round", "budget_drop_points", "within_budget"]


def accuracy_drop_points(baseline: float | None, accuracy: float | None) -> float | None:
    """Points lost against the baseline (negative: a gain); None when either accuracy is unknown."""
    if baseline is None or accuracy is None:
        return None
    return round(100.0 * (baseline - accuracy), 4)


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
