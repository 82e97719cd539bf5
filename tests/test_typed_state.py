"""The graph state says what it holds: its fields are the project's records, nodes receive them validated, the
checkpoints keep their plain JSON form (so a checkpoint written before the state was typed still resumes), and one
that does not fit stops in one line."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agents.state import State, StateError, state_of
from graph import Context
from graph.runner import RunError, _checked_state, checkpointed_graph, resume_run, start_run
from tests.helpers import save_tiny, tiny_vit
from tools.schemas import (
    BaselineEntry,
    DeployedEntry,
    Metrics,
    ModelInfo,
    PlanResult,
    PrunedEntry,
    RoundResult,
    RuntimeReference,
)


def _loose_dicts(hint: Any) -> list[Any]:
    """Every ``dict[str, Any]`` (or bare ``dict``) inside a type hint."""
    found = []
    if hint is dict or (typing.get_origin(hint) is dict and typing.get_args(hint)[1:] == (Any,)):
        found.append(hint)
    for arg in typing.get_args(hint):
        found += _loose_dicts(arg)
    return found


def test_every_field_of_the_graph_state_is_typed_not_a_loose_dict() -> None:
    hints = typing.get_type_hints(State)
    assert {name: _loose_dicts(hint) for name, hint in hints.items() if _loose_dicts(hint)} == {}
    assert hints["rounds"] == list[RoundResult]
    assert hints["baseline"] == BaselineEntry | None and hints["plan"] == PlanResult | None
    assert hints["model_info"] == ModelInfo | None


#: A finished run's state as the version before the typed state wrote it (each node returned ``model_dump()`` or
#: a hand-built dict): what its checkpoints hold.
OLD_STATE: dict[str, Any] = {
    "model": "/models/vit",
    "dataset": "digits",
    "dataset_split": None,
    "run_dir": "/runs/old",
    "model_info": {
        "spec": "/models/vit",
        "source": "local",
        "family": "vit",
        "model_class": "ViTForImageClassification",
        "untrained": False,
        "num_labels": 10,
        "params": 50000,
        "artifact": "/runs/old/models/original",
    },
    "input_shape": {"channels": 3, "height": 16, "width": 16, "source": "config"},
    "profile_path": "/runs/old/profile/profile.json",
    "profile_summary": {
        "total_params": 50000,
        "total_macs": 900000,
        "latency_s": 0.001,
        "peak_memory_mb": 1.5,
        "trace_path": None,
        "top_groups": [{"pattern": "^vit\\.encoder$", "latency_share": 0.5, "macs_share": 0.6}],
        "sensitivity": {"units": 4, "samples": 64, "seconds": 1.2},
    },
    "label_match": {"mapping": {"0": 0, "1": 1}, "unmatched": [], "matched_names": {}, "match_kinds": {}},
    "baseline": {
        "accuracy": 0.9,
        "params": 50000,
        "latency_s": 0.001,
        "memory_mb": 0.2,
        "artifact": "/runs/old/models/original",
        "samples": 40,
        "data_parts": {"calibration": 64, "evaluation": 40, "confirm": 0, "total": 1797, "unreadable": 0},
        "at_chance": False,
        "latency_measured": "interleaved",
    },
    "int8_profile": None,
    "accuracy_budget": {"total_points": 1.0, "int8_reserve_points": 0.2, "pruning_points": 0.8, "why": "split"},
    "plan": {"plan": {"pruning_recommendations": []}, "source": "rules", "planner_state": {"level": 0.1}},
    "next_plan": {"plan": {}, "source": "rules", "planner_state": {}},
    "pending_round": None,
    "rounds": [
        {
            "round": 0,
            "plan": {"pruning_recommendations": [], "quantization_recommendations": []},
            "source": "rules",
            "planner_state": {"level": 0.1},
            "prune_report": {"applied": [], "skipped": []},
            "metrics": {"accuracy": 0.89, "params": 40000, "latency_s": 0.0009, "memory_mb": 0.16, "artifact": "r0"},
            "accuracy_drop_points": 1.0,
            "within_budget": False,
        }
    ],
    "pruned": {
        "accuracy": 0.9,
        "params": 50000,
        "latency_s": 0.001,
        "memory_mb": 0.2,
        "artifact": "/runs/old/models/original",
        "round": None,
        "within_budget": False,
        "accuracy_drop_points": 0.0,
        "at_chance": False,
    },
    "quantized": {
        "artifact": "/runs/old/models/quantized",
        "source": "/runs/old/models/original",
        "backend": "torch-ao-dynamic",
        "runtime": "pytorch",
        "precision": "int8",
        "accuracy": 0.88,
        "params": 50000,
        "latency_s": 0.0008,
        "memory_mb": 0.07,
        "accuracy_drop_points": 2.0,
    },
    "quantized_original": None,
    "runtime_fp32_original": {"artifact": "/runs/old/models/original", "backend": "torch"},
    "review": {"stage": "analysis", "round": 0, "action": "approve"},
    "report_path": "/runs/old/report.json",
    "summary": {"baseline": None, "pruned": None, "quantized": None, "quantized_original": None},
    "notes": ["a note"],
}


def test_a_state_written_before_the_state_was_typed_validates_into_records() -> None:
    state = state_of(OLD_STATE)
    assert isinstance(state.baseline, BaselineEntry) and state.baseline.data_parts["evaluation"] == 40
    assert state.rounds[0].metrics.params == 40000 and state.rounds[0].plan.pruning_recommendations == []
    assert isinstance(state.pruned, PrunedEntry) and state.pruned.round is None
    assert state.pruned.model_extra == {"at_chance": False}  # what the old entry carried besides is kept
    assert isinstance(state.quantized, DeployedEntry) and state.quantized.backend == "torch-ao-dynamic"
    assert state.runtime_fp32_original == RuntimeReference(artifact="/runs/old/models/original", backend="torch")
    assert state.label_match is not None and state.label_match.mapping == {0: 0, 1: 1}
    assert state.review is not None and state.review.action == "approve"
    # and a node's record written back is the same JSON again (a resumed run's checkpoints stay plain)
    assert state_of(state.model_dump()) == state


def test_a_checkpoint_that_does_not_fit_stops_in_one_line_naming_the_field() -> None:
    broken = {**OLD_STATE, "rounds": [{"round": 0, "metrics": {"params": "many"}}]}
    with pytest.raises(StateError) as caught:
        state_of(broken)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the checkpoint's rounds.0.")
    assert "new --run-dir" in message
    with pytest.raises(RunError, match=r"^the run in /runs/old cannot be resumed: the checkpoint's rounds\.0\."):
        _checked_state(broken, Path("/runs/old"))


def _project_objects(value: Any) -> list[str]:
    """The type names of every pydantic object inside a checkpointed value (none: plain JSON)."""
    if isinstance(value, BaseModel):
        return [type(value).__name__]
    if isinstance(value, dict):
        return [name for v in value.values() for name in _project_objects(v)]
    if isinstance(value, list | tuple):
        return [name for v in value for name in _project_objects(v)]
    return []


#: A project module's name as msgpack packs a short string (the first byte 0xa0 + its length): how the serializer
#: names the module of an object it packs by module and class.
_PACKED_MODULE = re.compile(rb"([\xa0-\xbf])((?:tools|graph)\.[A-Za-z0-9_.]+)")


def _packed_modules(blob: bytes) -> list[str]:
    """The project modules named, as whole short strings, in the msgpack ``blob``."""
    return [m[2].decode() for m in _PACKED_MODULE.finditer(blob) if m[1][0] - 0xA0 == len(m[2])]


def test_a_tiny_run_checkpoints_plain_json_and_its_nodes_read_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    ctx = Context(
        run_dir=str(run_dir),
        iterations=1,
        eval_samples=40,
        batch_size=20,
        latency_repeats=2,
        progress=False,
        quant_backend="torch-ao-dynamic",
        max_accuracy_drop=100.0,
    )
    result = start_run(str(model), dataset="digits", ctx=ctx)
    assert result.finished and result.report is not None
    thread = json.loads((run_dir / "settings.json").read_text())["thread_id"]
    with caplog.at_level(logging.WARNING), checkpointed_graph(run_dir, read_only=True) as graph:
        values = graph.get_state({"configurable": {"thread_id": thread}}).values
        history = list(graph.get_state_history({"configurable": {"thread_id": thread}}))
    assert not [r for r in caplog.records if "unregistered" in r.getMessage()]
    assert _project_objects(values) == []  # the SqliteSaver's JSON serializer never sees a project type
    assert len(history) > 10 and all(_project_objects(h.values) == [] for h in history)
    with sqlite3.connect(run_dir / "checkpoints.sqlite") as db:  # nor do the pending writes a history read unpacks
        blobs = [bytes(v) for t, v in db.execute("SELECT type, value FROM writes") if t == "msgpack"]
    assert blobs and [m for b in blobs for m in _packed_modules(b)] == []
    state = state_of(values)
    assert len(state.rounds) == 2 and all(isinstance(r, RoundResult) for r in state.rounds)
    assert isinstance(state.baseline, BaselineEntry) and state.baseline.latency_measured == "interleaved"
    assert isinstance(state.quantized, DeployedEntry) and state.quantized.backend == "torch-ao-dynamic"
    assert state.summary is not None and state.summary.baseline is not None
    assert state.report_path == str(run_dir / "report.json")
    assert state.summary.baseline.params == result.report["baseline"]["params"]


def _as_old_version_wrote(values: dict[str, Any]) -> dict[str, Any]:
    """Checkpointed values as the version before the typed state wrote them: the baseline as the metrics plus the
    data's parts (no entry fields), the profile summary without a sensitivity key (none measured)."""
    old = dict(values)
    metrics = set(Metrics.model_fields)
    old["baseline"] = {k: v for k, v in values["baseline"].items() if k in metrics | {"data_parts", "at_chance"}}
    old["profile_summary"] = {k: v for k, v in values["profile_summary"].items() if v is not None}
    return old


def test_a_run_paused_by_the_previous_version_resumes_to_its_report(tmp_path: Path) -> None:
    """A run paused for approval, its checkpoint rewritten as the previous version left it, resumes and finishes."""
    model = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    ctx = Context(
        run_dir=str(run_dir),
        iterations=0,
        eval_samples=30,
        latency_repeats=2,
        progress=False,
        approve_plan=True,
        quantize=False,
        max_accuracy_drop=100.0,
    )
    paused = start_run(str(model), dataset="digits", ctx=ctx)
    assert not paused.finished and paused.pending is not None
    thread = json.loads((run_dir / "settings.json").read_text())["thread_id"]
    with checkpointed_graph(run_dir) as graph:
        saver = graph.checkpointer
        latest = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        checkpoint = latest.checkpoint
        old = _as_old_version_wrote(checkpoint["channel_values"])
        assert old["baseline"] != checkpoint["channel_values"]["baseline"]  # the test does change the shape
        checkpoint["channel_values"] = old
        saver.put(latest.config, checkpoint, latest.metadata, {})  # the same checkpoint, as the old version wrote it
    with checkpointed_graph(run_dir, read_only=True) as graph:
        assert graph.get_state({"configurable": {"thread_id": thread}}).values["baseline"] == old["baseline"]
    done = resume_run(run_dir, answer={"action": "approve"})
    assert done.finished and done.report is not None and len(done.report["rounds"]) == 1
    assert done.report["baseline"]["params"] == old["baseline"]["params"]
