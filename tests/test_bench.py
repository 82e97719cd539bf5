"""`profiling-agent bench` on a tiny model: every method's row, the three tables, CSV and plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from graph.cli import main
from tests.helpers import save_tiny, tiny_vit

METHODS = {"original", "l1", "l2", "random", "agent-prune", "agent-quant", "agent-prune+quant", "onnxruntime-quant"}


def test_bench_writes_tables_and_plots(tmp_path: Path) -> None:
    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    out = tmp_path / "bench"
    argv = [
        "bench",
        "--model",
        str(model_dir),
        "--dataset",
        "digits",
        "--out",
        str(out),
        "--eval-samples",
        "30",
        "--iterations",
        "1",
        "--ratios",
        "0.1,0.3",
        "--max-accuracy-drop",
        "100",
        "--no-progress",
    ]
    assert main(argv) == 0
    bench = json.loads((out / "bench.json").read_text())
    rows = bench["models"][str(model_dir)]
    assert {r["method"] for r in rows} == METHODS
    for row in rows:
        assert set(row) >= {"accuracy", "params", "latency_s", "memory_mb"} and row["latency_s"] > 0
    l1 = {r["ratio"]: r for r in rows if r["method"] == "l1"}
    assert len(l1) == 3 and sum(r["matched"] for r in l1.values()) == 1
    assert l1[0.3]["params"] < l1[0.1]["params"]
    agent = next(r for r in rows if r["method"] == "agent-prune")
    matched = next(r for r in l1.values() if r["matched"])
    assert abs(matched["params"] - agent["params"]) <= 0.15 * agent["params"]  # 4 heads: coarse steps
    for name in ("table1", "table3", "table4"):
        assert (out / f"{name}.md").read_text().startswith("# Table")
        assert len(list(csv.reader((out / f"{name}.csv").open()))) > 1
    assert "onnxruntime-quant" in (out / "table3.md").read_text()
    assert (out / "vit-tradeoffs.png").stat().st_size > 1000
    assert main(argv) == 0, "a second bench reuses the runs"
