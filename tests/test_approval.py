"""Human approval: --approve-plan pauses with interrupt() after analysis; approve, edit or reject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph import Context
from graph.runner import resume_run, start_run
from tests.helpers import save_tiny, tiny_vit

FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _start(model_dir: Path, run_dir: Path, **settings: object) -> object:
    ctx = Context(
        run_dir=str(run_dir),
        iterations=1,
        eval_samples=30,
        latency_repeats=2,
        progress=False,
        approve_plan=True,
        max_accuracy_drop=100.0,
        **settings,
    )  # type: ignore[arg-type]
    return start_run(str(model_dir), dataset="digits", ctx=ctx)


def test_approve_then_finish(model_dir: Path, tmp_path: Path) -> None:
    result = _start(model_dir, tmp_path / "run")
    assert not result.finished and result.pending["stage"] == "analysis"  # type: ignore[attr-defined]
    assert result.pending["plan"]["pruning_recommendations"]  # type: ignore[attr-defined]
    again = resume_run(tmp_path / "run")
    assert not again.finished, "without a decision the run stays paused"
    done = resume_run(tmp_path / "run", answer={"action": "approve"})
    assert done.finished and done.report is not None
    assert len(done.report["rounds"]) == 2


def test_edited_plan_is_validated_then_used(model_dir: Path, tmp_path: Path) -> None:
    _start(model_dir, tmp_path / "run", approve_rounds=True)
    bad = {"pruning_recommendations": [{"layer": "nothing", "pruning_type": "structured", "pruning_ratio": 0.2}]}
    paused = resume_run(tmp_path / "run", answer={"action": "edit", "plan": bad})
    assert not paused.finished and paused.pending["errors"]  # type: ignore[index]
    good = {
        "pruning_recommendations": [
            {"layer": FC1, "pruning_type": "structured", "pruning_ratio": 0.5, "justification": "mine"}
        ]
    }
    paused = resume_run(tmp_path / "run", answer={"action": "edit", "plan": good})
    assert not paused.finished and paused.pending["stage"] == "round"  # type: ignore[index]
    done = resume_run(tmp_path / "run", answer={"action": "reject"})
    assert done.report is not None
    assert [r["source"] for r in done.report["rounds"]] == ["human"]
    assert done.report["plan"]["source"] == "human"
    assert json.loads((tmp_path / "run" / "report.json").read_text())["pruned"]["round"] == 0


def test_rejecting_the_analysis_plan_skips_pruning(model_dir: Path, tmp_path: Path) -> None:
    _start(model_dir, tmp_path / "run")
    done = resume_run(tmp_path / "run", answer={"action": "reject"})
    assert done.report is not None and done.report["rounds"] == [] and done.report["quantized"] is not None
    assert resume_run(tmp_path / "run", answer={"action": "approve"}).finished, "a finished run stays finished"
