"""One process per run dir: a second run/resume is refused at once with the holder's PID and changes nothing;
the lock dies with its holder (SIGKILL included); ``status`` works while the lock is held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graph import Context
from graph.cli import main
from graph.runner import RunError, resume_run, start_run
from tests.helpers import save_tiny, tiny_vit
from tools.store.lock import LOCK_FILE, RunDirBusy, RunDirLockError, is_locked, lock_holder, run_dir_lock

REPO = Path(__file__).resolve().parents[1]
#: Takes the lock on argv[1], says so, and sleeps until killed.
HOLDER = (
    "import sys, time\n"
    "from tools.store.lock import run_dir_lock\n"
    "with run_dir_lock(sys.argv[1]):\n"
    "    print('locked', flush=True)\n"
    "    time.sleep(300)\n"
)
FAST = ["--iterations", "0", "--eval-samples", "20", "--no-sensitivity", "--no-quantize", "--no-progress"]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A live process holding the lock of ``tmp_path / 'run'`` (killed with SIGKILL at the end)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def paused_run(tmp_path: Path) -> Path:
    """A real run in ``tmp_path / 'run'``, paused for approval after analysis."""
    model = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    argv = ["run", "--model", str(model), "--dataset", "digits", "--run-dir", str(run_dir), "--approve-plan", *FAST]
    assert main(argv) == 0
    assert not (run_dir / LOCK_FILE).exists(), "the lock file goes with its holder"
    return run_dir


def _files(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_second_process_is_refused_status_works_and_sigkill_frees_the_dir(
    paused_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = paused_run
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        before = _files(run_dir)
        for argv in (["resume", "--run-dir", str(run_dir), "--approve"], ["resume", "--run-dir", str(run_dir)]):
            message = _error(capsys, *argv)
            assert f"process {proc.pid}" in message and str(run_dir) in message
        message = _error(capsys, "run", "--model", "digits-vit", "--dataset", "digits", "--run-dir", str(run_dir))
        assert f"process {proc.pid}" in message
        assert _files(run_dir) == before, "a refused process changes nothing in the run dir"

        assert main(["status", "--run-dir", str(run_dir)]) == 0, "status is read-only: it works while locked"
        status = json.loads(capsys.readouterr().out)
        assert status["running"] and status["running_pid"] == proc.pid
        assert status["paused_for_approval"] and "analyze_profile" in status["steps"]
        after = {name: stat for name, stat in _files(run_dir).items() if not name.endswith(("-wal", "-shm"))}
        assert after == before, "status writes nothing (SQLite may add its empty shared-memory files)"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (run_dir / LOCK_FILE).exists() and not is_locked(run_dir), "a killed holder leaves a file, not a lock"
    assert main(["resume", "--run-dir", str(run_dir), "--approve"]) == 0, "after kill -9 the dir is free again"
    assert (run_dir / "report.json").exists()
    assert not (run_dir / LOCK_FILE).exists()
    capsys.readouterr()
    assert main(["status", "--run-dir", str(run_dir)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["finished"] and not status["running"] and status["running_pid"] is None


def test_demo_bench_and_compare_refuse_a_held_dir(
    holder: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert f"process {holder.pid}" in _error(capsys, "demo", "--run-dir", str(run_dir), "--no-progress")
    bench = ["bench", "--model", "digits-vit", "--dataset", "digits", "--out", str(run_dir)]
    assert f"process {holder.pid}" in _error(capsys, *bench)
    compare = ["compare-llms", "--model", "digits-vit", "--llm", "a", "--out", str(run_dir)]
    assert f"process {holder.pid}" in _error(capsys, *compare)
    assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE]


def test_lock_is_reentrant_cleans_up_and_reports_its_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "new" / "run"
    with run_dir_lock(run_dir) as lock_file:
        assert lock_file == run_dir.resolve() / LOCK_FILE
        assert lock_holder(run_dir)["pid"] == os.getpid() and is_locked(run_dir)
        with run_dir_lock(run_dir):  # the same process again: no deadlock, no second lock
            pass
        assert lock_file.exists(), "the inner block leaves the outer one's lock in place"
    assert not lock_file.exists() and not is_locked(run_dir)
    absent = tmp_path / "absent"
    with pytest.raises(RunDirLockError, match="cannot write to run dir"), run_dir_lock(absent, create=False):
        pass
    assert not absent.exists()


def test_busy_error_names_the_holder(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    with pytest.raises(RunDirBusy) as caught, run_dir_lock(tmp_path / "run"):
        pass
    assert caught.value.pid == holder.pid
    assert f"kill {holder.pid}" in str(caught.value) and "\n" not in str(caught.value)


def test_a_moved_run_dir_is_not_resumed_elsewhere(tmp_path: Path) -> None:
    started_in, moved = tmp_path / "started", tmp_path / "moved"
    moved.mkdir()
    settings = {"thread_id": "t", "input": {"model": "m"}, "context": Context(run_dir=str(started_in)).to_dict()}
    (moved / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(RunError, match="cannot be moved"):
        resume_run(moved)
    assert not started_in.exists(), "nothing is written to the old place"
    assert [p.name for p in moved.iterdir()] == ["settings.json"]


def test_the_runner_takes_the_lock_itself(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(RunDirBusy, match=f"process {holder.pid}"):
        start_run("digits-vit", dataset="digits", ctx=Context(run_dir=str(run_dir)))
    assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE], "nothing was written"
