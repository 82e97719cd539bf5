"""Optional knowledge distillation after pruning: one verb, :func:`distill_`, with a :class:`DistillConfig`.

The pruned (and repaired) student is fine-tuned IN PLACE to match the original teacher's logits on
unlabeled, already preprocessed images: the loss is Hinton's KL divergence between the softened
distributions, ``T^2 * KL(softmax(t / T) || softmax(s / T))``. AdamW, cosine learning-rate decay after a
short linear warmup, gradient clipping at norm 1, seeded mini-batches (every image once per epoch) and,
for image batches, seeded random horizontal flips and small translations (reflect-padded crops).
The student trains in eval mode: BatchNorm statistics stay as they are (just recalibrated; batches are small) and
dropout stays off, so it learns the function it is deployed as; frozen parameters stay frozen. Where the layers
before the first one pruning changed can be cut off (:mod:`tools.compression.distill_cache`, ``config.cache``), only
what follows them trains, from their outputs and the teacher's cached once for a few fixed views of each image.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from tools.clock import counts_as
from tools.compression.calibration import chunks, pass_images
from tools.compression.distill_cache import PrefixCut, ViewCache, plan_cache
from tools.compression.distill_loss import augment_batch, distill_loss, feature_loss
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
    cache: bool = Field(
        default=True,
        description="Where the layers before the first one pruning changed can be cut off (tools.compression."
        "distill_cache), train only what follows, from their outputs and the teacher's cached for a few fixed views "
        "of each image (those layers stay as they are); used only where estimated MIN_SPEEDUP faster.",
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
    cached_from: str = Field(
        default="", description="The module whose outputs were cached (layers up to it frozen); empty: none."
    )
    views: int = Field(default=0, ge=0, description="Cached views of each image (0: no cache).")


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
    against them, its gradient clipped at norm 1, and the optimizer's step; returns the loss. Its batches are drawn
    from :attr:`pool` items (the images; :meth:`batch` makes one of the items drawn)."""

    def __init__(
        self,
        student: nn.Module,
        teacher: nn.Module,
        config: DistillConfig,
        blocks: list[str],
        device: torch.device,
        images: torch.Tensor,
    ) -> None:
        self.student, self.teacher, self.config, self.device = student, teacher, config, device
        self.teacher_dtype = _float_dtype(teacher)
        self.trainable = [p for p in student.parameters() if p.requires_grad]
        self.student_outputs, self.teacher_outputs = _Outputs(student, blocks), _Outputs(teacher, blocks)
        self.blocks, self.images = blocks, images
        self.pool = len(images)

    def batch(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The images of ``index``, augmented where the config says so."""
        batch = self.images[index].to(device=self.device, dtype=torch.float32)
        return augment_batch(batch, generator) if self.config.augment else batch

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.trainable, lr=self.config.lr, weight_decay=self.config.weight_decay)

    def _teacher(
        self, batch: torch.Tensor, precision: Precision, size: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """The teacher's logits and block outputs on ``batch``, and the images a chunk of the student's pass holds:
        large images a few at a time (``calibration.pass_images``), all at once where a block's output does not have
        the images first (a sequence-first layer)."""
        size = size or pass_images(batch, len(batch))
        logits: list[torch.Tensor] = []
        kept: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            for part in batch.split(size):
                logits.append(forward_logits(self.teacher, part.to(self.teacher_dtype)).float())
                for name, value in self.teacher_outputs.values.items():
                    if size < len(batch) and value.shape[0] != len(part):
                        return self._teacher(batch, precision, len(batch))
                    kept.setdefault(name, []).append(value.detach())
        if len(logits) == 1:
            return logits[0], {n: v[0] for n, v in kept.items()}, size
        return torch.cat(logits), {n: torch.cat(v) for n, v in kept.items()}, size

    def _student(self, part: torch.Tensor, precision: Precision) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            return forward_logits(self.student, part)

    def __call__(self, batch: torch.Tensor, optimizer: torch.optim.Optimizer, precision: Precision) -> float:
        """One step; the student's pass over large images in chunks (:meth:`_teacher`), their gradients summed,
        each chunk's loss weighted by its share of the batch: the step a whole batch gives (the student runs in eval
        mode, so no image's output depends on another's; the block outputs' scales are the whole batch's)."""
        target, teacher, size = self._teacher(batch, precision)
        scales = {n: t.float().pow(2).mean().clamp_min(1e-6) for n, t in teacher.items()}
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for start in range(0, len(batch), size):
            rows = slice(start, start + size)
            part = batch if size >= len(batch) else batch[rows]  # one chunk: the batch as it is (CIFAR's)
            loss = distill_loss(self._student(part, precision), target[rows], self.config.temperature)
            if self.blocks:
                mine = {n: t[rows] for n, t in teacher.items()}
                loss = loss + self.config.feature_weight * feature_loss(self.student_outputs.values, mine, scales)
            share = len(part) / len(batch)
            (loss * share if share < 1 else loss).backward()
            total += float(loss.detach()) * share
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        optimizer.step()
        return total

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


class _CachedStep(_Step):
    """A step from the cache (:class:`~tools.compression.distill_cache.ViewCache`): ``batch`` holds indices of
    cached views; only the student's layers after the cut run, and only their parameters train."""

    def __init__(
        self, student: nn.Module, teacher: nn.Module, config: DistillConfig, cache: ViewCache, device: torch.device
    ) -> None:
        super().__init__(student, teacher, config, list(cache.blocks), device, cache.prefix)
        frozen = {id(p) for p in cache.cut.frozen}
        self.trainable = [p for p in self.trainable if id(p) not in frozen]
        self.cache = cache

    def batch(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return index

    def _teacher(
        self, batch: torch.Tensor, precision: Precision, size: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        cache = self.cache
        size = size or pass_images(cache.prefix[batch[:1]], len(batch))
        return cache.logits[batch], {n: v[batch] for n, v in cache.blocks.items()}, size

    def _student(self, part: torch.Tensor, precision: Precision) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            return self.cache.cut.suffix(self.student, self.cache.prefix[part])


def _block_bytes(teacher: nn.Module, blocks: list[str], image: torch.Tensor) -> dict[str, int]:
    """Bytes of each of the teacher's ``blocks``' outputs on one image (as cached: FP32)."""
    outputs = _Outputs(teacher, blocks)
    try:
        with torch.no_grad():
            forward_logits(teacher, image.to(_float_dtype(teacher)))
    finally:
        outputs.remove()
    return {name: 4 * t.numel() for name, t in outputs.values.items()}


def _forward_precision(teacher: nn.Module, chunk: torch.Tensor, setting: PrecisionSetting) -> Precision:
    """The precision of the cache's forward passes: the setting's, or for ``fastest`` the faster of the teacher's
    forward passes on ``chunk`` (bf16 only by :data:`BF16_MIN_GAIN`; CIFAR ResNet-20 on one AMD EPYC Zen 4 core,
    batches of 64: 1.41 ms an image in FP32, 0.61 in bf16)."""
    if setting != "fastest":
        return setting
    seconds: dict[Precision, float] = {}
    for precision in ("fp32", "bf16"):
        with torch.no_grad(), torch.autocast(chunk.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            forward_logits(teacher, chunk)
            start = time.perf_counter()
            forward_logits(teacher, chunk)
            seconds[precision] = time.perf_counter() - start
    return "bf16" if seconds["bf16"] < (1.0 - BF16_MIN_GAIN) * seconds["fp32"] else "fp32"


#: Images a chunk of the view cache's passes holds (fewer where images are large, ``chunks``: the teacher's pass over
#: 64 random 260-px images through EfficientNet-Lite2 on one AMD EPYC Zen 4 core took 7.0 s as one chunk, 2.4 s in
#: chunks of 2; in bf16 3.1 and 1.4 s). 32-px CIFAR images still go 64 at a time: the same views as before.
_VIEW_CHUNK = 64


def _cache_views(
    cut: PrefixCut,
    views: int,
    models: tuple[nn.Module, nn.Module],
    images: torch.Tensor,
    blocks: list[str],
    setting: PrecisionSetting,
    generator: torch.Generator,
) -> ViewCache:
    """``views`` views of every image (the first as it is, the others augmented; view ``v`` of image ``i`` at
    ``v * len(images) + i``): the student's output at the cut, the teacher's logits and its outputs of ``blocks``,
    each kept in FP32, computed in the precision :func:`_forward_precision` picks."""
    student, teacher = models
    device = _device_of(student)
    prefixes, logits, kept = [], [], {b: [] for b in blocks}  # type: ignore[var-annotated]
    outputs, dtype = _Outputs(teacher, blocks), _float_dtype(teacher)
    sample = images[: pass_images(images, _VIEW_CHUNK)]  # timed as the cache runs: one chunk
    precision = _forward_precision(teacher, sample.to(device=device, dtype=dtype), setting)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    try:
        with torch.no_grad(), autocast:
            for view in range(views):
                for chunk in chunks(images, _VIEW_CHUNK):  # large images a few at a time: see chunks
                    x = chunk.to(device=device, dtype=torch.float32)
                    x = augment_batch(x, generator) if view else x
                    prefixes.append(cut.prefix(student, x).float())
                    logits.append(forward_logits(teacher, x.to(dtype)).float())
                    for b in blocks:
                        kept[b].append(outputs.values[b].float())
    finally:
        outputs.remove()
    logger.info("cached %d views of %d images in %s", views, len(images), precision)
    return ViewCache(cut, views, torch.cat(prefixes), torch.cat(logits), {b: torch.cat(v) for b, v in kept.items()})


def _cached(
    student: nn.Module,
    teacher: nn.Module,
    images: torch.Tensor,
    config: DistillConfig,
    blocks: list[str],
    device: torch.device,
    generator: torch.Generator,
) -> ViewCache | None:
    """The cache of views where caching is on and worth it (:func:`~tools.compression.distill_cache.plan_cache`)."""
    if not config.cache:
        return None
    samples = config.steps * min(config.batch_size, len(images))
    if len(images) > samples:  # more images than the steps draw (extra images): cache as many as they draw, each once
        images = images[torch.randperm(len(images), generator=generator)[:samples]]
    block_bytes = _block_bytes(teacher, blocks, images[:1].to(device)) if blocks else {}
    planned = plan_cache(
        student, teacher, images, samples=samples, augment=config.augment, block_bytes=block_bytes, device=device
    )
    if planned is None:
        return None
    cut, views = planned
    suffix_blocks = [b for b in blocks if b not in cut.done]
    return _cache_views(cut, views, (student, teacher), images, suffix_blocks, config.precision, generator)


def _train(step: _Step, steps: int, batch_size: int, precision: Precision, generator: torch.Generator) -> list[float]:
    """``steps`` optimizer steps of ``step`` on seeded batches (every item of its pool once per epoch), the learning
    rate warmed up and decayed (:func:`_lr_factor`); the losses."""
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    log_every = max(1, steps // 10)
    optimizer = step.optimizer()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: _lr_factor(i, steps))
    for i in range(steps):
        if len(order) < batch_size:  # a new epoch: every item once, in a seeded order
            order = torch.cat([order, torch.randperm(step.pool, generator=generator)])
        index, order = order[:batch_size], order[batch_size:]
        losses.append(step(step.batch(index, generator), optimizer, precision))
        scheduler.step()
        if (i + 1) % log_every == 0 or i + 1 == steps:
            recent = losses[-log_every:]
            logger.info("distill step %d/%d: loss %.4f", i + 1, steps, sum(recent) / len(recent))
    return losses


@dataclass(frozen=True)
class _Placement:
    """Where the student and the teacher were before distillation, and which of the student's parameters trained."""

    student_device: torch.device
    student_dtype: torch.dtype
    teacher_device: torch.device
    teacher_training: bool
    flags: dict[str, bool]

    @classmethod
    def of(cls, student: nn.Module, teacher: nn.Module) -> _Placement:
        """Where ``student`` and ``teacher`` are now."""
        flags = {name: p.requires_grad for name, p in student.named_parameters()}
        return cls(_device_of(student), _float_dtype(student), _device_of(teacher), teacher.training, flags)

    def restore(self, student: nn.Module, teacher: nn.Module) -> None:
        """Put both models back, the student in eval mode with its ``requires_grad`` flags and no gradients."""
        student.to(device=self.student_device, dtype=self.student_dtype).eval()
        teacher.to(device=self.teacher_device).train(self.teacher_training)
        for name, p in student.named_parameters():
            p.requires_grad_(self.flags.get(name, p.requires_grad))
            p.grad = None


def _feature_blocks(
    student: nn.Module, teacher: nn.Module, images: torch.Tensor, config: DistillConfig, device: torch.device
) -> list[str]:
    """The blocks whose outputs the student is taught to match (:func:`matched_blocks`; none without a
    ``feature_weight``)."""
    blocks = matched_blocks(student, teacher, images[:1].to(device)) if config.feature_weight > 0 else []
    if blocks:
        logger.info(
            "matching %d block outputs: %s", len(blocks), ", ".join(blocks[:4]) + (" ..." if len(blocks) > 4 else "")
        )
    return blocks


def _report(
    losses: list[float],
    n: int,
    config: DistillConfig,
    device: torch.device,
    precision: Precision,
    cache: ViewCache | None,
    started: tuple[float, float],
) -> DistillReport:
    """What distillation did: ``losses`` of its steps on ``n`` images, timed from ``started`` (the wall clock and the
    process's CPU time)."""
    seconds = time.perf_counter() - started[0]
    cpu_seconds = (time.process_time() - started[1]) / max(1, torch.get_num_threads())
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
        cached_from=cache.cut.name if cache is not None else "",
        views=cache.views if cache is not None else 0,
    )


@counts_as("distil")
def distill_(student: nn.Module, teacher: nn.Module, images: torch.Tensor, config: DistillConfig) -> DistillReport:
    """Fine-tune ``student`` IN PLACE to match ``teacher``'s logits on ``images``; see the module doc.

    ``images`` is a preprocessed (N, ...) float batch. The student comes back in eval mode on its original
    device and dtype, with its ``requires_grad`` flags unchanged; the teacher is never modified.
    """
    if config.steps == 0 or len(images) == 0:
        return DistillReport(samples=len(images), lr=config.lr, temperature=config.temperature)
    device = resolve_device(config.device)
    placement = _Placement.of(student, teacher)
    if not any(placement.flags.values()):
        raise ValueError("the student has no trainable parameter (all requires_grad=False)")
    n, batch_size, steps = len(images), min(config.batch_size, len(images)), config.steps
    student.to(device=device, dtype=torch.float32)
    teacher.to(device=device).eval()
    generator = torch.Generator().manual_seed(config.seed)
    losses: list[float] = []
    blocks = _feature_blocks(student, teacher, images, config, device)
    precision: Precision = "fp32" if config.precision == "fastest" else config.precision
    started = time.perf_counter(), time.process_time()
    step: _Step | None = None
    cache: ViewCache | None = None
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            _train_mode(student)
            cache = _cached(student, teacher, images, config, blocks, device, generator)
            step = (
                _Step(student, teacher, config, blocks, device, images)
                if cache is None
                else _CachedStep(student, teacher, config, cache, device)
            )
            if config.precision == "fastest":
                trial = torch.arange(batch_size)
                precision = step.fastest(step.batch(trial, torch.Generator().manual_seed(config.seed)))
            torch.manual_seed(config.seed)  # dropout
            logger.info(
                "distilling %d steps on %d images (batch %d) on %s in %s%s",
                steps,
                n,
                batch_size,
                device,
                precision,
                f", from {cache.views} cached views after {cache.cut.name}" if cache is not None else "",
            )
            losses = _train(step, steps, batch_size, precision, generator)
    finally:
        if step is not None:
            step.remove()
        placement.restore(student, teacher)
    return _report(losses, n, config, device, precision, cache, started)
