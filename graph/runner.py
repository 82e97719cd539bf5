"""Run, resume and inspect checkpointed runs: a SQLite checkpointer in the run dir, a thread id,
durability "sync" (so that a killed process loses no finished node), settings in ``settings.json``.

A run or resume holds the run dir's lock (:mod:`tools.store.lock`) from before it touches anything until
it stops, so two processes never write one run; ``status`` takes no lock and opens the checkpoints read-only.
"""

from __future__ import annotations

import contextlib
import shlex
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from pydantic import BaseModel, Field, JsonValue

from agents.common import pruning_budget
from agents.context import Context
from agents.planning.selection import kept_round
from agents.state import InputState, State, StateError, state_of
from graph.builder import build_graph
from graph.routing import rounds_wanted
from tools.store.files import atomic_write_json, atomic_write_text, read_json
from tools.store.lock import is_locked, lock_holder, run_dir_lock, status_hint
from tools.store.run_paths import RunPaths
from tools.text import first_line, slug

if TYPE_CHECKING:
    from tools.reporting.report import LlmComparison

UpdateHook = Callable[[str, dict[str, object]], None]
"""Called with each node's name and the keys it returned (records, as the node returned them)."""


class RunSettings(TypedDict):
    """What ``settings.json`` holds: the thread, the graph's input and the run's context (``Context.to_dict``)."""

    thread_id: str
    input: InputState
    context: dict[str, Any]
    command: NotRequired[str]
    """``demo`` for a run dir that ``profiling-agent demo`` may clear; absent for other runs."""


class RunStatus(TypedDict):
    """Where a run stands, as ``profiling-agent status`` prints it."""

    run_dir: str
    thread_id: str
    model: str
    finished: bool
    running: bool
    running_pid: object
    """The ``pid`` the lock file names (see :func:`~tools.store.lock.lock_holder`) while running, else None."""
    next: list[str]
    rounds_done: int
    rounds_planned: int
    best_round: dict[str, JsonValue] | None
    """The kept round's number and metrics (``Metrics`` fields), None before a round is kept."""
    paused_for_approval: bool
    steps: list[str]


class RunResult(BaseModel):
    """Where a run stopped: finished with its report, or paused for a human decision."""

    run_dir: str
    thread_id: str
    finished: bool
    report: dict[str, Any] | None = None
    pending: dict[str, Any] | None = Field(default=None, description="The interrupt's payload when paused.")


class RunError(ValueError):
    """A run that cannot be started or resumed as asked."""


def _checkpoint_error(path: Path, exc: sqlite3.Error) -> RunError:
    """One line naming the checkpoint database and what to do about it."""
    if isinstance(exc, sqlite3.OperationalError):  # locked, unreadable, disk full ...
        return RunError(f"cannot use the checkpoint database {path}: {first_line(exc)}; check the file and its folder")
    return RunError(
        f"the checkpoint database {path} is damaged ({first_line(exc)}): this run cannot be resumed or inspected; "
        "start it again with `profiling-agent run` and a new --run-dir"
    )


def _no_checkpoints() -> SqliteSaver:
    """An empty checkpointer in memory: what a read-only look at a run with no checkpoint yet sees."""
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    saver.setup()
    return saver


def _open_checkpoints(path: Path, read_only: bool) -> SqliteSaver:
    """The checkpointer on ``path`` (tables made if needed); ``read_only``: it never writes to the file."""
    if read_only and not path.is_file():
        return _no_checkpoints()
    if read_only:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), check_same_thread=False)
    saver = SqliteSaver(conn)
    try:
        saver.setup()
    except sqlite3.OperationalError as exc:
        conn.close()
        if read_only and "readonly" in str(exc):  # a database without the tables yet: no checkpoint
            return _no_checkpoints()
        raise _checkpoint_error(path, exc) from None
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        conn.close()
        raise _checkpoint_error(path, exc) from None
    return saver


@contextlib.contextmanager
def checkpointed_graph(run_dir: Path, *, read_only: bool = False) -> Iterator[Any]:
    """The compiled graph with the run dir's SQLite checkpointer; ``read_only`` for inspecting a live run."""
    path = RunPaths(run_dir).checkpoints
    saver = _open_checkpoints(path, read_only)
    try:
        yield build_graph().compile(checkpointer=saver)
    except sqlite3.DatabaseError as exc:
        raise _checkpoint_error(path, exc) from exc
    finally:
        saver.conn.close()


def _config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 200}


def _stream(graph: Any, payload: Any, thread_id: str, ctx: Context, on_update: UpdateHook | None) -> None:
    for chunk in graph.stream(payload, _config(thread_id), context=ctx, stream_mode="updates", durability="sync"):
        for node, update in chunk.items():
            if on_update is not None and not node.startswith("__"):
                on_update(node, update or {})


def check_planner(ctx: Context) -> None:
    """With --planner llm: one cheap request to the endpoint before anything starts (fails in one line)."""
    if ctx.planner != "llm":
        return
    from agents.planning.llm_settings import llm_settings
    from tools.llm.client import check_endpoint

    check_endpoint(llm_settings(ctx, timeout_s=min(ctx.llm_timeout, 10.0)))


def prepare_run_dir(run_dir: Path) -> None:
    paths = RunPaths(run_dir)
    if paths.report_json.exists():
        raise RunError(f"{run_dir} already holds a finished run: choose another --run-dir")
    if paths.settings.exists():
        raise RunError(f"{run_dir} holds an unfinished run: continue it with {resume_command(run_dir)}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise RunError(
            f"cannot write to run dir {run_dir}: {exc.strerror or exc}; choose a writable --run-dir"
        ) from exc


def start_run(
    model: str,
    *,
    dataset: str | None,
    ctx: Context,
    split: str | None = None,
    thread_id: str | None = None,
    on_update: UpdateHook | None = None,
    extra: dict[str, str] | None = None,
    model_options: dict[str, JsonValue] | None = None,
) -> RunResult:
    """Start a new checkpointed run in ``ctx.run_dir``; run it to the end or to a pause for approval."""
    started_at = time.time()  # the report's time table counts the start, before the first node
    if not ctx.run_dir:
        raise RunError("a run needs --run-dir")
    run_dir = Path(ctx.run_dir).resolve()
    check_planner(ctx)
    try:
        with run_dir_lock(run_dir, hint=status_hint(run_dir)):
            return _start_locked(
                model, run_dir, dataset, ctx, split, thread_id, on_update, extra, model_options, started_at
            )
    except BaseException:
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if empty: a start that saved nothing leaves no directory behind
        raise


def resume_command(run_dir: str | Path) -> str:
    """The command that continues the run in ``run_dir``, in backquotes, the dir quoted for the shell."""
    return f"`profiling-agent resume --run-dir {shlex.quote(str(run_dir))}`"


def _start_locked(
    model: str,
    run_dir: Path,
    dataset: str | None,
    ctx: Context,
    split: str | None,
    thread_id: str | None,
    on_update: UpdateHook | None,
    extra: dict[str, str] | None,
    model_options: dict[str, JsonValue] | None,
    started_at: float,
) -> RunResult:
    prepare_run_dir(run_dir)
    ctx = replace(ctx, run_dir=str(run_dir))
    thread_id = thread_id or uuid.uuid4().hex[:12]
    inputs: InputState = {"model": model, "dataset": dataset, "dataset_split": split}
    if model_options is not None:
        inputs["model_options"] = model_options
    settings: RunSettings = {"thread_id": thread_id, "input": inputs, "context": ctx.to_dict()}
    atomic_write_json(RunPaths(run_dir).settings, {**settings, **(extra or {})})
    try:
        with checkpointed_graph(run_dir) as graph:
            _stream(graph, {**inputs, "started_at": started_at}, thread_id, ctx, on_update)
            return _outcome(graph, run_dir, thread_id)
    except BaseException:
        if not RunPaths(run_dir).original.exists():
            _forget_run(run_dir)  # nothing was computed: leave the dir free for a corrected command
        raise


def _pending(snapshot: Any) -> dict[str, Any] | None:
    interrupts = list(getattr(snapshot, "interrupts", ()) or ())
    if not interrupts:
        interrupts = [i for task in snapshot.tasks for i in (task.interrupts or ())]
    return dict(interrupts[0].value) if interrupts else None


def _outcome(graph: Any, run_dir: Path, thread_id: str) -> RunResult:
    snapshot = graph.get_state(_config(thread_id))
    pending = _pending(snapshot)
    if pending is not None:
        return RunResult(run_dir=str(run_dir), thread_id=thread_id, finished=False, pending=pending)
    return RunResult(run_dir=str(run_dir), thread_id=thread_id, finished=True, report=finished_report(run_dir))


def _forget_run(run_dir: Path) -> None:
    paths = RunPaths(run_dir)
    for path in (paths.settings, *run_dir.glob(f"{paths.checkpoints.name}*")):
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only if empty


def load_settings(run_dir: Path) -> RunSettings:
    path = RunPaths(run_dir).settings
    if not path.is_file():
        raise RunError(f"{run_dir} holds no run (no settings.json): start one with `profiling-agent run`")
    data: RunSettings = read_json(path)
    return data


def resume_run(
    run_dir: Path,
    *,
    thread_id: str | None = None,
    on_update: UpdateHook | None = None,
    answer: dict[str, Any] | None = None,
) -> RunResult:
    """Continue an interrupted or paused run from its last checkpoint, with the settings stored in the run dir.

    ``answer`` is the human decision for a run paused for approval (see agents.review).
    """
    run_dir = run_dir.resolve()
    saved = load_settings(run_dir)  # before the lock: a dir without a run is left as it is
    started_in = Path(str(saved.get("context", {}).get("run_dir") or run_dir)).resolve()
    if started_in != run_dir:  # its settings and checkpoints name files there: it would write into that dir
        raise RunError(
            f"the run in {run_dir} was started in {started_in} (see its settings.json) and its checkpoints point "
            "there: a run dir cannot be moved or copied; resume it where it was started"
        )
    with run_dir_lock(run_dir, create=False, hint=status_hint(run_dir)):
        return _resume_locked(run_dir, saved, thread_id, on_update, answer)


def _resume_locked(
    run_dir: Path,
    saved: RunSettings,
    thread_id: str | None,
    on_update: UpdateHook | None,
    answer: dict[str, Any] | None,
) -> RunResult:
    ctx = Context.from_dict(saved["context"])
    thread_id = thread_id or saved["thread_id"]
    if not RunPaths(run_dir).report_json.exists():
        check_planner(ctx)
    with checkpointed_graph(run_dir) as graph:
        snapshot = graph.get_state(_config(thread_id))
        if snapshot.values and not snapshot.next and RunPaths(run_dir).report_json.exists():
            return _outcome(graph, run_dir, thread_id)
        pending = _pending(snapshot)
        if pending is not None and answer is None:
            return _outcome(graph, run_dir, thread_id)  # still waiting for a decision
        if answer is not None and pending is None:
            raise RunError(f"the run in {run_dir} is not waiting for a decision: resume it without one")
        payload: Any = Command(resume=answer) if answer is not None else None
        if not snapshot.values:
            payload = saved["input"]  # killed before the first checkpoint
        else:
            _checked_state(snapshot.values, run_dir)
        _stream(graph, payload, thread_id, ctx, on_update)
        return _outcome(graph, run_dir, thread_id)


def _checked_state(values: Mapping[str, object], run_dir: Path, what: str = "resumed") -> State:
    """The checkpointed values as this version's graph state; one line (a ``RunError``) where they do not fit."""
    try:
        return state_of(values)
    except StateError as exc:
        raise RunError(f"the run in {run_dir} cannot be {what}: {exc}") from None


def finished_report(run_dir: Path) -> dict[str, Any]:
    path = RunPaths(run_dir).report_json
    if not path.is_file():
        raise RunError(f"the run in {run_dir} stopped before writing its report: continue it with resume")
    data: dict[str, Any] = read_json(path)
    return data


def run_status(run_dir: Path, thread_id: str | None = None) -> RunStatus:
    """Where a run stands: finished nodes, next node, current round, best so far, the PID running it.

    Read-only and lock-free: it works while a run or resume holds the run dir.
    """
    run_dir = run_dir.resolve()
    saved = load_settings(run_dir)
    ctx = Context.from_dict(saved["context"])
    thread_id = thread_id or saved["thread_id"]
    running = is_locked(run_dir)
    with checkpointed_graph(run_dir, read_only=True) as graph:
        snapshot = graph.get_state(_config(thread_id))
        history = list(reversed(list(graph.get_state_history(_config(thread_id)))))
    # each checkpoint's `next` ran and was saved by the following checkpoint: all but the last one finished
    finished = [node for step in history[:-1] for node in step.next if not node.startswith("__")]
    state = _checked_state(snapshot.values, run_dir, "inspected") if snapshot.values else None
    rounds = state.rounds if state is not None else []
    budget = pruning_budget(state, ctx) if state is not None else float(ctx.max_accuracy_drop)
    best = kept_round(rounds, ctx.selection, budget, ctx.objective)
    return {
        "run_dir": str(run_dir),
        "thread_id": thread_id,
        "model": saved["input"]["model"],
        "finished": RunPaths(run_dir).report_json.exists(),
        "running": running,
        "running_pid": lock_holder(run_dir).get("pid") if running else None,
        "next": list(snapshot.next),
        "rounds_done": len(rounds),
        "rounds_planned": rounds_wanted(ctx) if ctx.prune else 0,
        "best_round": None if best is None else {"round": best.round, **best.metrics.model_dump()},
        "paused_for_approval": _pending(snapshot) is not None,
        "steps": finished,
    }


def compare_llms(
    model: str,
    *,
    dataset: str | None,
    llms: list[str],
    out_dir: Path,
    ctx: Context,
    split: str | None = None,
    on_update: UpdateHook | None = None,
) -> LlmComparison:
    """The paper's Table 5: iterative pruning planned by each LLM on the same model, data and settings.

    One run per LLM in ``out_dir/<llm>`` (resumed when it exists), then ``compare.json`` and ``compare.md``.
    """
    from tools.reporting.report import llm_comparison_rows, render_llm_comparison

    out_dir = out_dir.resolve()
    reports: dict[str, dict[str, Any]] = {}
    for name in llms:
        run_dir = out_dir / slug(name, default="llm")
        run_ctx = replace(ctx, run_dir=str(run_dir), planner="llm", llm_model=name, quantize=False)
        if RunPaths(run_dir).report_json.exists():
            reports[name] = finished_report(run_dir)
            continue
        if RunPaths(run_dir).settings.exists():
            result = resume_run(run_dir, on_update=on_update)
        else:
            result = start_run(model, dataset=dataset, split=split, ctx=run_ctx, on_update=on_update)
        if result.report is None:
            raise RunError(f"the run of {name} in {run_dir} is paused for approval: resume it, then compare again")
        reports[name] = result.report
    table: LlmComparison = {"model": model, "dataset": dataset, "rows": llm_comparison_rows(reports)}
    atomic_write_json(out_dir / "compare.json", table)
    atomic_write_text(out_dir / "compare.md", render_llm_comparison(table))
    return table
