"""Probes run only what follows their first change: the prefix's outputs replayed from the original's pass give
the same repaired model and logits as a full pass, an earlier change replays less, and only what can be replayed
exactly is (modules called once, on the cached batch)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers import tiny_resnet, tiny_vit
from tests.helpers_mobilenet import tiny_mobilenet
from tools.compression.forward import forward_logits
from tools.compression.prefix import PrefixCache
from tools.compression.pruning import apply_pruning
from tools.compression.recovery import RecoveryConfig, batchnorm_input_stats, recover_
from tools.schemas import PruningRecommendation
from tools.zoo.cifar_resnet import resnet20


def _calls(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The logits of ``model`` on ``images`` and how many leaf modules ran."""
    ran = [0]
    handles = [
        m.register_forward_pre_hook(lambda *_: ran.__setitem__(0, ran[0] + 1))
        for m in model.modules()
        if not list(m.children())
    ]
    try:
        with torch.no_grad():
            logits = forward_logits(model, images)
    finally:
        for h in handles:
            h.remove()
    return logits, ran[0]


def _probe(original: nn.Module, images: torch.Tensor, layer: str, kind: str, cache: PrefixCache | None) -> nn.Module:
    model = copy.deepcopy(original)
    ratio = 1.0 if kind == "block" else 0.5
    rec = PruningRecommendation(layer=layer, pruning_type=kind, pruning_ratio=ratio, justification="test")  # type: ignore[arg-type]
    report = apply_pruning(model, [rec], images[:1])
    assert report.applied
    stats = batchnorm_input_stats(original, images)
    if cache is None:
        recover_(model, original, images, report.consumers(), RecoveryConfig(), reference_stats=stats)
        return model
    first = cache.first_change(model)
    with cache.skip(model, first) as replayed, cache.skip(original, first):
        assert replayed  # a late unit: the stem and the first blocks are replayed
        recover_(model, original, images, report.consumers(), RecoveryConfig(), reference_stats=stats)
    return model


@pytest.mark.parametrize(
    ("build", "layer", "kind", "size"),
    [
        (resnet20, r"^layer3\.1\.conv1$", "structured", 32),
        (tiny_resnet, r"^resnet\.encoder\.stages\.1\.layers\.0\.layer\.0\.convolution$", "structured", 32),
        (tiny_vit, r"^vit\.layers\.1\.attention$", "head", 16),
        (tiny_vit, r"^vit\.layers\.1\.mlp\.fc1$", "structured", 16),
        (tiny_mobilenet, r"^features\.2\.0\.block\.2$", "block", 32),
    ],
)
def test_a_replayed_probe_is_the_full_probe(build: object, layer: str, kind: str, size: int) -> None:
    torch.manual_seed(0)
    original = build().eval()  # type: ignore[operator]
    for m in original.modules():  # BatchNorm statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    images = torch.randn(12, 3, size, size)
    # every module a unit's start: the cache holds every output that can be replayed (the pooling that opens a
    # squeeze-excitation too, which a removed one takes with it)
    cache, logits = PrefixCache.build(original, images, [name for name, _ in original.named_modules()])
    torch.testing.assert_close(logits, forward_logits(original, images).float(), rtol=1e-4, atol=1e-5)
    full = _probe(original, images, layer, kind, None)
    replayed = _probe(original, images, layer, kind, cache)
    for key, value in full.state_dict().items():
        torch.testing.assert_close(replayed.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)
    first = cache.first_change(replayed)
    expected, everything = _calls(replayed, images)
    with cache.skip(replayed, first):
        got, fewer = _calls(replayed, images)
    torch.testing.assert_close(got, expected)
    assert fewer < everything
    assert not any("forward" in vars(m) for m in (*original.modules(), *replayed.modules()))  # nothing stays


def test_an_earlier_change_replays_nothing_before_it() -> None:
    torch.manual_seed(0)
    original = resnet20().eval()
    images = torch.randn(6, 3, 32, 32)
    cache, _ = PrefixCache.build(original, images, ["layer3.1.conv1"])
    probe = copy.deepcopy(original)
    assert cache.replayed(cache.first_change(probe))  # unchanged: everything cached can be replayed
    with torch.no_grad():
        probe.conv1.weight.mul_(1.01)  # the stem changed: nothing runs before it
    assert cache.replayed(cache.first_change(probe)) == []
    probe = copy.deepcopy(original)
    probe.layer2.register_buffer("extra", torch.zeros(1))  # a new tensor counts as a change of its module
    assert all(not name.startswith(("layer2", "layer3")) for name in cache.replayed(cache.first_change(probe)))


class SharedActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3), nn.Linear(4, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.b(self.act(self.a(x)))).mean((2, 3)))


def test_only_modules_called_once_are_replayed_and_only_on_the_cached_batch() -> None:
    torch.manual_seed(0)
    model = SharedActivation().eval()
    images = torch.randn(5, 3, 12, 12)
    cache, _ = PrefixCache.build(model, images, ["head"])
    assert "act" not in cache.outputs and {"a", "b"} <= set(cache.outputs)
    with cache.skip(model, cache.first_change(model)) as replayed:
        assert replayed == ["a", "b"]
        other = torch.randn(3, 3, 12, 12)  # another batch runs the modules
        with torch.no_grad():
            torch.testing.assert_close(model(other), SharedActivation.forward(model, other))
            out = model(images)
            out.add_(1.0)  # what follows may work in place: the cache is not touched
            torch.testing.assert_close(model(images), out - 1.0)
    assert "forward" not in vars(model.a)
