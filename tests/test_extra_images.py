"""``--extra-images DIR``: a folder of the user's unlabelled images that distillation trains on (fit only). A full
run on the bundled digits ViT with a sentinel on every image a candidate is judged on: an extra image reaching an
evaluation (choose) or the confirmation fails the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import agents.evaluation
import tools.stages.run_data as run_data
from agents.context import AUTO_STEPS
from graph.cli import build_parser
from tests.helpers import digits_vit_report
from tools.compression import distill_budget as distill
from tools.evaluation.sources import DatasetError
from tools.stages.run_data import EvalSpec, check_extra_images

EXTRA = 40


def _folder(root: Path, count: int = EXTRA) -> Path:
    """``count`` noise images in two class folders (which the extra images' use ignores)."""
    rng = np.random.default_rng(0)
    for i in range(count):
        where = root / f"class{i % 2}"
        where.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(where / f"{i}.png")
    return root


@pytest.fixture
def sentinel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every extra image marked as it is decoded, and any marked image preprocessed as a dataset image (what every
    evaluation, choice and confirmation reads) an error."""
    loaded = run_data._extra_dataset

    def marked(folder: str, samples: int, seed: int) -> Any:
        data = loaded(folder, samples, seed)
        for image in data.images:
            image.info["extra-image"] = True
        return data

    judged = run_data._MemoPreprocess.__call__

    def sentinel(self: Any, images: list[Any]) -> Any:  # every image a candidate is judged or calibrated on
        if any(getattr(image, "info", {}).get("extra-image") for image in images):
            raise AssertionError("an extra image was read as a dataset image")
        return judged(self, images)

    monkeypatch.setattr(run_data, "_extra_dataset", marked)
    monkeypatch.setattr(run_data._MemoPreprocess, "__call__", sentinel)


@pytest.mark.usefixtures("sentinel")
def test_extra_images_train_each_round_and_no_choice_or_confirmation_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distill, "AUTO_DISTILL_IMAGES", (200, 4096))  # the digits' test split has 540 images
    monkeypatch.setattr(distill, "AUTO_DISTILL_STEPS", (10, 30))
    report = digits_vit_report(
        tmp_path / "run",
        iterations=0,
        eval_samples=200,
        calibration_samples=64,
        finetune_steps=AUTO_STEPS,
        batch_size=100,
        extra_images=str(_folder(tmp_path / "extra")),
    )
    parts = report["baseline"]["data_parts"]
    tuned = report["rounds"][0]["prune_report"]["finetune"]
    assert tuned["samples"] == 64 + parts["finetune"] + EXTRA  # the extra images trained the round's model
    assert report["dataset"]["extra_images"] == EXTRA and report["dataset"]["extra_read_by"] == ["fit"]
    assert report["dataset"]["parts_disjoint"] is True
    assert f"+{EXTRA} extra images, for distillation only" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.usefixtures("sentinel")
def test_with_extra_images_enough_a_round_over_the_budget_is_distilled_once_on_them_and_judged_on_every_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distill, "AUTO_DISTILL_STEPS", (10, 20))  # a tiny model would take the 1,000-step cap
    monkeypatch.setattr(agents.evaluation, "within_budget", lambda *args, **kwargs: False)  # the search's rounds fail
    run_dir = tmp_path / "run"
    report = digits_vit_report(
        run_dir,
        iterations=0,
        eval_samples=300,
        calibration_samples=64,
        quantize=True,
        quant_backend="torch-ao-dynamic",
        distill_rescues=1,
        unit_kinds="structured,head,head_dim",
        extra_images=str(_folder(tmp_path / "extra", 160)),  # more than half the 300 evaluation images
    )
    rounds = report["rounds"]
    evaluation = report["baseline"]["data_parts"]["evaluation"]
    distilled = rounds[1]
    cross_fit = distilled["cross_fit"]
    assert cross_fit["source_round"] == 0 and cross_fit["judged_on_half"] is None
    [student] = cross_fit["students"]
    assert student["judged_on_half"] is None and student["samples"] == evaluation
    assert cross_fit["images_per_student"] == 64 + 160  # calibration and extra images, no evaluation image
    assert distilled["prune_report"]["finetune"]["steps"] == 2 * 20  # the time of a pair of 20-step students
    assert distilled["metrics"]["paired"]["samples"] == evaluation
    assert not (run_dir / "rounds" / "round-01" / "model-second").exists()
    assert any("distilled from the original, 40 steps, once" in note for note in report["notes"])
    assert report["dataset"]["extra_images"] == 160 and report["dataset"]["extra_read_by"] == ["fit"]
    assert not report["dataset"]["overlaps"]  # no choose image trained a student
    assert distilled["within_budget"] and report["pruned"]["round"] == 1
    deployed = [c for c in report["deployment"]["candidates"] if c.get("paired")]
    assert deployed and all(c["paired"]["samples"] == evaluation for c in deployed)  # judged on every image


def test_a_folder_that_cannot_serve_is_refused_in_one_line(tmp_path: Path) -> None:
    data = _folder(tmp_path / "data")
    cases = {
        str(tmp_path / "missing"): "no such folder",
        str(tmp_path / "data"): "share images",  # the dataset itself
        str(tmp_path / "data" / "class0"): "share images",  # inside the dataset's folder
        str(tmp_path): "share images",  # holding it
    }
    (tmp_path / "empty").mkdir()
    cases[str(tmp_path / "empty")] = "no images"
    for extra, why in cases.items():
        with pytest.raises(DatasetError, match=why) as raised:
            check_extra_images(EvalSpec(dataset=str(data), extra_images=extra))
        assert "\n" not in str(raised.value) and "--extra-images" in str(raised.value)
    check_extra_images(EvalSpec(dataset="digits", extra_images=str(data)))  # apart from the dataset: fine


def test_extra_images_no_distillation_used_are_said_to_be_unused() -> None:
    from tools.reporting.paired_text import split_text

    dataset = {"spec": "d", "evaluation_samples": 100, "calibration_samples": 10, "confirm_samples": 0}
    assert "not used" in str(split_text({**dataset, "extra_images": 0, "extra_images_given": True}))
    assert "not used" not in str(split_text({**dataset, "extra_images": 5, "extra_images_given": True}))


def test_the_option_reaches_the_settings() -> None:
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--extra-images", "/x"])
    assert args.extra_images == "/x"
