"""The routers of graph/routing.py, called directly with hand-built state and settings: every branch of each.

The first test ties the list below to the module and to the graph: a new ``route_after_*`` without a test
here, or a router wired after another node than its name says, fails it.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest
from langgraph.runtime import Runtime

from graph import routing
from graph.builder import NODES, build_graph
from graph.context import Context
from graph.routing import (
    after_pruning_stage,
    rounds_wanted,
    route_after_analyze_profile,
    route_after_evaluate_model,
    route_after_iterate_pruning,
    route_after_review_plan,
    route_after_select_best_model,
)

TESTED = {
    "route_after_analyze_profile",
    "route_after_evaluate_model",
    "route_after_iterate_pruning",
    "route_after_review_plan",
    "route_after_select_best_model",
}


def _rt(**settings: Any) -> Runtime[Context]:
    return Runtime(context=Context(**settings))


def _rounds(n: int) -> list[dict[str, Any]]:
    return [{"round": i} for i in range(n)]


def test_every_router_is_tested_and_wired_after_the_node_it_names() -> None:
    routers = {name for name, _ in inspect.getmembers(routing, inspect.isfunction) if name.startswith("route_after_")}
    assert routers == TESTED
    edges = build_graph().compile().get_graph().edges
    for name in routers:
        source = name.removeprefix("route_after_")
        assert source in NODES, name
        targets = {e.target for e in edges if e.source == source and e.conditional}
        declared = set(typing.get_args(typing.get_type_hints(getattr(routing, name))["return"]))
        assert targets == declared, (name, targets, declared)
        assert declared <= set(NODES)


def test_after_pruning_stage_quantizes_only_when_asked() -> None:
    assert after_pruning_stage(Context(quantize=True)) == "quantize_model"
    assert after_pruning_stage(Context(quantize=False)) == "measure_latencies"


@pytest.mark.parametrize(
    "settings,expected",
    [
        ({"prune": True, "approve_plan": False}, "prune_model"),
        ({"prune": True, "approve_plan": True}, "review_plan"),
        ({"prune": False, "approve_plan": True, "quantize": True}, "quantize_model"),  # no plan to review
        ({"prune": False, "approve_plan": False, "quantize": False}, "measure_latencies"),
    ],
)
def test_route_after_analyze_profile(settings: dict[str, Any], expected: str) -> None:
    assert route_after_analyze_profile({}, _rt(**settings)) == expected


@pytest.mark.parametrize(
    "approve_plan,approve_rounds,expected",
    [
        (False, False, "prune_model"),
        (True, False, "prune_model"),  # only the analysis plan is reviewed
        (False, True, "prune_model"),  # rounds are reviewed only with --approve-plan too
        (True, True, "review_plan"),
    ],
)
def test_route_after_iterate_pruning(approve_plan: bool, approve_rounds: bool, expected: str) -> None:
    ctx = _rt(approve_plan=approve_plan, approve_rounds=approve_rounds)
    assert route_after_iterate_pruning({"rounds": _rounds(1)}, ctx) == expected


@pytest.mark.parametrize("action", ["approve", "edit"])
def test_an_approved_or_edited_plan_is_pruned(action: str) -> None:
    for rounds in ([], _rounds(2)):
        state: Any = {"review": {"action": action}, "rounds": rounds}
        assert route_after_review_plan(state, _rt(quantize=False)) == "prune_model"


def test_a_rejected_round_ends_the_loop_and_earlier_rounds_still_count() -> None:
    state: Any = {"review": {"action": "reject"}, "rounds": _rounds(1)}
    assert route_after_review_plan(state, _rt(quantize=True)) == "select_best_model"
    assert route_after_review_plan(state, _rt(quantize=False)) == "select_best_model"


def test_a_rejected_analysis_plan_skips_pruning() -> None:
    for rounds in (None, []):
        state: Any = {"review": {"action": "reject"}, "rounds": rounds}
        assert route_after_review_plan(state, _rt(quantize=True)) == "quantize_model"
        assert route_after_review_plan(state, _rt(quantize=False)) == "measure_latencies"


def test_no_review_yet_is_not_a_rejection() -> None:
    assert route_after_review_plan({}, _rt()) == "prune_model"
    assert route_after_review_plan({"review": None}, _rt()) == "prune_model"  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "settings,wanted",
    [
        ({"iterate": True, "iterations": 2}, 3),
        ({"iterate": True, "iterations": 0}, 1),
        ({"iterate": False, "iterations": 5}, 1),
    ],
)
def test_route_after_evaluate_model_runs_one_plus_t_rounds(settings: dict[str, Any], wanted: int) -> None:
    ctx = Context(**settings)
    assert rounds_wanted(ctx) == wanted
    runtime = Runtime(context=ctx)
    for done in range(1, wanted):
        assert route_after_evaluate_model({"rounds": _rounds(done)}, runtime) == "iterate_pruning", done
    assert route_after_evaluate_model({"rounds": _rounds(wanted)}, runtime) == "select_best_model"
    assert route_after_evaluate_model({"rounds": _rounds(wanted + 1)}, runtime) == "select_best_model"


def test_route_after_select_best_model() -> None:
    state: Any = {"rounds": _rounds(2)}
    assert route_after_select_best_model(state, _rt(quantize=True)) == "quantize_model"
    assert route_after_select_best_model(state, _rt(quantize=False)) == "measure_latencies"


def test_routers_read_settings_given_as_a_dict() -> None:
    """The dev server hands the context as a plain dict: the routers read it the same way."""
    runtime: Any = Runtime(context={"prune": True, "approve_plan": True})
    assert route_after_analyze_profile({}, runtime) == "review_plan"
    runtime = Runtime(context={"iterate": True, "iterations": 1})
    assert route_after_evaluate_model({"rounds": _rounds(1)}, runtime) == "iterate_pruning"
