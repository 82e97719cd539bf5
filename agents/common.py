"""What every node needs: the run's settings (with its thread count applied) and its paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from graph.context import Context, context_of
from tools.ops import set_threads
from tools.schemas import InputShape
from tools.store.run_paths import RunPaths


def settings(runtime: Runtime[Context] | None) -> Context:
    """The run's Context (a dict from the dev server is accepted too); applies the thread count."""
    ctx = context_of(runtime)
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


def unlabelled(state: dict[str, Any]) -> bool:
    """The run's dataset has no labels: each image's target is the original's answer (``LabelMatch.unlabelled``)."""
    return bool((state.get("label_match") or {}).get("unlabelled"))


def budget_points(state: dict[str, Any], ctx: Context) -> float:
    """The whole budget the run's candidates are tested against, in points of its measure: ``--max-accuracy-drop``;
    on an unlabelled dataset, whose "accuracy" is the agreement with the original, ``--max-disagreement`` (else
    ``--max-accuracy-drop``'s value)."""
    if unlabelled(state) and ctx.max_disagreement is not None:
        return float(ctx.max_disagreement)
    return float(ctx.max_accuracy_drop)


def disagreement_budget(state: dict[str, Any], ctx: Context) -> float | None:
    """The agreement budget that must hold besides the accuracy budget (labelled data with ``--max-disagreement``);
    None where there is none, or where it is the run's budget itself (unlabelled data: :func:`budget_points`)."""
    return None if unlabelled(state) else ctx.max_disagreement


def pruning_budget(state: dict[str, Any], ctx: Context) -> float:
    """The budget the pruning rounds are held to: :func:`budget_points` less what int8 is expected to take
    (``accuracy_budget``, written by ``profile_int8``); the whole budget before that is known."""
    split = state.get("accuracy_budget") or {}
    return float(split.get("pruning_points", budget_points(state, ctx)))


def deployment_runtime(state: dict[str, Any]) -> str:
    """The runtime the original deploys to: that of its fastest build within the budget (``original_deployment``,
    written by ``profile_int8``); ``pytorch`` before it is known or where the float model itself is chosen."""
    from tools.deploy.registry import runtime_and_precision

    chosen = str((state.get("original_deployment") or {}).get("chosen") or "")
    return runtime_and_precision(chosen)[0] if chosen else "pytorch"
