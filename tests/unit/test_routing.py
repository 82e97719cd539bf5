"""The routers of graph/routing.py, called directly with hand-built state and settings: every branch of each.

The first test ties the list below to the module and to the graph: a new ``route_after_*`` without a test
here, or a router wired after another node than its name says, fails it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.runtime import Runtime

from agents.context import Context
from graph import routing
from graph.builder import NODES, build_graph
from graph.routing import after_pruning_stage, rounds_wanted
from tests.helpers import typed_state

TESTED = {
    "route_after_analyze_profile",
    "route_after_confirm_deployment",
    "route_after_distill_over_budget_round",
    "route_after_evaluate_model",
    "route_after_iterate_pruning",
    "route_after_quantize_model",
    "route_after_review_plan",
    "route_after_select_best_model",
}


def _typed(router: Callable[..., str]) -> Callable[[Any, Any], str]:
    """The router called with the hand-built state validated into the graph's ``State``, as LangGraph passes it."""

    def call(state: Any, runtime: Any) -> str:
        return router(typed_state(state), runtime)

    return call


route_after_analyze_profile = _typed(routing.route_after_analyze_profile)
route_after_distill_over_budget_round = _typed(routing.route_after_distill_over_budget_round)
route_after_evaluate_model = _typed(routing.route_after_evaluate_model)
route_after_iterate_pruning = _typed(routing.route_after_iterate_pruning)
route_after_review_plan = _typed(routing.route_after_review_plan)
route_after_select_best_model = _typed(routing.route_after_select_best_model)


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
    assert after_pruning_stage(Context(quantize=False)) == "confirm_deployment"


@pytest.mark.parametrize(
    "settings,expected",
    [
        ({"prune": True, "approve_plan": False}, "prune_model"),
        ({"prune": True, "approve_plan": True}, "review_plan"),
        ({"prune": False, "approve_plan": True, "quantize": True}, "quantize_model"),  # no plan to review
        ({"prune": False, "approve_plan": False, "quantize": False}, "confirm_deployment"),
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
        assert route_after_review_plan(state, _rt(quantize=False)) == "confirm_deployment"


def test_no_review_yet_is_not_a_rejection() -> None:
    assert route_after_review_plan({}, _rt()) == "prune_model"
    assert route_after_review_plan({"review": None}, _rt()) == "prune_model"


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


def _searched(macs: float = 4e7, over_budget_params: int = 60) -> dict[str, Any]:
    """A finished search: round 0 within the budget (80 parameters), round 1 over it (smaller), a labelled dataset
    with calibration images, a model ``macs`` per image."""

    def round_(index: int, params: int, drop: float, within: bool) -> dict[str, Any]:
        metrics = {"params": params, "latency_s": 1.0, "accuracy": 0.9 - drop / 100, "artifact": f"r{index}"}
        return {"round": index, "metrics": metrics, "accuracy_drop_points": drop, "within_budget": within}

    return {
        "dataset": "cifar10",
        "baseline": {"params": 100, "accuracy": 0.9, "data_parts": {"calibration": 64, "evaluation": 400}},
        "profile_summary": {"total_macs": macs},
        "rounds": [round_(0, 80, 0.2, True), round_(1, over_budget_params, 1.8, False)],
    }


def test_a_search_that_left_a_smaller_round_over_the_budget_distils_it_then_plans_on() -> None:
    state: Any = _searched()
    runtime = _rt(iterations=1, distill_rescues=3)
    assert route_after_evaluate_model(state, runtime) == "distill_over_budget_round"
    assert route_after_evaluate_model(state, _rt(iterations=1)) == "distill_over_budget_round"  # auto: 1 at 4e7 MACs
    distilled = {**state["rounds"][1], "round": 2, "cross_fit": {"source_round": 1}, "within_budget": False}
    after: Any = {**state, "rounds": [*state["rounds"], distilled]}
    # nothing left to distill: the search plans on from the distilled round, while distillations are left
    assert route_after_distill_over_budget_round(after, runtime) == "iterate_pruning"
    assert route_after_distill_over_budget_round(after, _rt(iterations=1, distill_rescues=1)) == "select_best_model"
    assert route_after_distill_over_budget_round(after, _rt(iterations=1)) == "select_best_model"  # auto: one pair
    assert route_after_distill_over_budget_round(after, _rt(iterations=1, iterate=False)) == "select_best_model"
    spent = [*after["rounds"], *({**distilled, "round": i, "cross_fit": {"source_round": i}} for i in (3, 4))]
    assert route_after_distill_over_budget_round({**after, "rounds": spent}, runtime) == "select_best_model"
    # another round smaller than the one kept now: distilled next
    smaller = {**state["rounds"][1], "round": 3, "metrics": {**state["rounds"][1]["metrics"], "params": 40}}
    more: Any = {**after, "rounds": [*after["rounds"], smaller]}
    assert route_after_distill_over_budget_round(more, runtime) == "distill_over_budget_round"


@pytest.mark.parametrize(
    "settings,state",
    [
        ({"distill_rescues": 0}, _searched()),  # turned off
        ({"finetune_steps": 300}, _searched()),  # every round was distilled already
        ({}, _searched(macs=5e9)),  # 300 steps would take over 600 s at the measured training rate
        ({}, _searched(over_budget_params=90)),  # the round over the budget is larger than the one kept
        ({}, {**_searched(), "dataset": None}),  # no images to distil on or judge by
        # too few evaluation images to split into halves worth judging a student on
        (
            {},
            {
                **_searched(),
                "baseline": {**_searched()["baseline"], "data_parts": {"calibration": 64, "evaluation": 60}},
            },
        ),
    ],
)
def test_no_distillation_after_the_search_when_it_cannot_help(settings: dict[str, Any], state: Any) -> None:
    assert route_after_evaluate_model(state, _rt(iterations=1, **settings)) == "select_best_model"


def test_route_after_select_best_model() -> None:
    state: Any = {"rounds": _rounds(2)}
    assert route_after_select_best_model(state, _rt(quantize=True)) == "quantize_model"
    assert route_after_select_best_model(state, _rt(quantize=False)) == "confirm_deployment"


def test_routers_read_settings_given_as_a_dict() -> None:
    """The dev server hands the context as a plain dict: the routers read it the same way."""
    runtime: Any = Runtime(context={"prune": True, "approve_plan": True})
    assert route_after_analyze_profile({}, runtime) == "review_plan"
    runtime = Runtime(context={"iterate": True, "iterations": 1})
    assert route_after_evaluate_model({"rounds": _rounds(1)}, runtime) == "iterate_pruning"


@pytest.mark.parametrize(
    ("ships", "node"),
    [
        ("kept_round", "build_deployed_model"),
        ("second_student", "adopt_second_student"),
        ("headroom_round", "adopt_headroom_round"),
        ("original", "adopt_original"),
    ],
)
def test_what_ships_is_one_choice_and_the_graph_draws_its_branch(ships: str, node: str) -> None:
    """quantize_model returns one typed choice; the branch to what ships is an edge of the graph (``langgraph dev``
    draws it), and every branch ends in the one node that builds the deployed model."""
    from tools.deploy.choice import DeployChoice

    state = typed_state({"deployment": DeployChoice(chosen="openvino-int8", why="test", ships=ships)})  # type: ignore[arg-type]
    assert routing.route_after_quantize_model(state) == node
    edges = {(e.source, e.target) for e in build_graph().compile().get_graph().edges}
    assert ("quantize_model", node) in edges
    assert node == "build_deployed_model" or (node, "build_deployed_model") in edges
    assert ("build_deployed_model", "evaluate_quantized") in edges


def test_a_build_that_fails_its_confirmation_gives_way_to_the_next_which_is_built_and_confirmed() -> None:
    from tools.evaluation.confirm import Confirmation, ConfirmLook, ConfirmRule, ConfirmStep

    steps = [
        ConfirmStep(backend="openvino-int8", name="openvino-int8"),
        ConfirmStep(backend="openvino", source="/o", ships="original", name="openvino (original)", tested=False),
    ]
    failed = Confirmation(
        rule=ConfirmRule(max_drop_points=1.0), sequence=steps, looks=[ConfirmLook(step=steps[0], passed=False)]
    )
    assert routing.route_after_confirm_deployment(typed_state({"confirmation": failed})) == "build_deployed_model"
    done = failed.model_copy(update={"looks": [*failed.looks, ConfirmLook(step=steps[1], passed=True)]})
    assert routing.route_after_confirm_deployment(typed_state({"confirmation": done})) == "measure_latencies"
    passed = failed.model_copy(update={"looks": [ConfirmLook(step=steps[0], passed=True)]})
    assert routing.route_after_confirm_deployment(typed_state({"confirmation": passed})) == "measure_latencies"
    edges = {(e.source, e.target) for e in build_graph().compile().get_graph().edges}
    assert {("evaluate_quantized", "confirm_deployment"), ("confirm_deployment", "build_deployed_model")} <= edges
