"""Choosing the best round: accuracy (ties within the evaluation's resolution), then params, then latency."""

from __future__ import annotations

from typing import Any

from agents.planning.selection import best_round


def _round(i: int, accuracy: float, params: int, ok: bool = True, half_width: float | None = None) -> dict[str, Any]:
    metrics: dict[str, Any] = {"accuracy": accuracy, "params": params, "latency_s": 0.001 * params / 1000}
    if half_width is not None:
        metrics["paired"] = {
            "delta_points": 0.0,
            "ci95_low_points": -half_width,
            "ci95_high_points": half_width,
            "agreement": 0.95,
            "samples": 1000,
            "gained": 10,
            "lost": 10,
        }
    return {"round": i, "within_budget": ok, "metrics": metrics}


def test_most_accurate_within_budget_wins_without_paired_results() -> None:
    rounds = [_round(0, 0.645, 900), _round(1, 0.644, 700), _round(2, 0.70, 500, ok=False)]
    assert best_round(rounds, "accuracy")["round"] == 0
    assert best_round(rounds, "smallest-within-budget")["round"] == 1
    assert best_round([_round(0, 0.6, 1, ok=False)], "accuracy") is None


def test_accuracy_differences_within_one_standard_error_are_ties() -> None:
    # the best round's interval is +-0.55 points: se = 0.28 points; 0.1 points lower is a tie, 0.5 is not
    rounds = [
        _round(0, 0.645, 900, half_width=0.55),
        _round(1, 0.644, 700, half_width=0.85),
        _round(2, 0.640, 600, half_width=0.9),
    ]
    assert best_round(rounds, "accuracy")["round"] == 1
    # a precise evaluation resolves 0.1 points: then the more accurate round stays the best
    precise = [_round(0, 0.645, 900, half_width=0.05), _round(1, 0.644, 700, half_width=0.05)]
    assert best_round(precise, "accuracy")["round"] == 0
