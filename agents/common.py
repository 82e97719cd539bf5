"""What every node needs: the run's settings (with its thread count applied) and its paths."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from agents.context import Context, context_of
from agents.state import State
from tools.schemas import InputShape
from tools.stages.ops import set_threads
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


T = TypeVar("T")


def need(value: T | None, what: str) -> T:
    """A state field a node needs, written by an earlier node; a clear error where it is not there yet."""
    if value is None:
        raise ValueError(f"the graph state has no {what} yet: the node that writes it has not run")
    return value


def paths(state: State) -> RunPaths:
    return RunPaths(need(state.run_dir, "run_dir"))


def shape_of(state: State) -> InputShape:
    return need(state.input_shape, "input_shape")


def unlabelled(state: State) -> bool:
    """The run's dataset has no labels: each image's target is the original's answer (``LabelMatch.unlabelled``)."""
    return state.label_match is not None and state.label_match.unlabelled


def baseline_accuracy(state: State) -> float | None:
    """The original's accuracy (None: not meaningful, or not measured yet)."""
    return state.baseline.accuracy if state.baseline is not None else None


def budget_points(state: State, ctx: Context) -> float:
    """The whole budget the run's candidates are tested against, in points of its measure: ``--max-accuracy-drop``;
    on an unlabelled dataset, whose "accuracy" is the agreement with the original, ``--max-disagreement`` (else
    ``--max-accuracy-drop``'s value)."""
    if unlabelled(state) and ctx.max_disagreement is not None:
        return float(ctx.max_disagreement)
    return float(ctx.max_accuracy_drop)


def at_chance(state: State) -> bool:
    """The original scores at or near chance on the labelled images (``BaselineEntry.at_chance``: untrained for them,
    or labels that do not match the dataset's): a candidate's accuracy says nothing of what it costs."""
    return state.baseline is not None and state.baseline.at_chance


def disagreement_budget(state: State, ctx: Context) -> float | None:
    """The agreement budget that must hold besides the accuracy budget (labelled data with ``--max-disagreement``);
    None where there is none, or where it is the run's budget itself (unlabelled data: :func:`budget_points`).
    For an original at chance level (:func:`at_chance`) without one, ``--max-accuracy-drop``'s value: there the
    accuracy budget passes almost anything, while the share of its answers a candidate changes still measures what
    it costs (the bundled digits CNN with its labels rotated scored 0 %, and the run kept a round of 93 % fewer
    parameters that changed 9.6 % of its answers; with the agreement budget, 78 % fewer, 0.5 % changed)."""
    if unlabelled(state):
        return None
    if ctx.max_disagreement is None and at_chance(state):
        return float(ctx.max_accuracy_drop)
    return ctx.max_disagreement


def pruning_budget(state: State, ctx: Context) -> float:
    """The budget the pruning rounds are held to: :func:`budget_points` less what int8 is expected to take
    (``accuracy_budget``, written by ``profile_int8``); the whole budget before that is known."""
    split = state.accuracy_budget
    return float(split.pruning_points) if split is not None else budget_points(state, ctx)


def deployment_runtime(state: State) -> str:
    """What the latency objective times models in: the timing build that stands for the original's fastest build
    within the budget (``original_deployment``, written by ``profile_int8``; ``tools.deploy.registry.timed_in``: the
    precisions do not rank units alike, ``tools.evaluation.runtime_latency``); the float model before it is known."""
    from tools.deploy.registry import timed_in

    return timed_in(state.original_deployment.chosen if state.original_deployment is not None else "")
