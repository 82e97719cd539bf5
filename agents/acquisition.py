"""Acquisition agent: load the model from its source and save it as the run's original artifact."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from agents.common import add_notes, resolve_run_dir, settings
from graph.context import Context
from graph.state import State
from tools import ops
from tools.artifacts import RunPaths


def acquire_model(state: State, runtime: Runtime[Context], config: RunnableConfig) -> dict[str, Any]:
    ctx = settings(runtime)
    run_dir = resolve_run_dir(ctx, config)
    info = ops.acquire(state["model"], RunPaths(run_dir).original, device=ctx.device)
    if not info.untrained and not state.get("dataset"):
        raise ValueError(
            f"a dataset is needed to measure the accuracy of {info.spec!r}: pass --dataset "
            "(only the untrained built-ins may omit it)"
        )
    notes = []
    if info.untrained:
        notes.append(
            f"{info.spec} is UNTRAINED (random weights from its published configuration): accuracy is "
            "reported as null; use it for profiling, latency and memory studies only."
        )
    update: dict[str, Any] = {"run_dir": str(run_dir), "model_info": info.model_dump()}
    return update | {"notes": add_notes(dict(state), *notes)}
