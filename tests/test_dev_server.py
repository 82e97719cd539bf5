"""`langgraph dev` serves the graph; a run through its HTTP API (langgraph-sdk) completes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import save_tiny, tiny_vit

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("langgraph", path=str(Path(sys.executable).parent)) or shutil.which("langgraph")
    if exe is None:
        pytest.skip("langgraph-cli is not installed (pip install -e '.[dev]')")
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "LANGSMITH_TRACING": "false", "PROFILING_AGENT_PROGRESS": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [exe, "dev", "--no-browser", "--no-reload", "--port", str(port), "--host", "127.0.0.1"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/ok", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"langgraph dev exited: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail(f"langgraph dev did not answer: {log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_run_through_the_http_api(server: str, tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    client = get_sync_client(url=server)
    assistants = client.assistants.search(graph_id="profiling_agent")
    assert assistants, "the graph named in langgraph.json is served"
    thread = client.threads.create()
    nodes: list[str] = []
    for part in client.runs.stream(
        thread["thread_id"],
        "profiling_agent",
        input={"model": str(model_dir), "dataset": "digits"},
        context={
            "run_dir": str(run_dir),
            "iterations": 1,
            "eval_samples": 30,
            "latency_repeats": 2,
            "progress": False,
        },
        stream_mode="updates",
    ):
        if part.event == "updates" and isinstance(part.data, dict):
            nodes.extend(part.data)
        assert part.event != "error", part.data
    assert "prune_model" in nodes and "write_report" in nodes
    report = json.loads((run_dir / "report.json").read_text())
    assert len(report["rounds"]) == 2
    state = client.threads.get_state(thread["thread_id"])
    assert state["values"]["report_path"] == str(run_dir / "report.json")


def test_interrupted_thread_resumes_through_the_api(server: str, tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    context = {
        "run_dir": str(run_dir),
        "iterations": 0,
        "eval_samples": 20,
        "latency_repeats": 2,
        "progress": False,
        "approve_plan": True,
    }
    client = get_sync_client(url=server)
    thread = client.threads.create()
    client.runs.wait(
        thread["thread_id"], "profiling_agent", input={"model": str(model_dir), "dataset": "digits"}, context=context
    )
    state = client.threads.get_state(thread["thread_id"])
    assert state["next"] == ["review_plan"]
    interrupts = [i for task in state["tasks"] for i in task.get("interrupts", [])]
    assert interrupts and interrupts[0]["value"]["stage"] == "analysis"
    assert not (run_dir / "report.json").exists()
    client.runs.wait(thread["thread_id"], "profiling_agent", command={"resume": {"action": "approve"}}, context=context)
    report = json.loads((run_dir / "report.json").read_text())
    assert len(report["rounds"]) == 1
