"""The original's passes over the calibration images are made once per run: importance scores, BatchNorm statistics
and the output rows recovery refits to, shared by every prune of the same original on the same images."""

from __future__ import annotations

import torch
from torch import nn

from tools.compression.reference import reference_passes
from tools.zoo.cifar_resnet import resnet20


def _counted_resnet() -> tuple[nn.Module, list[int], torch.Tensor]:
    """A seeded ResNet-20 that counts its forward passes, and six images."""
    torch.manual_seed(0)
    model = resnet20().eval()
    passes_made = [0]
    model.register_forward_pre_hook(lambda *_: passes_made.__setitem__(0, passes_made[0] + 1))
    return model, passes_made, torch.randn(6, 3, 32, 32)


def test_each_pass_of_the_original_is_made_once_and_kept_for_the_same_images() -> None:
    model, passes_made, images = _counted_resnet()
    built: list[nn.Module] = []

    def load() -> nn.Module:
        built.append(model)
        return model

    first = reference_passes("resnet20@1", load, images)
    scores = first.channel_scores("act")
    assert scores and first.channel_scores("act") is scores
    stats = first.batchnorm_stats()
    assert stats is not None and first.batchnorm_stats() is stats
    rows = first.outputs(["layer1.0.conv2", "layer2.0.conv2"], 256)
    assert set(rows) == {"layer1.0.conv2", "layer2.0.conv2"} and rows["layer1.0.conv2"].shape == (256, 16)
    made = passes_made[0]
    again = reference_passes("resnet20@1", load, images.clone())  # the same images, another tensor
    assert again is first and len(built) == 1
    again.outputs(["layer1.0.conv2"], 256)
    again.channel_scores("act")
    assert passes_made[0] == made, "nothing is computed twice"
    again.outputs(["layer1.0.conv2", "layer3.0.conv2"], 256)
    assert passes_made[0] == made + 1, "one pass for the layers never captured before"
    assert reference_passes("resnet20@1", load, images[:4]) is not first  # other images: new passes
    assert reference_passes("resnet20@2", load, images) is not first  # the original saved again: new passes
    assert first.channel_scores("l2") is None  # not data-aware


def test_the_batchnorm_statistics_come_with_the_first_capture() -> None:
    model, passes_made, images = _counted_resnet()
    passes = reference_passes("resnet20@3", lambda: model, images)
    passes.outputs(["layer1.0.conv2"], 256)
    assert passes_made[0] == 1
    stats = passes.batchnorm_stats()
    assert passes_made[0] == 1, "gathered in the capture's pass"
    assert stats is not None and len(stats) == 19
    from tools.compression.recovery import batchnorm_input_stats

    for name, (mean, var) in batchnorm_input_stats(model, images).items():
        torch.testing.assert_close(stats[name][0], mean)
        torch.testing.assert_close(stats[name][1], var)
