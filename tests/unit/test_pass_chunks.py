"""Passes over many large images run a few images at a time (activations stay in the CPU's caches), and give what
one pass over the whole batch gives: the same output rows, the same logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tools.compression import calibration


def _model() -> nn.Module:
    torch.manual_seed(0)
    convs = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)]
    return nn.Sequential(*convs, nn.Flatten(), nn.Linear(8 * 300 * 300, 5)).eval()


def test_large_images_go_a_few_at_a_time_and_small_ones_as_before() -> None:
    assert calibration.pass_images(torch.zeros(10, 3, 300, 300)) == 2
    assert calibration.pass_images(torch.zeros(256, 3, 32, 32)) == 64  # CIFAR: unchanged
    assert [part.shape[0] for part in calibration.chunks(torch.zeros(5, 3, 300, 300), 64)] == [2, 2, 1]


@pytest.mark.parametrize("max_rows", [5000, 10**9])
def test_output_rows_in_chunks_are_those_of_one_pass(monkeypatch: pytest.MonkeyPatch, max_rows: int) -> None:
    model, images, names = _model(), torch.randn(5, 3, 300, 300), ["0", "2", "4"]
    chunked = calibration.capture(model, images, names, outputs=True, max_rows=max_rows)
    monkeypatch.setattr(calibration, "PASS_INPUT_ELEMENTS", 10**12)  # one pass, as before
    whole = calibration.capture(model, images, names, outputs=True, max_rows=max_rows)
    assert chunked.keys() == whole.keys()
    for name in names:
        assert torch.allclose(chunked[name], whole[name], atol=1e-5), name
