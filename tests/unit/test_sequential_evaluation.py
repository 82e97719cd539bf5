"""Sequential evaluation: a candidate clearly over the accuracy budget stops at a look; one that could pass sees
every image; stopped predictions pair with the original's on the same first images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tools.evaluation import paired
from tools.evaluation.datasets import EvalDataset
from tools.evaluation.labels import LabelMatch
from tools.stats import SEQUENTIAL_MIN_IMAGES, clearly_over_budget, paired_accuracy, sequential_looks

IMAGES = 800
CLASSES = 10


def test_looks_are_shares_of_the_part_and_none_for_small_parts() -> None:
    assert sequential_looks(IMAGES) == [100, 200, 400]
    assert sequential_looks(2 * SEQUENTIAL_MIN_IMAGES) == [100]
    assert sequential_looks(SEQUENTIAL_MIN_IMAGES) == [], "too few images for any look: every image is evaluated"


def test_clearly_over_needs_the_whole_interval_beyond_the_budget() -> None:
    ref = [1] * 400
    # loses 40 of 400 (-10 points, se about 1.5): clearly over a 1-point budget
    lost = paired_accuracy(ref, [0] * 40 + [1] * 360, [0] * 400, [1] * 40 + [0] * 360)
    assert clearly_over_budget(lost, 1.0)
    # loses 8 of 400 (-2 points, se 0.7): over the budget as measured, but 3 se reach within it: go on
    close = paired_accuracy(ref, [0] * 8 + [1] * 392, [0] * 400, [1] * 8 + [0] * 392)
    assert close.delta_points == pytest.approx(-2.0) and not clearly_over_budget(close, 1.0)
    assert not clearly_over_budget(paired_accuracy([1], [0], [0], [1]), 1.0), "one image decides nothing"


def _data() -> tuple[EvalDataset, LabelMatch]:
    labels = [i % CLASSES for i in range(IMAGES)]
    data = EvalDataset(
        images=list(range(IMAGES)),  # type: ignore[arg-type]  # the fake preprocess takes indices
        labels=labels,
        label_names=[str(c) for c in range(CLASSES)],
        source="fake",
        size_total=IMAGES,
        indices=list(range(IMAGES)),
    )
    return data, LabelMatch(mapping={c: c for c in range(CLASSES)})


def _preprocess(images: list[Any]) -> torch.Tensor:
    return torch.tensor(images, dtype=torch.float32).unsqueeze(1)


def _model(wrong_every: int) -> Any:
    """Predicts image i's class, but a wrong one on every ``wrong_every``-th image (0: never wrong)."""

    def run(batch: torch.Tensor) -> torch.Tensor:
        index = batch[:, 0].long()
        classes = index % CLASSES
        if wrong_every:
            classes = torch.where(index % wrong_every == 0, (classes + 1) % CLASSES, classes)
        return torch.nn.functional.one_hot(classes, CLASSES).float()

    return run


def _predictions(tmp_path: Path, name: str, wrong_every: int, stop: paired.StopRule | None) -> Any:
    data, match = _data()
    spec = {"dataset": "fake", "label_match": match.model_dump(), "batch_size": 25}
    artifact = tmp_path / name
    artifact.mkdir(exist_ok=True)
    (artifact / "artifact.json").write_text("{}")
    return paired.predictions_for(
        artifact, "evaluation", data, spec, _preprocess, lambda: _model(wrong_every), stop=stop
    )


def test_a_candidate_clearly_over_the_budget_stops_at_the_first_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tools.artifacts.io.deployed_files", lambda _: [])
    reference = _predictions(tmp_path, "original", 0, None)
    assert reference.samples == IMAGES and not reference.stopped_early

    broken = _predictions(tmp_path, "broken", 5, paired.stop_when_over(reference, 1.0))  # loses 20 points
    assert broken.stopped_early and broken.samples == 100, "stopped at the first look, 100 of 800 images"
    result = paired.pair(reference, broken)
    assert result.samples == 100 and result.delta_points == pytest.approx(-20.0)

    # a candidate near the budget is never stopped: the end-of-run test decides it on every image
    near = _predictions(tmp_path, "near", 100, paired.stop_when_over(reference, 1.0))  # loses 1 point
    assert not near.stopped_early and near.samples == IMAGES
    assert paired.pair(reference, near).delta_points == pytest.approx(-1.0)

    # stopped predictions are reused by a rule that stops them too; a full evaluation runs every image again
    assert _predictions(tmp_path, "broken", 5, paired.stop_when_over(reference, 1.0)).samples == 100
    # a looser budget (25 points) would not have stopped it: evaluated to the end
    assert _predictions(tmp_path, "broken", 5, paired.stop_when_over(reference, 25.0)).samples == IMAGES
    full = _predictions(tmp_path, "broken", 5, None)
    assert not full.stopped_early and full.samples == IMAGES
    assert paired.stop_when_over(reference, None) is None and paired.stop_when_over(None, 1.0) is None


def test_the_report_names_the_candidates_stopped_early() -> None:
    from tools.reporting.paired_text import stopped_text

    full = paired_accuracy([1] * 8, [1] * 8, [0] * 8, [0] * 8)
    short = paired_accuracy([1] * 4, [0] * 4, [0] * 4, [1] * 4)
    text = stopped_text([("round 1", full), ("round 2", short.model_dump()), ("round 3", None)], 8)
    assert text is not None and "round 2 after 4 of 8 images" in text and "round 1" not in text
    assert stopped_text([("round 1", full)], 8) is None
    # a distilled round's student's builds are judged on a half: not stopped (CIFAR ResNet-44's runtime table said so)
    assert stopped_text([("openvino-int8", short)], 8, halves={4}) is None
