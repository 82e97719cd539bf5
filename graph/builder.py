"""build_graph(): the ProfilingAgent state machine, not compiled.

acquire → resolve shape → profile → evaluate baseline → profile int8 (per-block damage, the budget's split)
→ profile sensitivity → analyze → prune → evaluate
→ (iterate → prune → evaluate)×T → (distill an over-budget round, cross-fitted)×R → select best → quantize (every
candidate built, judged, timed; one choice) → [adopt the second student | a round with more headroom | the
original] → build the deployed model → evaluate quantized → confirm it on the confirm part (a failure: the next build
of the declared sequence is built, evaluated and confirmed) → measure latencies (interleaved) → report
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from langgraph.graph import END, START, StateGraph

from agents.acquisition import acquire_model
from agents.analysis import analyze_profile
from agents.confirmation import confirm_deployment
from agents.context import Context
from agents.distillation import distill_over_budget_round
from agents.evaluation import evaluate_baseline, evaluate_model, evaluate_quantized, measure_latencies
from agents.input_shape import resolve_input_shape
from agents.int8 import profile_int8
from agents.iterative import iterate_pruning, select_best_model
from agents.profiler import profile_model, profile_sensitivity
from agents.pruning import prune_model
from agents.quantization import (
    adopt_headroom_round,
    adopt_original,
    adopt_second_student,
    build_deployed_model,
    quantize_model,
)
from agents.report import write_report
from agents.review import review_plan
from agents.state import InputState, OutputState, State, as_json
from graph.routing import (
    route_after_analyze_profile,
    route_after_confirm_deployment,
    route_after_distill_over_budget_round,
    route_after_evaluate_model,
    route_after_iterate_pruning,
    route_after_quantize_model,
    route_after_review_plan,
    route_after_select_best_model,
)
from tools.clock import ledger
from tools.schemas import NodeTime

NODES: dict[str, Callable[..., Any]] = {
    "acquire_model": acquire_model,
    "resolve_input_shape": resolve_input_shape,
    "profile_model": profile_model,
    "evaluate_baseline": evaluate_baseline,
    "profile_int8": profile_int8,
    "profile_sensitivity": profile_sensitivity,
    "analyze_profile": analyze_profile,
    "review_plan": review_plan,
    "prune_model": prune_model,
    "evaluate_model": evaluate_model,
    "iterate_pruning": iterate_pruning,
    "distill_over_budget_round": distill_over_budget_round,
    "select_best_model": select_best_model,
    "quantize_model": quantize_model,
    "adopt_second_student": adopt_second_student,
    "adopt_headroom_round": adopt_headroom_round,
    "adopt_original": adopt_original,
    "build_deployed_model": build_deployed_model,
    "evaluate_quantized": evaluate_quantized,
    "confirm_deployment": confirm_deployment,
    "measure_latencies": measure_latencies,
    "write_report": write_report,
}


def updating_with_json(node: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """``node`` as the graph runs it: its update with every record as its JSON form (:func:`agents.state.as_json`), so
    that the checkpoint's pending writes, which a history read (``get_state_history``, a fork) deserializes, hold no
    project type that LangGraph's serializer would have to allow (it warns of each today, and will refuse them).
    LangGraph reads the node's signature and type hints through ``functools.wraps``; called directly, in the node
    tests, a node still returns its records. The graph adds the node's time to ``time_spent``: its seconds, and those
    of each kind of work inside it (:mod:`tools.clock`)."""

    @functools.wraps(node)
    def run(*args: Any, **kwargs: Any) -> Any:
        started, start = time.time(), time.perf_counter()
        with ledger() as spent:
            update = node(*args, **kwargs)
        took = NodeTime(node=name or node.__name__, started_at=started, seconds=time.perf_counter() - start, work=spent)
        return as_json({**(update or {}), "time_spent": [took]})

    return run


def build_graph() -> StateGraph[Any, Any, Any, Any]:
    builder = StateGraph(State, context_schema=Context, input_schema=InputState, output_schema=OutputState)
    for name, node in NODES.items():
        builder.add_node(name, updating_with_json(node, name))  # type: ignore[call-overload]
    builder.add_edge(START, "acquire_model")
    builder.add_edge("acquire_model", "resolve_input_shape")
    builder.add_edge("resolve_input_shape", "profile_model")
    builder.add_edge("profile_model", "evaluate_baseline")
    builder.add_edge("evaluate_baseline", "profile_int8")
    builder.add_edge("profile_int8", "profile_sensitivity")
    builder.add_edge("profile_sensitivity", "analyze_profile")
    builder.add_conditional_edges("analyze_profile", route_after_analyze_profile)
    builder.add_edge("prune_model", "evaluate_model")
    builder.add_conditional_edges("evaluate_model", route_after_evaluate_model)
    builder.add_conditional_edges("review_plan", route_after_review_plan)
    builder.add_conditional_edges("iterate_pruning", route_after_iterate_pruning)
    builder.add_conditional_edges("distill_over_budget_round", route_after_distill_over_budget_round)
    builder.add_conditional_edges("select_best_model", route_after_select_best_model)
    builder.add_conditional_edges("quantize_model", route_after_quantize_model)
    for adopt in ("adopt_second_student", "adopt_headroom_round", "adopt_original"):
        builder.add_edge(adopt, "build_deployed_model")
    builder.add_edge("build_deployed_model", "evaluate_quantized")
    builder.add_edge("evaluate_quantized", "confirm_deployment")
    builder.add_conditional_edges("confirm_deployment", route_after_confirm_deployment)
    builder.add_edge("measure_latencies", "write_report")
    builder.add_edge("write_report", END)
    return builder
