"""A full run on the bundled digits ViT with a holdout: the data split, paired rounds and the holdout in the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graph.cli import _summary
from tests.helpers import digits_vit_report
from tools.evaluation.paired import predictions_path

#: A budget every round meets, so that the kept model is a pruned one and its holdout figures are paired.
BUDGET_POINTS = 50.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return digits_vit_report(
        tmp_path_factory.mktemp("holdout") / "run",
        iterations=1,
        eval_samples=120,
        calibration_samples=64,
        holdout_samples=150,
        max_accuracy_drop=BUDGET_POINTS,
        batch_size=60,
    )


def test_report_states_the_data_split(report: dict[str, Any]) -> None:
    dataset = report["dataset"]
    assert dataset["calibration_samples"] == 64
    assert dataset["evaluation_samples"] == 120
    assert dataset["holdout_samples"] == 150
    assert dataset["parts_disjoint"] is True
    assert report["baseline"]["samples"] == 120 and report["baseline"]["paired"] is None


def test_every_round_is_paired_with_the_original(report: dict[str, Any]) -> None:
    base = report["baseline"]["accuracy"]
    for r in report["rounds"]:
        paired = r["metrics"]["paired"]
        assert paired["samples"] == 120
        assert paired["delta_points"] == pytest.approx(-r["accuracy_drop_points"], abs=1e-3)
        assert paired["delta_points"] == pytest.approx(100 * (r["metrics"]["accuracy"] - base), abs=1e-3)
        assert paired["ci95_low_points"] <= paired["delta_points"] <= paired["ci95_high_points"]
        assert 0.0 <= paired["agreement"] <= 1.0
        half = (paired["ci95_high_points"] - paired["ci95_low_points"]) / 2
        assert r["within_budget"] == (-paired["delta_points"] + half / 1.96 <= BUDGET_POINTS + 1e-9)


def test_the_chosen_model_is_evaluated_again_on_the_holdout(report: dict[str, Any]) -> None:
    pruned, holdout = report["pruned"], report["pruned"]["holdout"]
    assert holdout["part"] == "holdout" and holdout["samples"] == 150
    # the budget is wide (every round within it, the search grows 4x): the kept model is far from chance all the same
    assert holdout["baseline_accuracy"] > 0.8 and holdout["accuracy"] > 0.5
    assert pruned["round"] is not None, f"a round within a {BUDGET_POINTS}-point budget is kept"
    assert holdout["paired"]["samples"] == 150
    assert holdout["paired"]["delta_points"] == pytest.approx(-holdout["accuracy_drop_points"], abs=1e-3)
    artifact = Path(pruned["artifact"])
    kept = next(r for r in report["rounds"] if r["round"] == pruned["round"])
    part = f"evaluation-half{kept['cross_fit']['judged_on_half']}" if kept.get("cross_fit") else "evaluation"
    evaluation = json.loads(predictions_path(artifact, part).read_text())["key"]["indices"]
    held = json.loads(predictions_path(artifact, "holdout").read_text())["key"]["indices"]
    assert len(held) == 150 and not set(evaluation) & set(held), "selection never saw a holdout image"


def test_reports_show_intervals_split_and_holdout(report: dict[str, Any]) -> None:
    run_dir = Path(report["settings"]["run_dir"])
    md = (run_dir / "report.md").read_text()
    assert "Δacc (pts, 95 % CI)" in md and "agreement" in md
    assert "data split: calibration 64, evaluation 120, holdout 150 images (disjoint, seeded)" in md
    assert "chosen on the evaluation subset (120 images)" in md
    assert "Holdout (150 images used by neither calibration nor selection)" in md
    page = (run_dir / "report.html").read_text()
    assert 'id="holdout"' in page and "95 % CI" in page and "data split" in page
    summary = _summary(report)
    assert "Δacc pts [95% CI]" in summary and "Holdout (150 images" in summary


def test_rounds_are_recovered_and_reload_as_evaluated(report: dict[str, Any]) -> None:
    """Every round's refitted layers are saved: ``load_compressed`` gives the predictions it was judged by."""
    import torch

    from tools import load_compressed
    from tools.evaluation.paired import ImagePredictions
    from tools.ops import EvalSpec, preprocess_of
    from tools.schemas import InputShape

    spec = EvalSpec(
        dataset="digits",
        split=report["dataset"]["split"],
        label_match=report["dataset"]["label_match"],
        samples=120,
        calibration_samples=64,
        holdout_samples=150,
        seed=0,
    )
    images = spec.part("evaluation").images
    original = Path(report["baseline"]["artifact"])
    preprocess = preprocess_of(original, InputShape.model_validate(report["model"]["input_shape"]))
    for r in [r for r in report["rounds"] if not r.get("cross_fit")]:  # a distilled round is judged on a half
        recovery = r["prune_report"]["recovery"]
        assert recovery["method"] in ("reconstruct", "bn", "none") and recovery["calibration_samples"] == 64
        assert r["prune_report"]["applied"], "every round of this run prunes something"
        consumers = [c for a in r["prune_report"]["applied"] for c in a["consumers"]]
        assert bool(recovery["reconstructed"]) == (bool(consumers) and recovery["method"] == "reconstruct"), (
            "a pruned round refits the layers consuming pruned channels (a removed block has none)"
        )
        artifact = Path(r["metrics"]["artifact"])
        stored = ImagePredictions.model_validate_json(predictions_path(artifact, "evaluation").read_text())
        with torch.inference_mode():
            logits = load_compressed(artifact)(preprocess(list(images)))
        assert getattr(logits, "logits", logits).argmax(-1).tolist() == stored.predictions
