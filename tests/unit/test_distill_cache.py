"""Distillation from cached activations (tools.compression.distill_cache): the cut, its check, and training from
it changes only what follows it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tools.compression import distill_cache
from tools.compression.distill import DistillConfig, distill_, distill_loss
from tools.compression.distill_cache import changed_modules, find_cut, plan_cache
from tools.compression.forward import forward_logits


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class Staged(nn.Module):
    """A stem, three stages in a Sequential, a pooled head: the shape of a CNN whose last stage is pruned."""

    def __init__(self, last: int = 12) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.stages = nn.Sequential(_block(8, 8), _block(8, 8), _block(8, last))
        self.head = nn.Linear(last, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return self.head(self.stages(x).mean(dim=(2, 3)))


def _pair() -> tuple[Staged, Staged]:
    torch.manual_seed(0)
    teacher = Staged().eval()
    student = Staged(last=6).eval()  # the last stage pruned to half its channels
    own = student.state_dict()
    student.load_state_dict({k: v for k, v in teacher.state_dict().items() if own[k].shape == v.shape}, strict=False)
    return student, teacher


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_changed_modules_are_the_pruned_ones_only() -> None:
    student, teacher = _pair()
    assert changed_modules(student, teacher) == {"stages.2.0", "stages.2.1", "head"}
    assert changed_modules(teacher, copy.deepcopy(teacher)) == set()


def test_the_cut_is_the_last_module_before_the_change_and_gives_the_same_logits() -> None:
    student, teacher = _pair()
    images = _images(8, seed=1)
    cut = find_cut(student, teacher, images)
    assert cut is not None and cut.name == "stages.1"
    assert {"stem", "stages.0", "stages.1"} <= cut.done and "stages.2" not in cut.done
    with torch.no_grad():
        full = forward_logits(student, images)
        alone = cut.suffix(student, cut.prefix(student, images))
    assert torch.allclose(full, alone, atol=1e-6)
    assert "forward" not in student.stem.__dict__  # the stubs are gone afterwards


def test_no_cut_when_the_first_layer_changed_or_a_stub_would_change_the_logits() -> None:
    student, teacher = _pair()
    student.stem = nn.Conv2d(3, 8, 5, padding=2)  # the first layer changed: nothing before it to cache
    assert find_cut(student.eval(), teacher, _images(4, seed=2)) is None

    class Skip(Staged):  # the stem's output reaches the head past every stage: no cut survives the check
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            stem = torch.relu(self.stem(x))
            out = self.stages(stem)
            return self.head(out.mean(dim=(2, 3)) + stem.mean())

    skip_teacher, skip_student = Skip().eval(), Skip(last=6).eval()
    cut = find_cut(skip_student, skip_teacher, _images(4, seed=3))
    assert cut is None


def test_distillation_from_the_cache_trains_only_what_follows_the_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distill_cache, "MIN_SPEEDUP", 0.0)  # a model this small is not worth caching by time
    student, teacher = _pair()
    before = {k: v.clone() for k, v in student.state_dict().items()}
    train, held_out = _images(96, seed=4), _images(64, seed=5)

    def kl() -> float:
        with torch.no_grad():
            s, t = forward_logits(student, held_out), forward_logits(teacher, held_out)
        return float(distill_loss(s, t, 1.0))

    kl_before = kl()
    report = distill_(student, teacher, train, DistillConfig(steps=40, lr=1e-2, batch_size=16))
    assert report.cached_from == "stages.1" and report.views >= 1
    after = student.state_dict()
    for name in ("stem.weight", "stages.0.0.weight", "stages.1.1.running_mean", "stages.1.0.bias"):
        assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["stages.2.0.weight"], before["stages.2.0.weight"])
    assert kl() < 0.5 * kl_before
    assert all(p.requires_grad for p in student.parameters())


def test_caching_off_or_not_worth_it_trains_every_layer() -> None:
    student, teacher = _pair()
    before = student.stem.weight.clone()
    report = distill_(
        student, teacher, _images(64, seed=6), DistillConfig(steps=5, lr=1e-2, batch_size=16, cache=False)
    )
    assert report.cached_from == "" and report.views == 0
    assert not torch.equal(student.stem.weight, before)
    # without augmentation one view; the estimate decides
    planned = plan_cache(
        student, teacher, _images(64, seed=7), samples=64, augment=False, block_bytes={}, device=torch.device("cpu")
    )
    assert planned is None or planned[1] == 1


def test_distillation_from_the_cache_is_seeded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distill_cache, "MIN_SPEEDUP", 0.0)
    images = _images(64, seed=8)
    weights = []
    for _ in range(2):
        student, teacher = _pair()
        report = distill_(student, teacher, images, DistillConfig(steps=10, lr=1e-2, batch_size=16, seed=3))
        assert report.views >= 1
        weights.append(student.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_view_cache_runs_large_images_a_few_at_a_time_and_caches_what_one_pass_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 260 px a chunk of 64 images leaves the CPU's caches (Lite2's teacher: 7.0 s for 64 in one chunk, 2.4 s in
    chunks of 2): the cache's passes, and the timing that picks their precision, go as ``calibration.chunks`` says;
    the first view, not augmented, is what one pass of all the images gives."""
    from tools.compression import calibration
    from tools.compression.distill import _cache_views

    student, teacher = _pair()
    images = torch.randn(5, 3, 300, 300, generator=torch.Generator().manual_seed(9))  # 2 a chunk: see pass_images
    cut = find_cut(student, teacher, images[:2])
    assert cut is not None
    seen: list[int] = []
    handle = teacher.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[0])))
    _cache_views(cut, 1, (student, teacher), images, [], "fastest", torch.Generator().manual_seed(0))
    handle.remove()
    assert max(seen) == 2 and sum(seen[-3:]) == 5  # the timing's chunk of 2, then 2 + 2 + 1
    chunked = _cache_views(cut, 1, (student, teacher), images, [], "fp32", torch.Generator().manual_seed(0))
    monkeypatch.setattr(calibration, "PASS_INPUT_ELEMENTS", 10**12)  # one chunk of all five, as before
    whole = _cache_views(cut, 1, (student, teacher), images, [], "fp32", torch.Generator().manual_seed(0))
    assert torch.allclose(chunked.logits, whole.logits, atol=1e-5)
    assert torch.allclose(chunked.prefix, whole.prefix, atol=1e-5)


@pytest.mark.parametrize("cache", [False, True])
def test_a_step_on_large_images_in_chunks_is_the_step_of_the_whole_batch(
    monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    """The student's pass over large images runs a few at a time, the chunks' gradients summed by their share of the
    batch (block outputs scaled by the whole batch's): the weights after each step are those of one pass."""
    from tools.compression import calibration

    monkeypatch.setattr(distill_cache, "MIN_SPEEDUP", 0.0)
    images = torch.randn(6, 3, 300, 300, generator=torch.Generator().manual_seed(10))  # 2 a chunk
    config = DistillConfig(steps=2, lr=1e-2, batch_size=5, seed=2, cache=cache, feature_weight=1.0, precision="fp32")
    weights: list[dict[str, torch.Tensor]] = []
    seen: list[list[int]] = []
    for whole in (False, True):
        if whole:
            monkeypatch.setattr(calibration, "PASS_INPUT_ELEMENTS", 10**12)
        student, teacher = _pair()
        sizes: list[int] = []
        seen.append(sizes)
        handle = student.stages[2].register_forward_pre_hook(lambda _m, args, kept=sizes: kept.append(len(args[0])))
        report = distill_(student, teacher, images, config)
        handle.remove()
        assert (report.views > 0) == cache
        weights.append({k: v.clone() for k, v in student.state_dict().items()})
    assert 5 not in seen[0] and 5 in seen[1]  # a batch of 5: in chunks, then whole
    for name, value in weights[1].items():
        assert torch.allclose(weights[0][name], value, atol=1e-5, rtol=1e-4), name
    assert not torch.equal(weights[1]["stages.2.0.weight"], _pair()[0].state_dict()["stages.2.0.weight"])
