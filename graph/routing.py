"""Routers: pure functions of state and settings, tested directly."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from agents.common import settings
from graph.context import Context
from graph.state import State


def after_pruning_stage(ctx: Context) -> Literal["quantize_model", "measure_latencies"]:
    return "quantize_model" if ctx.quantize else "measure_latencies"


def route_after_analyze_profile(
    state: State, runtime: Runtime[Context]
) -> Literal["prune_model", "quantize_model", "measure_latencies"]:
    ctx = settings(runtime)
    return "prune_model" if ctx.prune else after_pruning_stage(ctx)


def rounds_wanted(ctx: Context) -> int:
    """The first candidate (from the analysis plan) plus T iterative rounds."""
    return 1 + (ctx.iterations if ctx.iterate else 0)


def route_after_evaluate_model(
    state: State, runtime: Runtime[Context]
) -> Literal["iterate_pruning", "select_best_model"]:
    ctx = settings(runtime)
    done = len(state.get("rounds") or [])
    return "iterate_pruning" if done < rounds_wanted(ctx) else "select_best_model"


def route_after_select_best_model(
    state: State, runtime: Runtime[Context]
) -> Literal["quantize_model", "measure_latencies"]:
    return after_pruning_stage(settings(runtime))
