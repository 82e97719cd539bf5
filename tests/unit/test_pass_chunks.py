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


def _residual_cnn() -> nn.Module:
    from tests.unit.test_pruning import ResidualCNN

    torch.manual_seed(0)
    model = ResidualCNN().eval()
    with torch.no_grad():  # training-set statistics unlike the calibration images'
        for bn in (model.bn0, model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def test_batchnorm_statistics_of_large_images_are_those_of_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taken in chunks of a few images or in one pass, a BatchNorm's input statistics are of the same positions:
    the grid a large activation is sampled on is set by all the images, not by a chunk's."""
    from tools.compression.recovery import batchnorm_input_stats

    model, images = _residual_cnn(), torch.randn(40, 3, 160, 160)  # 1 million values a channel: a grid of them
    chunked = batchnorm_input_stats(model, images)
    monkeypatch.setattr(calibration, "PASS_INPUT_ELEMENTS", 10**12)  # one pass of 40
    whole = batchnorm_input_stats(model, images)
    for name, (mean, var) in whole.items():
        assert torch.allclose(chunked[name][0], mean, atol=1e-6) and torch.allclose(chunked[name][1], var, rtol=1e-5)


def test_reconstruction_leaves_an_unpruned_model_with_large_images_as_it_was() -> None:
    """The differential BatchNorm correction compares the original's statistics (gathered in chunks) with those of
    reconstruction's one pass: for an unpruned model they are the same, and nothing moves."""
    import copy

    from tools.compression.recovery import RecoveryConfig, recover_

    original, images = _residual_cnn(), torch.randn(40, 3, 160, 160)
    model = copy.deepcopy(original)
    report = recover_(model, original, images, [], RecoveryConfig(method="reconstruct"), fit=32)
    assert report.batchnorm_layers == 3
    for bn in ("bn0", "bn1", "bn2"):
        before, after = original.get_submodule(bn), model.get_submodule(bn)
        assert torch.allclose(after.running_mean, before.running_mean, atol=1e-5), bn
        assert torch.allclose(after.running_var, before.running_var, rtol=1e-4), bn


def test_batchnorm_reestimated_on_large_images_normalizes_whole_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-estimation runs BatchNorm in training mode, each chunk normalized by its own statistics: the chunks are
    the batch size asked for, however large the images (chunks of 2 would lose the variance between images)."""
    import copy

    from tools.compression.recovery import recalibrate_batchnorm_

    model, images = _residual_cnn(), torch.randn(40, 3, 160, 160)
    whole = copy.deepcopy(model)
    recalibrate_batchnorm_(model, images, batch_size=20)
    monkeypatch.setattr(calibration, "PASS_INPUT_ELEMENTS", 10**12)
    recalibrate_batchnorm_(whole, images, batch_size=20)
    for name in ("bn0", "bn1", "bn2"):
        a, b = model.get_submodule(name), whole.get_submodule(name)
        assert torch.allclose(a.running_var, b.running_var, rtol=1e-4), name
