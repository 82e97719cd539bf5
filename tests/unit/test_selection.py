"""Choosing the best round: accuracy (ties within the 95 % interval of the difference), then params, then latency;
or ``--selection smallest-within-budget``; the budget test (drop + one standard error); and the node that
reports the original when no round is within budget."""

from __future__ import annotations

import math
from typing import Any

import pytest
from langgraph.runtime import Runtime

from agents.context import Context
from agents.iterative import select_best_model
from agents.planning.selection import TIE_Z, accuracy_drop_points, best_round, budget_drop_points, within_budget
from tests.helpers import round_result, typed_state
from tools.schemas import OptimizationPlan, PairedAccuracy, PrunedEntry, RoundResult

Z95 = 1.96


def _paired(delta: float = 0.0, half_width: float = 0.0) -> dict[str, Any]:
    return {
        "delta_points": delta,
        "ci95_low_points": delta - half_width,
        "ci95_high_points": delta + half_width,
        "agreement": 0.95,
        "samples": 1000,
        "gained": 10,
        "lost": 10,
    }


def _round(
    i: int,
    accuracy: float | None,
    params: int,
    ok: bool = True,
    half_width: float | None = None,
    latency_s: float | None = None,
) -> RoundResult:
    metrics: dict[str, Any] = {
        "accuracy": accuracy,
        "params": params,
        "latency_s": 0.001 * params / 1000 if latency_s is None else latency_s,
    }
    if half_width is not None:
        metrics["paired"] = _paired(half_width=half_width)
    return round_result({"round": i, "within_budget": ok, "metrics": metrics, "source": "rules"})


# ------------------------------------------------------------------------------------------ best_round


def test_most_accurate_within_budget_wins_without_paired_results() -> None:
    rounds = [_round(0, 0.645, 900), _round(1, 0.644, 700), _round(2, 0.70, 500, ok=False)]
    assert best_round(rounds, "accuracy").round == 0
    assert best_round(rounds, "smallest-within-budget").round == 1
    assert best_round([_round(0, 0.6, 1, ok=False)], "accuracy") is None


@pytest.mark.parametrize("selection", ["accuracy", "smallest-within-budget"])
def test_no_round_within_budget_gives_none(selection: Any) -> None:
    assert best_round([], selection) is None
    rounds = [_round(0, 0.9, 100, ok=False), _round(1, 0.99, 50, ok=False, half_width=5.0)]
    assert best_round(rounds, selection) is None


def test_accuracy_differences_within_the_95_percent_interval_of_the_difference_are_ties() -> None:
    # se = 0.28 (best), 0.43 and 0.46 points: the differences' 95 % half-widths are 1.02 and 1.06 points; 0.1 and
    # 0.7 lower are ties (the earlier one-standard-error rule took 0.7 for a real difference), 1.2 is not
    rounds = [
        _round(0, 0.645, 900, half_width=0.55),
        _round(1, 0.644, 700, half_width=0.85),
        _round(2, 0.633, 600, half_width=0.9),
    ]
    assert best_round(rounds, "accuracy").round == 1
    assert best_round([*rounds[:2], _round(2, 0.638, 600, half_width=0.9)], "accuracy").round == 2
    # a precise evaluation resolves 0.1 points: then the more accurate round stays the best
    precise = [_round(0, 0.645, 900, half_width=0.05), _round(1, 0.644, 700, half_width=0.05)]
    assert best_round(precise, "accuracy").round == 0


def test_the_tie_tolerance_is_the_95_percent_half_width_of_the_difference_of_the_two_rounds() -> None:
    se_points, other = 0.5, 0.1 / Z95  # half-widths 0.98 and 0.1 points
    tolerance = TIE_Z * math.hypot(se_points, other) / 100  # 0.985 points, as a fraction
    best = _round(0, 0.800, 900, half_width=se_points * Z95)
    just_inside = _round(1, 0.800 - tolerance + 0.0001, 500, half_width=0.1)  # a tie, fewer params
    just_outside = _round(2, 0.800 - tolerance - 0.0001, 100, half_width=0.1)  # not a tie
    assert best_round([best, just_inside], "accuracy").round == 1
    assert best_round([best, just_outside], "accuracy").round == 0
    assert best_round([best, just_inside, just_outside], "accuracy").round == 1
    # a precisely measured best round and a round whose own interval is wider: the wider one decides
    # (distilled candidates agree with the original on more images than the best, often least pruned, round)
    narrow = _round(0, 0.800, 900, half_width=0.0)
    wide = TIE_Z * se_points / 100
    assert (
        best_round([narrow, _round(1, 0.800 - wide + 0.0001, 500, half_width=se_points * Z95)], "accuracy").round == 1
    )
    assert (
        best_round([narrow, _round(1, 0.800 - wide - 0.0001, 500, half_width=se_points * Z95)], "accuracy").round == 0
    )


def test_among_ties_fewest_params_then_lowest_latency_then_higher_accuracy() -> None:
    hw = 2.0  # se ~ 1 point: all three are ties
    rounds = [
        _round(0, 0.80, 500, half_width=hw, latency_s=0.003),
        _round(1, 0.795, 400, half_width=hw, latency_s=0.002),
        _round(2, 0.79, 400, half_width=hw, latency_s=0.001),
    ]
    assert best_round(rounds, "accuracy").round == 2
    same_latency = [r.model_copy(update={"metrics": r.metrics.model_copy(update={"latency_s": 0.001})}) for r in rounds]
    assert best_round(same_latency, "accuracy").round == 1  # same params and latency: the more accurate


def test_equal_accuracy_without_paired_results_falls_to_params_then_latency_then_round() -> None:
    rounds = [_round(0, 0.7, 500, latency_s=0.001), _round(1, 0.7, 400, latency_s=0.002)]
    assert best_round(rounds, "accuracy").round == 1
    rounds = [_round(0, 0.7, 400, latency_s=0.002), _round(1, 0.7, 400, latency_s=0.001)]
    assert best_round(rounds, "accuracy").round == 1
    rounds = [_round(3, 0.7, 400, latency_s=0.001), _round(1, 0.7, 400, latency_s=0.001)]
    assert best_round(rounds, "accuracy").round == 1  # a full tie: the earlier round


def test_unknown_accuracy_selects_the_smallest_round() -> None:
    """An untrained model or no dataset: accuracies are None, every round is within budget; params decide."""
    rounds = [_round(0, None, 900), _round(1, None, 300), _round(2, None, 600)]
    assert best_round(rounds, "accuracy").round == 1
    assert best_round(rounds, "smallest-within-budget").round == 1


def test_smallest_within_budget_ignores_accuracy_until_params_tie() -> None:
    rounds = [
        _round(0, 0.90, 900, half_width=0.1),
        _round(1, 0.60, 300, half_width=0.1),
        _round(2, 0.95, 100, ok=False),  # smaller and more accurate, but over budget
        _round(3, 0.70, 300, half_width=0.1),
    ]
    assert best_round(rounds, "smallest-within-budget").round == 3  # same params: the more accurate
    assert best_round(rounds, "accuracy").round == 0
    slower = [_round(0, 0.7, 300, latency_s=0.002), _round(1, 0.6, 300, latency_s=0.001)]
    assert best_round(slower, "smallest-within-budget").round == 0  # accuracy before latency
    equal = [_round(0, 0.7, 300, latency_s=0.002), _round(1, 0.7, 300, latency_s=0.001)]
    assert best_round(equal, "smallest-within-budget").round == 1


# -------------------------------------------------------------------------------------- the budget test


def test_accuracy_drop_points() -> None:
    assert accuracy_drop_points(0.9, 0.885) == pytest.approx(1.5)
    assert accuracy_drop_points(0.9, 0.91) == pytest.approx(-1.0)
    assert accuracy_drop_points(None, 0.9) is None and accuracy_drop_points(0.9, None) is None


def test_budget_is_the_drop_plus_one_standard_error() -> None:
    se = 0.5
    paired = _paired(delta=-0.5, half_width=se * Z95)
    assert budget_drop_points(0.5, paired) == pytest.approx(1.0)
    assert within_budget(0.5, 1.0, paired)
    assert not within_budget(0.5, 0.99, paired)
    worse = _paired(delta=-0.52, half_width=se * Z95)
    assert not within_budget(0.52, 1.0, worse), "0.52 + 0.5 is over a 1-point budget"
    assert within_budget(0.52, 1.0), "without the standard error the same drop is within budget"


def test_a_gain_meets_a_zero_budget_only_when_it_beats_its_standard_error() -> None:
    assert within_budget(-1.0, 0.0, _paired(delta=1.0, half_width=0.5 * Z95))  # -1 + 0.5 <= 0
    assert not within_budget(-0.2, 0.0, _paired(delta=0.2, half_width=0.5 * Z95))  # -0.2 + 0.5 > 0


def test_the_paired_result_decides_over_the_point_estimate() -> None:
    """Both come from the same images; the paired difference (and its se) is what the test holds."""
    assert budget_drop_points(5.0, _paired(delta=0.0, half_width=0.0)) == 0.0
    assert not within_budget(0.0, 1.0, _paired(delta=-2.0, half_width=0.0))


# ------------------------------------------------------------------------------- the select_best_model node


def _state(rounds: list[RoundResult]) -> Any:
    baseline = {"accuracy": 0.9, "params": 1000, "latency_s": 0.01, "memory_mb": 4.0, "artifact": "/runs/original"}
    return typed_state({"baseline": {**baseline, "data_parts": {"evaluation": 40}}, "rounds": rounds})


def test_no_round_within_budget_reports_the_original() -> None:
    state = _state([_round(0, 0.5, 400, ok=False), _round(1, 0.6, 600, ok=False)])
    for selection in ("accuracy", "smallest-within-budget"):
        out = select_best_model(state, Runtime(context=Context(selection=selection, max_accuracy_drop=0.5)))
        pruned = out["pruned"]
        assert isinstance(pruned, PrunedEntry)
        assert pruned.model_dump(exclude_defaults=True) == {
            "accuracy": 0.9,
            "params": 1000,
            "latency_s": 0.01,
            "memory_mb": 4.0,
            "artifact": "/runs/original",
            "within_budget": False,
            "accuracy_drop_points": 0.0,
            "at_chance": False,  # the baseline's own fields but its data parts
        }
        assert pruned.round is None
        (note,) = out["notes"]
        assert "0.5 point accuracy budget" in note and "original" in note


@pytest.mark.parametrize("selection,expected", [("accuracy", 0), ("smallest-within-budget", 2)])
def test_the_selected_round_is_reported(selection: Any, expected: int) -> None:
    rounds = [_round(0, 0.89, 800), _round(1, 0.95, 100, ok=False), _round(2, 0.85, 300)]
    for r in rounds:
        r.accuracy_drop_points = accuracy_drop_points(0.9, r.metrics.accuracy)
    out = select_best_model(_state(rounds), Runtime(context=Context(selection=selection)))
    chosen = rounds[expected]
    assert out["pruned"] == PrunedEntry(
        **chosen.metrics.model_dump(exclude={"within_budget"}),
        round=expected,
        within_budget=True,
        accuracy_drop_points=chosen.accuracy_drop_points,
        plan=OptimizationPlan(),
        source="rules",
    )
    assert out["notes"] == []


# ------------------------------------------------------------------------------------------ kept_round


def _scored(i: int, drop: float, se: float, params: int, ok: bool = True) -> RoundResult:
    r = _round(i, 0.80 - drop / 100, params, ok=ok)
    r.accuracy_drop_points = drop
    r.metrics.paired = PairedAccuracy.model_validate(_paired(delta=-drop, half_width=se * Z95))
    return r


def test_the_kept_round_is_the_best_within_budget_each_judged_alone() -> None:
    """No margin for the number of rounds: what ships is judged again on the confirm images (agents.confirmation)."""
    from agents.planning.selection import kept_round

    rounds = [
        _scored(0, 0.28, 0.21, 800),
        _scored(1, 0.43, 0.29, 720),
        _scored(2, 0.54, 0.37, 680),
        _scored(3, 1.77, 0.42, 630, ok=False),
    ]
    kept = kept_round(rounds, "accuracy", 1.0)
    assert kept is not None and kept.round == best_round(rounds, "accuracy").round == 2
    assert kept_round([_scored(0, 2.0, 0.4, 600, ok=False)], "accuracy", 1.0) is None


def test_the_budget_as_a_value_is_the_budget_test_and_serializes() -> None:
    """``Budget`` is what the deployment receives instead of a closure over the run: the same answers as
    ``within_budget`` (the agreement budget too), and plain data."""
    from tools.stats import Budget

    paired = {"delta_points": -0.6, "ci95_low_points": -1.1, "ci95_high_points": -0.1, "agreement": 0.95}
    paired |= {"samples": 400, "gained": 6, "lost": 8}
    budget = Budget(max_drop_points=1.0)
    assert budget(0.6, paired, 1.0) == within_budget(0.6, 1.0, paired, z=1.0)
    assert budget(0.6, paired, 1.0) and not budget(0.6, paired, 2.0)  # more tries, a wider margin
    strict = Budget(max_drop_points=1.0, max_disagreement_pct=4.0)
    assert not strict(0.6, paired, 1.0)  # 5 % of the answers changed
    assert Budget.model_validate(strict.model_dump()) == strict
