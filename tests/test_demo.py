"""`profiling-agent demo`: the whole graph offline on the bundled digits ViT and real digits data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph.cli import main
from tools.models.builtin import DEMO_MODELS


@pytest.mark.slow
def test_demo_meets_its_promises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (DEMO_MODELS["digits-vit"] / "model.safetensors").is_file():
        pytest.fail("the demo model is missing: run scripts/train_demo_models.py")
    run_dir = tmp_path / "demo"
    assert main(["demo", "--run-dir", str(run_dir), "--no-progress"]) == 0
    assert [p.name for p in run_dir.glob("**/report.json")] == ["report.json"]
    report = json.loads((run_dir / "report.json").read_text())
    assert (run_dir / "report.md").is_file()
    base, pruned, quantized = report["baseline"], report["pruned"], report["quantized"]
    assert base["accuracy"] > 0.9
    assert pruned["params"] < base["params"]
    assert pruned["within_budget"] and 100 * (base["accuracy"] - pruned["accuracy"]) <= 1.0
    assert quantized["memory_mb"] < 0.5 * base["memory_mb"]
    # the analysis plan and 5 iterative rounds, then distillations after the search (and rounds planned from them)
    assert [r["cross_fit"] for r in report["rounds"][:6]] == [None] * 6
    searched = {r["round"] for r in report["rounds"] if not r["cross_fit"]}
    assert all(r["cross_fit"]["source_round"] in searched for r in report["rounds"] if r["cross_fit"])
    assert main(["demo", "--run-dir", str(run_dir), "--no-progress", "--no-prune", "--no-quantize"]) == 0, "reruns"
    capsys.readouterr()
