"""Input shape resolver: (channels, height, width) from processor and config, proven by a dry run.

With ``--planner llm`` the LLM is asked first, from the model's architectural metadata; its answer is
used only if a dry forward pass proves it, otherwise the configuration-derived shape is, and the
report says which one was used and why.
"""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings
from graph.context import Context
from graph.state import State
from tools import ops
from tools.schemas import InputShape
from tools.store.run_paths import RunPaths


def _ask_llm(run: RunPaths, ctx: Context) -> tuple[InputShape | None, str]:
    """The LLM's shape if it is plausible and runs the model, else None and why not."""
    from agents.planning.llm_planner import JsonlExchangeLog, resolve_input_shape_with_llm, shape_metadata
    from agents.planning.llm_settings import llm_settings
    from tools.llm.client import make_chat_model
    from tools.store.artifacts import load_original

    llm = llm_settings(ctx)
    loaded = load_original(run.original)
    shape, exchange = resolve_input_shape_with_llm(
        make_chat_model(llm),
        shape_metadata(loaded.model, loaded.processor),
        exchange_log=JsonlExchangeLog(run.root / "llm" / "exchanges.jsonl"),
    )
    if shape is None:
        return None, "; ".join(exchange.errors) or "no usable answer"
    problem = ops.shape_problem(run.original, shape, device=ctx.device)
    if problem is not None:
        return None, f"the LLM's shape {shape.as_tuple()} failed the dry forward pass: {problem}"
    return shape, ""


def resolve_input_shape(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    data: dict[str, Any] = dict(state)
    run = paths(data)
    notes: list[str] = []
    if ctx.planner == "llm":
        shape, why = _ask_llm(run, ctx)
        if shape is not None:
            return {"input_shape": shape.model_dump()}
        notes.append(f"input shape: the LLM answer was not used ({why}); using the configuration-derived shape")
    shape = ops.resolve_input_shape(run.original, device=ctx.device)
    return {"input_shape": shape.model_dump(), "notes": notes}
