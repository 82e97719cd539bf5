"""Checkpointed runs: a run killed part-way (SIGKILL) or stopped by a fault resumes to the same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from graph import Context
from graph.runner import RunError, checkpointed_graph, resume_run, run_status, start_run
from tests.helpers import save_tiny, tiny_vit
from tools.stages import ops
from tools.store.lock import RunDirBusy

SETTINGS = ["--iterations", "3", "--eval-samples", "300", "--batch-size", "20", "--no-progress"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "graph.cli", *args]


def _checkpointed_rounds(run_dir: Path) -> list[dict[str, Any]]:
    thread = json.loads((run_dir / "settings.json").read_text())["thread_id"]
    with checkpointed_graph(run_dir) as graph:
        values = graph.get_state({"configurable": {"thread_id": thread}}).values
    return list(values.get("rounds") or [])


def test_sigkill_mid_round_then_resume_finishes_without_recomputing(model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PROFILING_AGENT_LATENCY_REPEATS": "3"}
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        _cli("run", "--model", str(model_dir), "--dataset", "digits", "--run-dir", str(run_dir), *SETTINGS),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = run_dir / "rounds" / "round-02" / "model" / "artifact.json"  # round 2 pruned, being evaluated
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    with pytest.raises(RunDirBusy, match=f"in use by process {proc.pid}\\b"):
        resume_run(run_dir)  # a second process on a live run is refused at once
    assert run_status(run_dir)["running_pid"] == proc.pid, "status works while the run holds its dir"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "report.json").exists()
    before = _checkpointed_rounds(run_dir)
    status = run_status(run_dir)
    assert not status["finished"] and status["rounds_done"] == len(before) >= 2
    assert not status["running"], "the lock died with the killed run"
    first_round = run_dir / "rounds" / "round-00" / "model" / "model.safetensors"
    mtime = first_round.stat().st_mtime_ns

    done = subprocess.run(_cli("resume", "--run-dir", str(run_dir)), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert len(report["rounds"]) == 4
    for old, new in zip(before, report["rounds"], strict=False):
        assert new["metrics"] == old["metrics"], "a round evaluated before the kill is not evaluated again"
        assert new["plan"] == old["plan"]
    assert first_round.stat().st_mtime_ns == mtime, "a finished round's files are not rewritten"
    assert run_status(run_dir)["finished"]


def test_fault_in_a_node_keeps_work_and_resumes(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agents.quantization

    evaluated: list[str] = []
    real_deploy, real_evaluate = agents.quantization.deploy, ops.evaluate

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk full")

    def counting(*args: Any, **kwargs: Any) -> Any:
        evaluated.append(str(kwargs.get("desc", args[4] if len(args) > 4 else "")))
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(agents.quantization, "deploy", broken)
    monkeypatch.setattr(ops, "evaluate", counting)
    ctx = Context(run_dir=str(tmp_path / "run"), iterations=1, eval_samples=30, latency_repeats=2, progress=False)
    with pytest.raises(RuntimeError, match="disk full"):
        start_run(str(model_dir), dataset="digits", ctx=ctx)
    # the original's runtimes are evaluated before pruning ("deploy <backend>"), for the budget's int8 share
    assert [d for d in evaluated if not d.startswith("deploy ")] == ["baseline", "round 0", "round 1"]
    done_before = len(evaluated)
    monkeypatch.setattr(agents.quantization, "deploy", real_deploy)
    report = resume_run(tmp_path / "run").report
    assert report is not None
    after = evaluated[done_before:]
    assert after and not {"baseline", "round 0", "round 1"} & set(after), "finished work is not redone"
    assert all(d.startswith("deploy ") or d.startswith("quantized") for d in after), after
    assert len(report["rounds"]) == 2 and report["quantized"] is not None


def test_resume_of_a_dir_without_a_run(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="holds no run"):
        resume_run(tmp_path)
