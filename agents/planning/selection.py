"""The selection policy: the accuracy budget and the best round, used by the pruning loop and the runner."""

from __future__ import annotations

from typing import Any

from graph.context import Selection


def accuracy_drop_points(baseline: float | None, accuracy: float | None) -> float | None:
    """Points lost against the baseline (negative: a gain); None when either accuracy is unknown."""
    if baseline is None or accuracy is None:
        return None
    return round(100.0 * (baseline - accuracy), 4)


def within_budget(drop_points: float | None, max_drop: float) -> bool:
    """A candidate is within budget unless it measurably loses more than ``max_drop`` points."""
    return drop_points is None or drop_points <= max_drop + 1e-9


def best_round(rounds: list[dict[str, Any]], selection: Selection) -> dict[str, Any] | None:
    """The best round within budget: by accuracy, then params, then latency (or fewest params first)."""
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

    return min(candidates, key=key)
