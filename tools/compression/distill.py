"""Optional knowledge distillation after pruning: one verb, :func:`distill_`, with a :class:`DistillConfig`.

The pruned (and repaired) student is fine-tuned IN PLACE to match the original teacher's logits on
unlabeled, already preprocessed images: the loss is Hinton's KL divergence between the softened
distributions, ``T^2 * KL(softmax(t / T) || softmax(s / T))``. AdamW, cosine learning-rate decay after a
short linear warmup, gradient clipping at norm 1, seeded mini-batches (every image once per epoch) and,
for image batches, seeded random horizontal flips and small translations (reflect-padded crops).
The student trains in eval mode: BatchNorm statistics stay as they are (just recalibrated; batches are small) and
dropout stays off, so it learns the function it is deployed as; frozen parameters stay frozen.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from tools.clock import counts_as
from tools.compression.forward import forward_logits
from tools.models.base import resolve_device
from tools.profiling.modules import first_tensor

logger = logging.getLogger(__name__)

__all__ = [
    "DISTILL_TEMPERATURE",
    "DistillConfig",
    "DistillReport",
    "Precision",
    "augment_batch",
    "distill_",
    "distill_loss",
    "feature_loss",
    "matched_blocks",
]

#: The default softmax temperature (:attr:`DistillConfig.temperature`). Measured with
#: ``benchmarks/cross_fit_distill.py`` (the rounds distillation after the search took, two students each, one Xeon
#: core, bf16; in the run = cross-fitted on the evaluation images, unseen = the other half of CIFAR-10's test split),
#: temperature 2 -> 4: CIFAR ResNet-32 16.7 % fewer parameters (300 steps) in the run -0.34 -> +0.00, unseen
#: -0.76/-0.68 -> -0.46/-0.74, agreement with the original on unseen images 92.7/92.3 -> 92.9/92.9 %; its 17.7 % round
#: -0.61 -> -0.08 in the run, -0.94/-0.92 -> -0.66/-0.78 unseen; ViT-tiny 67.2 % (1,000 steps) -0.15 -> -0.06,
#: -0.46/-0.72 -> -0.52/-0.74, 94.6/94.6 -> 94.8/94.7 %; CIFAR ResNet-20 11.8 % (1,000 steps) -0.51 -> -0.57,
#: +0.34/-0.24 -> +0.10/-0.28, 92.0/92.1 -> 92.6/92.8 %. Agreement rose in every case, accuracy by +0.04 on average.
DISTILL_TEMPERATURE = 4.0
#: The precision of distillation's forward passes (:attr:`DistillReport.precision`) ...
Precision = Literal["fp32", "bf16"]
#: ... and what a config may ask for: ``fastest`` times :data:`FASTEST_TRIAL_STEPS` steps in each before training
#: and takes bf16 only where it is :data:`BF16_MIN_GAIN` faster. Measured (one AMD EPYC Zen 4 core with AVX512-BF16,
#: batches of 32, block outputs matched, beside another job): CIFAR ViT-tiny's students 127 ms a step in bf16 and
#: 88 in FP32; ResNet-20's 109 and 139; Swin-tiny's 117 and 137. Where the CPU has bf16 natively, no one precision
#: is the faster for every model.
PrecisionSetting = Literal["fp32", "bf16", "fastest"]
FASTEST_TRIAL_STEPS = 3
BF16_MIN_GAIN = 0.10


class DistillConfig(BaseModel):
    """How a pruned model is distilled from the original (``steps=0``: not at all)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=0, ge=0, description="Optimizer steps (0: off).")
    lr: float = Field(default=3e-4, gt=0.0, description="Peak AdamW learning rate.")
    batch_size: int = Field(default=64, ge=1, description="Images per step.")
    temperature: float = Field(
        default=DISTILL_TEMPERATURE,
        gt=0.0,
        description="Softmax temperature of the KL loss (see DISTILL_TEMPERATURE's measurements).",
    )
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay.")
    device: str = Field(default="cpu", pattern=r"^(cpu|auto|cuda(:\d+)?)$", description="cpu, cuda or auto.")
    seed: int = Field(default=0, description="Seed of batch sampling, augmentation and dropout.")
    augment: bool = Field(default=True, description="Random horizontal flips and small translations.")
    feature_weight: float = Field(
        default=0.0,
        ge=0.0,
        description="Weight of matching the teacher's block outputs (blocks of ModuleList/Sequential containers "
        "whose output has the same shape in both models), each as a mean squared error relative to the "
        "teacher's mean square; 0: logits only.",
    )
    precision: PrecisionSetting = Field(
        default="fp32",
        description="Precision of the forward passes: bf16 runs them under autocast (weights, gradients and the "
        "optimizer stay FP32); worth it only where the device computes bf16 natively (AMX-BF16, AVX512-BF16, "
        "CUDA), elsewhere slower than FP32, and not for every model even there; fastest: time a few steps in "
        "each first (FASTEST_TRIAL_STEPS) and take the faster (bf16 only by BF16_MIN_GAIN).",
    )


class DistillReport(BaseModel):
    """What distillation did: losses are means over the first and last ~10 % of steps."""

    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    cpu_seconds: float | None = Field(
        default=None,
        description="On a CPU: the process's CPU time while training, over torch's threads, what the training takes "
        "on an otherwise idle machine (None on another device, or from an older run).",
    )
    device: str = "cpu"
    loss_first: float = 0.0
    loss_last: float = 0.0
    lr: float = 0.0
    temperature: float = 0.0
    precision: str = "fp32"


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` on softened logits, averaged over rows (logits of any rank)."""
    s = student.float().reshape(-1, student.shape[-1]) / temperature
    t = teacher.float().reshape(-1, teacher.shape[-1]) / temperature
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")
    return kl * temperature**2


def augment_batch(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per-image random horizontal flip and translation by up to 1/8 of the side (reflect padding).

    Only 4-D (N, C, H, W) batches of at least 8x8 are changed; anything else comes back as it is.
    ``generator`` lives on the CPU, so results do not depend on the device.
    """
    if batch.dim() != 4 or min(batch.shape[-2:]) < 8:
        return batch
    n, _, h, w = batch.shape
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.where(flips.to(batch.device)[:, None, None, None], batch.flip(-1), batch)
    pad = max(1, min(h, w) // 8)
    padded = F.pad(out, (pad, pad, pad, pad), mode="reflect")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator).tolist()
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets)])


def _block_names(model: nn.Module) -> list[str]:
    """Names of the modules held directly by a ModuleList or Sequential (residual blocks, transformer layers)."""
    return [
        f"{name}.{child}" if name else child
        for name, module in model.named_modules()
        if isinstance(module, (nn.ModuleList, nn.Sequential))
        for child, _ in module.named_children()
    ]


def matched_blocks(student: nn.Module, teacher: nn.Module, sample: torch.Tensor) -> list[str]:
    """Blocks (:func:`_block_names`) present in both models by name whose outputs have the same shape on
    ``sample``: the widths pruning left alone (residual streams, hidden states)."""
    in_student = set(_block_names(student))
    names = [n for n in _block_names(teacher) if n in in_student]
    shapes: list[dict[str, tuple[int, ...]]] = []
    for model in (student, teacher):
        outputs, training = _Outputs(model, names), model.training
        try:
            with torch.no_grad():  # eval: BatchNorm statistics must not move
                forward_logits(model.eval(), sample.to(_float_dtype(model)))
        finally:
            outputs.remove()
            model.train(training)
        shapes.append({n: tuple(t.shape) for n, t in outputs.values.items()})
    return [n for n in names if n in shapes[0] and shapes[0][n] == shapes[1].get(n)]


class _Outputs:
    """Forward hooks that keep the named blocks' outputs of the last forward pass."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.values: dict[str, torch.Tensor] = {}
        modules = dict(model.named_modules())
        self.handles = [modules[n].register_forward_hook(self._keep(n)) for n in names]

    def _keep(self, name: str) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is not None:
                self.values[name] = tensor

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def feature_loss(student: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean over the blocks of ``MSE(student, teacher) / mean(teacher^2)``."""
    terms = [
        F.mse_loss(student[n].float(), t.float()) / t.float().pow(2).mean().clamp_min(1e-6)
        for n, t in teacher.items()
        if n in student
    ]
    return torch.stack(terms).mean() if terms else torch.zeros(())


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup over the first ~5 % of steps, then cosine decay to zero."""
    warmup = max(1, round(0.05 * steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup + 1) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _train_mode(model: nn.Module) -> None:
    """The student learns the function it will be deployed as: every module in eval mode (gradients flow all the
    same). BatchNorm's running statistics must not move (they were just recalibrated, batches are small), and
    dropout or stochastic depth would train a noisier function than the one judged: a plain-PyTorch CIFAR ViT
    (``nn.TransformerEncoderLayer``, dropout 0.1 by default) came out of each of five distillations 0.5-2 points
    worse than it went in."""
    model.eval()


def _float_dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _device_of(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


class _Step:
    """One optimizer step of distillation: the teacher's logits (and block outputs) on a batch, the student's loss
    against them, its gradient clipped at norm 1, and the optimizer's step; returns the loss."""

    def __init__(
        self, student: nn.Module, teacher: nn.Module, config: DistillConfig, blocks: list[str], device: torch.device
    ) -> None:
        self.student, self.teacher, self.config, self.device = student, teacher, config, device
        self.teacher_dtype = _float_dtype(teacher)
        self.trainable = [p for p in student.parameters() if p.requires_grad]
        self.student_outputs, self.teacher_outputs = _Outputs(student, blocks), _Outputs(teacher, blocks)
        self.blocks = blocks

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.trainable, lr=self.config.lr, weight_decay=self.config.weight_decay)

    def __call__(self, batch: torch.Tensor, optimizer: torch.optim.Optimizer, precision: Precision) -> float:
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
        with torch.no_grad(), autocast:
            target = forward_logits(self.teacher, batch.to(self.teacher_dtype)).float()
        with autocast:
            logits = forward_logits(self.student, batch)
        loss = distill_loss(logits, target, self.config.temperature)
        if self.blocks:
            teacher = {k: v.detach() for k, v in self.teacher_outputs.values.items()}
            loss = loss + self.config.feature_weight * feature_loss(self.student_outputs.values, teacher)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        optimizer.step()
        return float(loss.detach())

    def fastest(self, batch: torch.Tensor) -> Precision:
        """The precision whose steps on ``batch`` take less time (bf16 only by :data:`BF16_MIN_GAIN`), each timed
        over :data:`FASTEST_TRIAL_STEPS` after one to warm up; the student comes back as it was."""
        saved = {k: v.detach().clone() for k, v in self.student.state_dict().items()}
        seconds: dict[Precision, float] = {}
        try:
            for precision in ("fp32", "bf16"):
                optimizer = self.optimizer()
                self(batch, optimizer, precision)
                start = time.perf_counter()
                for _ in range(FASTEST_TRIAL_STEPS):
                    self(batch, optimizer, precision)
                seconds[precision] = time.perf_counter() - start
        finally:
            self.student.load_state_dict(saved)
        chosen: Precision = "bf16" if seconds["bf16"] < (1.0 - BF16_MIN_GAIN) * seconds["fp32"] else "fp32"
        logger.info(
            "distillation steps: %.0f ms in FP32, %.0f ms in bf16: %s",
            1000 * seconds["fp32"] / FASTEST_TRIAL_STEPS,
            1000 * seconds["bf16"] / FASTEST_TRIAL_STEPS,
            chosen,
        )
        return chosen

    def remove(self) -> None:
        self.student_outputs.remove()
        self.teacher_outputs.remove()


@counts_as("distil")
def distill_(student: nn.Module, teacher: nn.Module, images: torch.Tensor, config: DistillConfig) -> DistillReport:
    """Fine-tune ``student`` IN PLACE to match ``teacher``'s logits on ``images``; see the module doc.

    ``images`` is a preprocessed (N, ...) float batch. The student comes back in eval mode on its original
    device and dtype, with its ``requires_grad`` flags unchanged; the teacher is never modified.
    """
    if config.steps == 0 or len(images) == 0:
        return DistillReport(samples=len(images), lr=config.lr, temperature=config.temperature)
    device = resolve_device(config.device)
    student_device, student_dtype = _device_of(student), _float_dtype(student)
    teacher_device, teacher_training = _device_of(teacher), teacher.training
    flags = {name: p.requires_grad for name, p in student.named_parameters()}
    if not any(flags.values()):
        raise ValueError("the student has no trainable parameter (all requires_grad=False)")
    n, batch_size, steps = len(images), min(config.batch_size, len(images)), config.steps
    student.to(device=device, dtype=torch.float32)
    teacher.to(device=device).eval()
    generator = torch.Generator().manual_seed(config.seed)
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    log_every = max(1, steps // 10)
    blocks = matched_blocks(student, teacher, images[:1].to(device)) if config.feature_weight > 0 else []
    if blocks:
        logger.info(
            "matching %d block outputs: %s", len(blocks), ", ".join(blocks[:4]) + (" ..." if len(blocks) > 4 else "")
        )
    step = _Step(student, teacher, config, blocks, device)
    precision: Precision = "fp32" if config.precision == "fastest" else config.precision
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            _train_mode(student)
            if config.precision == "fastest":
                precision = step.fastest(images[:batch_size].to(device=device, dtype=torch.float32))
            torch.manual_seed(config.seed)  # dropout
            logger.info(
                "distilling %d steps on %d images (batch %d) on %s in %s", steps, n, batch_size, device, precision
            )
            optimizer = step.optimizer()
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: _lr_factor(i, steps))
            for i in range(steps):
                if len(order) < batch_size:  # a new epoch: every image once, in a seeded order
                    order = torch.cat([order, torch.randperm(n, generator=generator)])
                index, order = order[:batch_size], order[batch_size:]
                batch = images[index].to(device=device, dtype=torch.float32)
                losses.append(step(augment_batch(batch, generator) if config.augment else batch, optimizer, precision))
                scheduler.step()
                if (i + 1) % log_every == 0 or i + 1 == steps:
                    recent = losses[-log_every:]
                    logger.info("distill step %d/%d: loss %.4f", i + 1, steps, sum(recent) / len(recent))
    finally:
        step.remove()
        student.to(device=student_device, dtype=student_dtype).eval()
        teacher.to(device=teacher_device).train(teacher_training)
        for name, p in student.named_parameters():
            p.requires_grad_(flags.get(name, p.requires_grad))
            p.grad = None
    seconds = time.perf_counter() - start
    cpu_seconds = (time.process_time() - cpu_start) / max(1, torch.get_num_threads())
    tail = max(1, round(0.1 * len(losses)))
    return DistillReport(
        steps=len(losses),
        samples=n,
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu_seconds, 3) if device.type == "cpu" else None,
        device=str(device),
        loss_first=sum(losses[:tail]) / tail,
        loss_last=sum(losses[-tail:]) / tail,
        lr=config.lr,
        temperature=config.temperature,
        precision=precision,
    )
