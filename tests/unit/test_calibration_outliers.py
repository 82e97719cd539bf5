"""Calibration images that would set ONNX Runtime's min-max ranges on their own are left out of static int8."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tools.deploy.base import Build
from tools.deploy.onnxruntime.outliers import MIN_IMAGES, OUTLIER_RATIO, outlier_images, without_outlier_images

pytest.importorskip("onnxruntime")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().mean((2, 3)))


def _images(n: int) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def test_an_image_far_past_the_median_is_found_and_left_out_with_a_note() -> None:
    images = _images(40)
    images[7] *= 3 * OUTLIER_RATIO  # every activation about 75x the median image's
    found = outlier_images(_Net(), images)
    assert set(found) == {7} and found[7][1] > OUTLIER_RATIO
    kept, notes = without_outlier_images(_Net(), images)
    assert len(kept) == 39 and not any(torch.equal(row, images[7]) for row in kept)
    assert len(notes) == 1 and "image 7" in notes[0] and "1 of 40" in notes[0]


def test_the_same_outliers_are_warned_about_once_but_noted_every_time(caplog: pytest.LogCaptureFixture) -> None:
    images = _images(40)
    images[11] *= 3 * OUTLIER_RATIO
    with caplog.at_level("WARNING", logger="tools.deploy.onnxruntime.outliers"):
        notes = [without_outlier_images(_Net(), images)[1] for _ in range(2)]
    assert notes[0] == notes[1] and len(notes[0]) == 1 and "image 11" in notes[0][0]
    assert sum("image 11" in record.getMessage() for record in caplog.records) == 1


def test_ordinary_spread_few_images_or_many_far_out_leave_the_calibration_as_it_is() -> None:
    images = _images(40)
    assert outlier_images(_Net(), images) == {}
    few = images[: MIN_IMAGES - 1].clone()
    few[0] *= 100
    assert torch.equal(without_outlier_images(_Net(), few)[0], few)
    spread = images.clone()
    spread[:8] *= 100  # a fifth of the images: the data's spread, not outliers
    kept, notes = without_outlier_images(_Net(), spread)
    assert torch.equal(kept, spread) and notes == []


def test_the_static_backend_calibrates_without_the_outlier_and_says_so(tmp_path: Path) -> None:
    from tools.deploy.registry import get_backend, plan_quantization
    from tools.schemas import QuantizationRecommendation

    model = _Net().eval()
    images = _images(40)
    images[3] *= 3 * OUTLIER_RATIO
    report = plan_quantization(
        model, [QuantizationRecommendation(layer="all", dtype="qint8")], backend="onnxruntime-static"
    )
    built = get_backend("onnxruntime-static").save(Build(model, report, tmp_path, calibration=images))
    assert any("calibrated on 39 images" in note for note in built.notes)
    assert any("image 3" in note and "left out" in note for note in built.notes)
