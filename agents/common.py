"""What every node needs: the run's settings, its paths, and the budget rule."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from graph.context import Context
from tools.ops import set_threads
from tools.schemas import InputShape
from tools.store.artifacts import RunPaths

logger = logging.getLogger(__name__)


def settings(runtime: Runtime[Context] | None) -> Context:
    """The run's Context (a dict from the dev server is accepted too); applies the thread count."""
    raw = getattr(runtime, "context", None)
    ctx = raw if isinstance(raw, Context) else Context.from_dict(raw) if isinstance(raw, dict) else Context()
    set_threads(ctx.threads)
    return ctx


def resolve_run_dir(ctx: Context, config: RunnableConfig | None) -> Path:
    if ctx.run_dir:
        return Path(ctx.run_dir).resolve()
    thread_id = ((config or {}).get("configurable") or {}).get("thread_id") or "default"
    return (Path("runs") / str(thread_id)).resolve()


def paths(state: dict[str, Any]) -> RunPaths:
    return RunPaths(state["run_dir"])


def shape_of(state: dict[str, Any]) -> InputShape:
    return InputShape.model_validate(state["input_shape"])


def accuracy_drop_points(baseline: float | None, accuracy: float | None) -> float | None:
    if baseline is None or accuracy is None:
        return None
    return round(100.0 * (baseline - accuracy), 4)


def within_budget(drop_points: float | None, max_drop: float) -> bool:
    """A candidate is within budget unless it measurably loses more than ``max_drop`` points."""
    return drop_points is None or drop_points <= max_drop + 1e-9


def add_notes(state: dict[str, Any], *notes: str) -> list[str]:
    existing = list(state.get("notes") or [])
    return existing + [n for n in notes if n and n not in existing]
