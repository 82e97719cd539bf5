"""Input shape resolver: (channels, height, width) from processor and config, proven by a dry run."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings
from graph.context import Context
from graph.state import State
from tools import ops


def resolve_input_shape(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    shape = ops.resolve_input_shape(paths(dict(state)).original, device=ctx.device)
    return {"input_shape": shape.model_dump()}
