"""Where the time went: the report's table of seconds by node and by kind of work sums to the run's wall clock."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from graph import Context
from graph.runner import start_run
from tests.helpers import save_tiny, tiny_vit
from tools.clock import ledger, work
from tools.reporting.time_table import BETWEEN, PAUSE_S, START, time_spent
from tools.schemas import NodeTime


def test_work_inside_work_counts_to_the_inner_kind() -> None:
    with ledger() as spent, work("build"):
        time.sleep(0.02)
        with work("evaluate"):
            time.sleep(0.03)
        time.sleep(0.01)
    assert spent["evaluate"] == pytest.approx(0.03, abs=0.02)
    assert spent["build"] == pytest.approx(0.03, abs=0.02)
    with work("prune"):  # no ledger open: nothing counted, nothing raised
        pass


def test_gaps_between_nodes_count_and_pauses_do_not() -> None:
    times = [
        NodeTime(node="a", started_at=100.0, seconds=10.0, work={"evaluate": 4.0}),
        NodeTime(node="b", started_at=111.0, seconds=5.0),  # 1 s between
        NodeTime(node="a", started_at=116.5, seconds=2.0, work={"evaluate": 1.0}),  # 0.5 s between
        NodeTime(node="c", started_at=118.5 + 10 * PAUSE_S, seconds=1.0),  # a pause (approval)
    ]
    spent = time_spent(times, started_at=98.0, now=times[-1].started_at + 1.5)
    assert spent is not None
    rows = {r.name: r for r in spent.rows}
    assert rows[START].seconds == pytest.approx(2.0)
    assert rows[BETWEEN].seconds == pytest.approx(1.5)
    assert rows["a"].runs == 2 and rows["a"].seconds == pytest.approx(12.0)
    assert rows["a"].work == pytest.approx({"evaluate": 5.0, "other": 7.0})
    assert rows["write_report"].seconds == pytest.approx(0.5)
    assert spent.paused_s == pytest.approx(10 * PAUSE_S)
    assert spent.total_s == pytest.approx(2.0 + 12.0 + 5.0 + 1.0 + 1.5 + 0.5)
    assert sum(spent.by_kind.values()) == pytest.approx(spent.total_s, abs=0.01)


def test_the_reports_time_table_sums_to_the_runs_wall_clock(tmp_path: Path) -> None:
    model = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    ctx = Context(
        run_dir=str(tmp_path / "run"),
        eval_samples=40,
        batch_size=20,
        iterations=1,
        latency_repeats=3,
        progress=False,
        quant_backend="torch-ao-dynamic",
        max_accuracy_drop=100.0,
    )
    start = time.perf_counter()
    start_run(str(model), dataset="digits", ctx=ctx)
    wall = time.perf_counter() - start
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    spent = report["time_spent"]
    assert abs(spent["total_s"] - wall) <= 0.05 * wall, (spent["total_s"], wall)
    names = {r["name"] for r in spent["rows"]}
    assert {"acquire_model", "prune_model", "evaluate_model", "quantize_model", "write_report"} <= names
    assert spent["by_kind"]["evaluate"] > 0 and spent["by_kind"]["prune"] > 0 and spent["by_kind"]["build"] > 0
    assert "## Where the time went" in (tmp_path / "run" / "report.md").read_text()
    assert 'id="time"' in (tmp_path / "run" / "report.html").read_text()
