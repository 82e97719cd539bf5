"""Knowledge distillation of a damaged student against its teacher (tools.compression.distill)."""

from __future__ import annotations

import copy
from typing import TypeVar

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from tests.helpers import tiny_vit
from tools.compression.distill import DistillConfig, augment_batch, distill_, distill_loss, matched_blocks
from tools.compression.forward import forward_logits

M = TypeVar("M", bound=nn.Module)


class TinyBNNet(nn.Module):
    """conv -> BN -> ReLU -> conv -> BN -> ReLU -> pool -> dropout -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 12, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(12)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.stem(x)))
        x = torch.relu(self.bn2(self.conv(x)))
        return self.head(self.drop(x.mean(dim=(2, 3))))


def _teacher_cnn() -> TinyBNNet:
    torch.manual_seed(0)
    model = TinyBNNet()
    with torch.no_grad():  # non-trivial running statistics, as after training
        for bn in (model.bn1, model.bn2):
            assert bn.running_mean is not None and bn.running_var is not None and bn.num_batches_tracked is not None
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
            bn.num_batches_tracked.fill_(100)
    return model.eval()


def _damaged(teacher: M, scale: float = 0.5, seed: int = 1) -> M:
    """A copy whose weights are perturbed, so that it disagrees with ``teacher``."""
    student = copy.deepcopy(teacher)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in student.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=generator) * scale * p.std())
    return student.eval()


def _kl(student: nn.Module, teacher: nn.Module, images: torch.Tensor) -> float:
    with torch.no_grad():
        return float(distill_loss(forward_logits(student, images), forward_logits(teacher, images), 1.0))


def _images(n: int, size: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_cnn_distillation_reduces_kl_and_keeps_frozen_and_batchnorm() -> None:
    teacher = _teacher_cnn()
    student = _damaged(teacher)
    student.stem.weight.requires_grad_(False)  # frozen: must stay as it is
    before_state, teacher_state = _state(student), _state(teacher)
    train, held_out = _images(128, 16, seed=2), _images(64, 16, seed=3)
    kl_before = _kl(student, teacher, held_out)

    report = distill_(student, teacher, train, DistillConfig(steps=60, lr=1e-2, batch_size=32))

    assert _kl(student, teacher, held_out) < 0.5 * kl_before
    assert report.steps == 60 and report.samples == 128 and report.device == "cpu"
    assert report.cpu_seconds is not None and report.cpu_seconds > 0  # what auto_rescues counts on a loaded machine
    assert report.loss_last < report.loss_first
    after = student.state_dict()
    assert torch.equal(after["stem.weight"], before_state["stem.weight"])
    assert not student.stem.weight.requires_grad and student.head.weight.requires_grad
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        for bn in ("bn1", "bn2"):
            assert torch.equal(after[f"{bn}.{name}"], before_state[f"{bn}.{name}"])
    assert not torch.equal(after["conv.weight"], before_state["conv.weight"])
    assert not any(m.training for m in student.modules())
    assert all(torch.equal(v, teacher_state[k]) for k, v in teacher.state_dict().items())
    assert not teacher.training


def test_vit_distillation_reduces_kl() -> None:
    teacher = tiny_vit()
    student = _damaged(teacher, scale=0.6)
    train, held_out = _images(96, 16, seed=4), _images(48, 16, seed=5)
    kl_before = _kl(student, teacher, held_out)
    assert kl_before > 1e-3

    report = distill_(student, teacher, train, DistillConfig(steps=40, lr=3e-3, batch_size=32))

    assert _kl(student, teacher, held_out) < 0.7 * kl_before
    assert report.loss_last < report.loss_first
    assert not any(m.training for m in student.modules())


@pytest.mark.parametrize("model", ["cnn", "vit"])
def test_bf16_distillation_reduces_kl_as_fp32_does_and_keeps_fp32_weights(model: str) -> None:
    teacher = _teacher_cnn() if model == "cnn" else tiny_vit()
    train, held_out = _images(96, 16, seed=4), _images(48, 16, seed=5)
    kls = {}
    for precision in ("fp32", "bf16"):
        student = _damaged(teacher, scale=0.6)
        kl_before = _kl(student, teacher, held_out)
        config = DistillConfig(steps=40, lr=1e-2 if model == "cnn" else 3e-3, batch_size=32, precision=precision)
        report = distill_(student, teacher, train, config)
        assert report.precision == precision and report.loss_last < report.loss_first
        assert all(p.dtype == torch.float32 for p in student.parameters())  # autocast, not a bf16 model
        kls[precision] = _kl(student, teacher, held_out) / kl_before
    assert kls["bf16"] < 0.7
    assert kls["bf16"] == pytest.approx(kls["fp32"], abs=0.15)  # the same repair, within bf16's rounding


def test_steps_zero_is_a_no_op() -> None:
    teacher = _teacher_cnn()
    student = _damaged(teacher)
    before = _state(student)
    report = distill_(student, teacher, _images(16, 16, seed=6), DistillConfig())
    assert report.steps == 0 and report.seconds == 0.0
    assert all(torch.equal(v, before[k]) for k, v in student.state_dict().items())


def test_seeded_runs_are_identical_and_seeds_matter() -> None:
    teacher = _teacher_cnn()
    train = _images(64, 16, seed=7)
    results = []
    for seed in (0, 0, 1):
        student = _damaged(teacher)
        distill_(student, teacher, train, DistillConfig(steps=10, lr=1e-2, batch_size=16, seed=seed))
        results.append(_state(student))
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
    assert not torch.equal(results[0]["conv.weight"], results[2]["conv.weight"])


def test_dtype_kept_and_all_frozen_refused() -> None:
    teacher = _teacher_cnn()
    student = _damaged(teacher).double()
    distill_(student, teacher, _images(32, 16, seed=8), DistillConfig(steps=3, batch_size=8))
    assert all(p.dtype == torch.float64 for p in student.parameters())
    for p in student.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        distill_(student, teacher, _images(8, 16, seed=8), DistillConfig(steps=1))


def test_augment_batch_flips_and_shifts_reproducibly() -> None:
    batch = _images(32, 16, seed=9)
    first = augment_batch(batch, torch.Generator().manual_seed(0))
    again = augment_batch(batch, torch.Generator().manual_seed(0))
    assert first.shape == batch.shape and torch.equal(first, again)
    assert not torch.equal(first, batch)
    flat = torch.ones(2, 4, 7)  # not an N,C,H,W image batch: unchanged
    assert augment_batch(flat, torch.Generator()) is flat
    # a constant image stays constant: the padding reflects, it adds no zeros
    constant = torch.full((4, 3, 16, 16), 0.7)
    assert torch.allclose(augment_batch(constant, torch.Generator().manual_seed(1)), constant)


def test_config_is_validated() -> None:
    with pytest.raises(ValidationError):
        DistillConfig(steps=-1)
    with pytest.raises(ValidationError):
        DistillConfig(device="gpu")
    with pytest.raises(ValidationError):
        DistillConfig(stepz=3)  # type: ignore[call-arg]
    assert DistillConfig(device="cuda:0").device == "cuda:0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_distillation_returns_to_the_cpu() -> None:
    teacher = _teacher_cnn()
    student = _damaged(teacher)
    held_out = _images(64, 16, seed=11)
    kl_before = _kl(student, teacher, held_out)
    report = distill_(student, teacher, _images(128, 16, seed=10), DistillConfig(steps=60, lr=1e-2, device="cuda"))
    assert report.device.startswith("cuda") and report.cpu_seconds is None  # the CPU's time measures nothing there
    assert all(p.device.type == "cpu" for p in [*student.parameters(), *teacher.parameters()])
    assert _kl(student, teacher, held_out) < 0.5 * kl_before


class Stack(nn.Module):
    """A stem and a Sequential of conv blocks; ``widths`` are the blocks' output channels."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


def test_matched_blocks_are_the_blocks_whose_width_pruning_left_alone() -> None:
    teacher, student = Stack((8, 8, 6)), Stack((5, 8, 6))  # the first block was narrowed
    assert matched_blocks(student, teacher, _images(1, 8, seed=10)) == ["body.2", "body.3", "body.4", "body.5"]
    assert not any(m._forward_hooks for m in [*student.modules(), *teacher.modules()])
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()  # probed in eval: statistics stay
    assert matched_blocks(bn, copy.deepcopy(bn), _images(2, 8, seed=11)) == ["0", "1"]
    assert bn.training and torch.equal(bn[1].running_mean, torch.zeros(4))
    blocks = matched_blocks(tiny_vit(), tiny_vit(), _images(1, 16, seed=10))
    assert len(blocks) == 2 and blocks[1].endswith("layers.1")  # the two encoder layers (tuple outputs too)


def _block_error(student: nn.Module, teacher: nn.Module, images: torch.Tensor) -> float:
    """Relative squared error of the last matched block's output (the ViT's last encoder layer)."""
    name = matched_blocks(student, teacher, images[:1])[-1]
    outputs: list[torch.Tensor] = []
    handles = [
        dict(m.named_modules())[name].register_forward_hook(
            lambda _m, _i, out: outputs.append(out[0] if isinstance(out, tuple) else out)
        )
        for m in (student, teacher)
    ]
    try:
        with torch.no_grad():
            forward_logits(student, images)
            forward_logits(teacher, images)
    finally:
        for handle in handles:
            handle.remove()
    return float((outputs[0] - outputs[1]).pow(2).mean() / outputs[1].pow(2).mean())


def test_matching_block_outputs_brings_the_hidden_states_closer() -> None:
    teacher = tiny_vit()
    train, held_out = _images(96, 16, seed=4), _images(48, 16, seed=5)
    errors = {}
    for weight in (0.0, 1.0):
        student = _damaged(teacher, scale=0.6)
        distill_(student, teacher, train, DistillConfig(steps=40, lr=3e-3, batch_size=32, feature_weight=weight))
        errors[weight] = _block_error(student, teacher, held_out)
        assert not any(m._forward_hooks for m in [*student.modules(), *teacher.modules()])
    assert errors[1.0] < 0.7 * errors[0.0]


def test_the_fastest_precision_is_timed_on_a_copy_and_trains_as_that_precision_would() -> None:
    teacher = _teacher_cnn()
    train = _images(64, 16, seed=11)
    timed, fixed = _damaged(teacher), _damaged(teacher)
    report = distill_(timed, teacher, train, DistillConfig(steps=8, lr=1e-2, batch_size=16, precision="fastest"))
    assert report.precision in ("fp32", "bf16")
    config = DistillConfig(steps=8, lr=1e-2, batch_size=16, precision=report.precision)
    assert distill_(fixed, teacher, train, config).precision == report.precision
    # the trial steps left nothing behind: the same student as a run told the precision outright
    assert all(torch.equal(v, fixed.state_dict()[k]) for k, v in timed.state_dict().items())
