"""A full run on the bundled digits ViT with a confirm part: the data split as read, paired rounds, and the shipped
build judged once on images nothing chose on, with a sentinel that fails the run if any confirm image is decoded
before the confirmation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graph.cli import _summary
from tests.helpers import digits_vit_report
from tools.evaluation.paired import predictions_path

#: A budget every round meets, so that the kept model is a pruned one and its figures are paired.
BUDGET_POINTS = 50.0
#: The settings' sizes of the parts.
CALIBRATION, CHOOSE, CONFIRM = 64, 120, 150
#: The runs' settings: those parts, the budget, and the float model forced as the deployed build (fast to build).
RUN: dict[str, Any] = {
    "eval_samples": CHOOSE,
    "calibration_samples": CALIBRATION,
    "confirm_samples": CONFIRM,
    "max_accuracy_drop": BUDGET_POINTS,
    "batch_size": 60,
    "quantize": True,
    "quant_backend": "torch",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The run, with every decode of a confirm row before ``confirm_deployment`` opens the part an error."""
    import agents.confirmation as confirmation
    import tools.evaluation.datasets as datasets
    from tools.evaluation.datasets import load_eval_dataset, split_indices

    rows = load_eval_dataset("digits", samples=1).size_total  # the run's split (test): its rows, one decoded
    confirm_rows = set(
        split_indices(rows, {"calibration": CALIBRATION, "evaluation": CHOOSE, "confirm": CONFIRM}, 0)["confirm"]
    )
    opened: list[bool] = []
    decode, confirming = datasets._decode_rows, confirmation.confirming

    def sentinel(cells: list[Any], rows: list[int], root: Path | None) -> Any:
        early = confirm_rows & set(rows)
        if early and not opened:
            raise AssertionError(f"{len(early)} confirm images decoded before the confirmation")
        return decode(cells, rows, root)

    def opening() -> Any:
        opened.append(True)
        return confirming()

    patch = pytest.MonkeyPatch()
    patch.setattr(datasets, "_decode_rows", sentinel)
    patch.setattr(confirmation, "confirming", opening)
    try:
        yield digits_vit_report(tmp_path_factory.mktemp("confirm") / "run", **RUN, iterations=1)
    finally:
        patch.undo()
    assert opened, "the confirmation read the confirm part"


def test_report_states_the_data_split_as_read(report: dict[str, Any]) -> None:
    dataset = report["dataset"]
    assert dataset["calibration_samples"] == CALIBRATION
    assert dataset["evaluation_samples"] == CHOOSE
    assert dataset["confirm_samples"] == CONFIRM
    assert dataset["confirm_untouched"] is True
    reads = json.loads((Path(report["settings"]["run_dir"]) / "data_reads.json").read_text())["rows"]
    assert len(reads["confirm"]) == CONFIRM and not set(reads["confirm"]) & (set(reads["fit"]) | set(reads["choose"]))
    assert dataset["parts_disjoint"] == (not set(reads["fit"]) & set(reads["choose"]))
    assert report["baseline"]["samples"] == CHOOSE and report["baseline"]["paired"] is None


def test_every_round_is_paired_with_the_original(report: dict[str, Any]) -> None:
    base = report["baseline"]["accuracy"]
    for r in report["rounds"]:
        paired = r["metrics"]["paired"]
        if r.get("cross_fit"):
            continue
        assert paired["samples"] == CHOOSE
        assert paired["delta_points"] == pytest.approx(-r["accuracy_drop_points"], abs=1e-3)
        assert paired["delta_points"] == pytest.approx(100 * (r["metrics"]["accuracy"] - base), abs=1e-3)
        assert paired["ci95_low_points"] <= paired["delta_points"] <= paired["ci95_high_points"]
        half = (paired["ci95_high_points"] - paired["ci95_low_points"]) / 2
        assert r["within_budget"] == (-paired["delta_points"] + half / 1.96 <= BUDGET_POINTS + 1e-9)


def test_the_shipped_build_is_judged_once_on_the_confirm_images(report: dict[str, Any]) -> None:
    confirmation, quantized = report["confirmation"], report["quantized"]
    assert report["pruned"]["round"] is not None, f"a round within a {BUDGET_POINTS}-point budget is kept"
    assert confirmation["sequence"][0]["backend"] == "torch"
    assert len(confirmation["looks"]) == 1 and confirmation["looks"][0]["passed"]
    confirmed = quantized["confirmed"]
    assert confirmed["part"] == "confirm" and confirmed["samples"] == CONFIRM
    assert confirmed["paired"]["samples"] == CONFIRM and confirmed["baseline_accuracy"] > 0.8
    assert confirmed["paired"]["delta_points"] == pytest.approx(-confirmed["accuracy_drop_points"], abs=1e-3)
    artifact = Path(quantized["artifact"])
    kept = next(r for r in report["rounds"] if r["round"] == report["pruned"]["round"])
    part = f"evaluation-half{kept['cross_fit']['judged_on_half']}" if kept.get("cross_fit") else "evaluation"
    chosen_on = json.loads(predictions_path(artifact, part).read_text())["key"]["indices"]
    confirmed_on = json.loads(predictions_path(artifact, "confirm").read_text())["key"]["indices"]
    assert len(confirmed_on) == CONFIRM and not set(chosen_on) & set(confirmed_on)


def test_reports_show_the_split_and_the_confirmed_figure(report: dict[str, Any]) -> None:
    run_dir = Path(report["settings"]["run_dir"])
    md = (run_dir / "report.md").read_text()
    assert "Δacc (pts, 95 % CI)" in md and "agreement" in md
    assert (
        f"data split: fit {CALIBRATION}" in md and f"choose {CHOOSE}, confirm {CONFIRM} images (seeded; as read:" in md
    )
    assert f"- **what ships**: Confirmed on {CONFIRM} images nothing chose on: " in md
    assert "within the 50-point budget (the point estimate holds it)" in md
    page = (run_dir / "report.html").read_text()
    assert 'id="confirmed"' in page and "95 % CI" in page and "data split" in page
    summary = _summary(report)
    assert "Δacc pts [95% CI]" in summary and f"Confirmed on {CONFIRM} images" in summary


def test_rounds_are_recovered_and_reload_as_evaluated(report: dict[str, Any]) -> None:
    """Every round's refitted layers are saved: ``load_compressed`` gives the predictions it was judged by."""
    import torch

    from tools import load_compressed
    from tools.evaluation.paired import ImagePredictions
    from tools.schemas import InputShape
    from tools.stages.ops import EvalSpec, preprocess_of

    spec = EvalSpec(
        dataset="digits",
        split=report["dataset"]["split"],
        label_match=report["dataset"]["label_match"],
        samples=120,
        calibration_samples=64,
        confirm_samples=150,
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


def test_a_build_that_fails_its_confirmation_gives_way_to_the_original_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph's loop: the shipped build fails on the confirm images (a rule no build can pass), the next build of
    the declared sequence, the original as it is, is built, evaluated and confirmed, and the report says so."""
    from tools.evaluation.confirm import ConfirmRule

    monkeypatch.setattr(ConfirmRule, "passes", lambda self, result: False)
    report = digits_vit_report(tmp_path / "run", **RUN, iterations=0, distill_rescues=0)
    looks = report["confirmation"]["looks"]
    assert [look["passed"] for look in looks] == [False, True] and not looks[1]["step"]["tested"]
    assert report["deployment"]["ships"] == "original" and report["deployment"]["source"]
    assert report["quantized"]["params"] == report["baseline"]["params"]  # the original ships
    assert report["quantized"]["confirmed"]["accuracy_drop_points"] == pytest.approx(0.0, abs=1e-9)
    md = (tmp_path / "run" / "report.md").read_text()
    assert "Failed first: torch" in md and "(look 2 at the confirm part)" in md
