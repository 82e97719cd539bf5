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
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from tools.compression.forward import forward_logits
from tools.models.base import resolve_device
from tools.profiling.modules import first_tensor

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO_DISTILL_BATCH",
    "AUTO_DISTILL_IMAGES",
    "AUTO_DISTILL_LR",
    "AUTO_DISTILL_LR_ATTENTION",
    "AUTO_DISTILL_SECONDS",
    "AUTO_DISTILL_STEPS",
    "AUTO_FEATURE_WEIGHT",
    "AUTO_RESCUE_SECONDS",
    "DEPTH_STEPS_FACTOR",
    "DISTILL_TEMPERATURE",
    "MIN_RESCUES",
    "TRAINING_MACS_PER_SECOND",
    "DistillConfig",
    "DistillReport",
    "DistilledPair",
    "Precision",
    "augment_batch",
    "auto_distill_config",
    "auto_distill_floor_seconds",
    "auto_distill_steps",
    "auto_rescue_config",
    "auto_rescue_plan",
    "auto_rescues",
    "distill_",
    "distill_loss",
    "feature_loss",
    "matched_blocks",
    "rescue_steps",
    "training_seconds",
]

#: Automatic distillation (``--finetune-steps auto``): as many steps as take about the first of these per round,
#: at least the floor of :data:`AUTO_DISTILL_STEPS` where that many take at most the second (seconds) ...
AUTO_DISTILL_SECONDS = (150.0, 600.0)
#: ... at this MAC rate of a step (the teacher's forward pass, the student's and its backward pass, counted as four
#: forward passes of the batch), measured on one AVX2 core (CIFAR ResNet-20 and -56, batches of 32 and 64:
#: 0.9-1.2e10): a fixed figure, so the count never depends on timing ...
TRAINING_MACS_PER_SECOND = 1e10
#: ... between these bounds. Fewer steps do not repair (CIFAR ResNet-20, 13.9 % fewer parameters, -2.36 points
#: after recovery: 100 steps of 32 images at 1e-3 -1.98, 150 at 2e-3 -1.08, 300 at 1e-3 -0.14), so a model
#: whose 300 steps take longer than the limit (CIFAR ResNet-110, a 224-px mobile CNN) is not distilled.
AUTO_DISTILL_STEPS = (300, 1000)
#: Images per step and peak learning rate of automatic distillation. 3e-4, not 1e-3: the higher rate moved answers
#: the repair had kept (unseen images, 300 steps of 32 on 1,680 images; change of accuracy, agreement with the
#: original): CIFAR ResNet-56 23.7 % fewer, repaired -1.38 / 93.1 %: 1e-3 -0.62 / 88.3 %, 3e-4 -0.10 / 92.6 %,
#: 1e-4 -0.32 / 93.3 %; ResNet-20 9.4 % fewer (repaired -0.32 / 94.0 %): 1e-3 +0.76 / 91.4 %, 1e-4 +0.34 / 94.5 %;
#: ResNet-20 23.5 % fewer (-3.56 / 86.9 %): 1e-3 -1.12 / 87.4 %, 3e-4 -0.96 / 88.6 %, 1e-4 -1.18 / 88.2 %. Whole
#: runs: the distilled rounds agree with the original on 96.6-98.7 % of unseen images instead of 91.8-96.2 %
#: (ViT-tiny, the CIFAR ResNets' lightly pruned rounds), so their paired intervals are narrower.
AUTO_DISTILL_BATCH = 32
AUTO_DISTILL_LR = 3e-4
#: The peak learning rate of automatic distillation for a model with attention (transformers: LayerNorm, no BatchNorm
#: statistics to keep). Measured with ``benchmarks/cross_fit_distill.py`` (1,000 steps, block outputs matched, bf16,
#: one AMD EPYC core; in the run = the two students cross-fitted on the run's evaluation images, unseen = the other
#: half of CIFAR-10's test split), 3e-4 -> 1e-3: Swin-tiny 38.8 % fewer parameters (-0.59 repaired) in the run -0.13 ->
#: -0.06, unseen -0.44/-0.42 -> -0.26/-0.36, agreement with the original in the run 96.1 -> 96.8 %; its 31.0 % round
#: (-0.61) -0.42 -> -0.23, -0.16/-0.12 -> -0.28/-0.28 (the one figure that fell), 96.4 -> 96.6 %; ViT-tiny 63.9 %
#: (-0.74) -0.25 -> -0.23, -0.56/-0.68 -> -0.50/-0.58, 96.0 -> 96.4 %. The agreement, which sets the budget test's
#: standard error, rose in every case. At 2e-3 Swin-tiny's 38.8 % round came back at -0.17 in the run (96.2 %).
AUTO_DISTILL_LR_ATTENTION = 1e-3
#: The default softmax temperature (:attr:`DistillConfig.temperature`). Measured with
#: ``benchmarks/cross_fit_distill.py`` (the rounds distillation after the search took, two students each, one Xeon
#: core, bf16; in the run = cross-fitted on the evaluation images, unseen = the other half of CIFAR-10's test split),
#: temperature 2 -> 4: CIFAR ResNet-32 16.7 % fewer parameters (300 steps) in the run -0.34 -> +0.00, unseen
#: -0.76/-0.68 -> -0.46/-0.74, agreement with the original on unseen images 92.7/92.3 -> 92.9/92.9 %; its 17.7 % round
#: -0.61 -> -0.08 in the run, -0.94/-0.92 -> -0.66/-0.78 unseen; ViT-tiny 67.2 % (1,000 steps) -0.15 -> -0.06,
#: -0.46/-0.72 -> -0.52/-0.74, 94.6/94.6 -> 94.8/94.7 %; CIFAR ResNet-20 11.8 % (1,000 steps) -0.51 -> -0.57,
#: +0.34/-0.24 -> +0.10/-0.28, 92.0/92.1 -> 92.6/92.8 %. Agreement rose in every case, accuracy by +0.04 on average.
DISTILL_TEMPERATURE = 4.0
#: Unlabelled images automatic distillation asks for (the calibration ones included), and the fewest it runs on.
AUTO_DISTILL_IMAGES = (1024, 4096)


#: The precision of distillation's forward passes (:attr:`DistillConfig.precision`).
Precision = Literal["fp32", "bf16"]


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
    precision: Precision = Field(
        default="fp32",
        description="Precision of the forward passes: bf16 runs them under autocast (weights, gradients and the "
        "optimizer stay FP32); worth it only where the device computes bf16 natively (AMX-BF16, AVX512-BF16, "
        "CUDA), elsewhere slower than FP32.",
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


def auto_distill_steps(macs: int | None) -> int:
    """Steps per round of automatic distillation for a model of ``macs`` per image (see
    :data:`AUTO_DISTILL_SECONDS`); 0 when the floor of :data:`AUTO_DISTILL_STEPS` takes longer than the limit, or
    the MACs are unknown."""
    if not macs or macs <= 0:
        return 0
    (low, high), (target, limit) = AUTO_DISTILL_STEPS, AUTO_DISTILL_SECONDS
    seconds_per_step = _seconds_per_step(macs)
    if low * seconds_per_step > limit:
        return 0
    return max(low, min(high, int(target / seconds_per_step)))


#: Distillation after the search (``--distill-rescues auto``): cross-fitted distillations (two students each) within
#: about this many seconds in all at :data:`TRAINING_MACS_PER_SECOND`, at most the second figure. Each student takes
#: the top of :data:`AUTO_DISTILL_STEPS` where one pair of that many fits: measured on the rounds distillation
#: after the search left over the budget (one Xeon core, unseen images), 1,000 steps instead of 300 raised the
#: students' agreement with the original from 94.7 to 96.5 % (ViT-tiny, 63.9 % fewer parameters) and cut their
#: drop from -0.56/-0.92 to -0.38/-0.58 (CIFAR ResNet-20, 14.7 % fewer). So ViT-tiny, Swin-tiny and ResNet-20 get
#: one pair of 1,000 steps, ResNet-tiny the cap, ResNet-56 one pair of automatic distillation's 300. At most five: the
#: CIFAR ResNets' pairs take 100-300 s on one Xeon core, and a run whose distilled rounds keep coming back within
#: budget grows its target one step a distillation (``agents.planning.recovery``: ``COMPLETE_RECOVERY_STEP``, or
#: ``WHOLE_RECOVERY_STEP`` where every one came back whole); with three,
#: CIFAR ResNet-32 and -44 stopped at 13.7 % and 15.4 % with time left.
AUTO_RESCUE_SECONDS = (1200.0, 5)

#: The steps of each student of distillation after the search for a round that removes whole layers (blocks), as a
#: multiple of :func:`auto_rescue_plan`'s: a removed block's function is learnt anew by the layers around it, which
#: the plan's steps, enough for width, are not. Measured (``benchmarks/block_removal.py``, one Xeon core, bf16,
#: 1-point budget; unseen = the other half of CIFAR-10's test split): CIFAR ResNet-20's three cheapest blocks
#: (10.3 % fewer parameters, 57 points lost training-free, 1.35x OpenVINO int8 of the original) came back at
#: -1.28 / -2.06 unseen with students of 1,000 steps (-2.34 cross-fitted in the run) and at -0.40 / -0.68 with 3,000
#: (-0.04 in the run). A pair takes that many times longer; :func:`auto_rescues` counts it per step.
DEPTH_STEPS_FACTOR = 3

#: Weight of matching the teacher's block outputs in automatic distillation (:attr:`DistillConfig.feature_weight`):
#: ViT-tiny's students, 1,000 steps, agreed with the original on 96.5-96.6 % of unseen images with it and 95.8 %
#: without; Swin-tiny's (300 steps) lost -0.72/-1.02 instead of -0.92/-1.02.
AUTO_FEATURE_WEIGHT = 1.0


def _seconds_per_step(macs: int) -> float:
    return 4 * macs * AUTO_DISTILL_BATCH / TRAINING_MACS_PER_SECOND


def auto_distill_floor_seconds(macs: int) -> float:
    """Seconds the fewest steps of automatic distillation (:data:`AUTO_DISTILL_STEPS`) take for a model of ``macs``
    per image at the planned rate (:data:`TRAINING_MACS_PER_SECOND`): over the limit of :data:`AUTO_DISTILL_SECONDS`,
    automatic distillation is off."""
    return AUTO_DISTILL_STEPS[0] * _seconds_per_step(macs)


def auto_rescue_plan(macs: int | None) -> tuple[int, int]:
    """``(rescues, steps of each student)`` of distillation after the search for a model of ``macs`` per image
    (see :data:`AUTO_RESCUE_SECONDS`); ``(0, 0)`` where automatic distillation is off."""
    steps = auto_distill_steps(macs)
    if steps == 0 or not macs:
        return 0, 0
    seconds, most = AUTO_RESCUE_SECONDS
    longest = AUTO_DISTILL_STEPS[1]
    if 2 * longest * _seconds_per_step(macs) <= seconds:
        steps = longest
    return max(1, min(most, int(seconds / (2 * steps * _seconds_per_step(macs))))), steps


def training_seconds(report: Mapping[str, Any]) -> float:
    """How long a distillation (a :class:`DistillReport` as saved) takes on an otherwise idle machine: its wall time,
    or on a CPU its CPU time over its threads where less, so that another job on the machine does not shrink the
    count :func:`auto_rescues` allows (CIFAR ViT-tiny's pairs of 1,000-step students took 380 and 420 s at 1 thread
    beside one other job on a 2-core AMD EPYC, and that run made two distillations; beside two other jobs a pair took
    726 s, and the run made one)."""
    wall = float(report.get("seconds") or 0.0)
    cpu = report.get("cpu_seconds")
    return min(wall, float(cpu)) if cpu is not None and float(cpu) > 0 else wall


class DistilledPair(NamedTuple):
    """A pair of students distilled after the search, as :func:`auto_rescues` and :func:`rescue_steps` count it."""

    seconds: float  #: both students' training time (:func:`training_seconds`)
    steps: int = 0  #: each student's steps; 0: not known, taken as the plan's
    sheds_layers: bool = False  #: a round that removes whole layers (:data:`DEPTH_STEPS_FACTOR` times the steps)


#: Distillations after the search that the students' steps leave room for where the measured time can: where pairs
#: of the top of :data:`AUTO_DISTILL_STEPS` would let fewer than these fit :data:`AUTO_RESCUE_SECONDS` in all at the
#: time the pairs took, the later students take the floor and more pairs fit (:func:`rescue_steps`). On a CPU without
#: bf16 a pair of CIFAR ResNet-20's 1,000-step students took 643 s of the 1,200 (AVX2 AMD EPYC, FP32): that run made
#: one distillation and kept 6.0 %. Two, not three: a run whose first pair took 556 s and whose second students took
#: 300 steps (three would have fit, not two of 1,000) got back less of the second round's drop (48 % against the
#: first's 73 %), and the smallest share recovered sets the target (``agents.planning.recovery``): no room was left,
#: and three distillations went unspent.
MIN_RESCUES = 2


def _fits(planned_steps: int, pairs: Sequence[DistilledPair], steps: int) -> int:
    """Pairs that fit :data:`AUTO_RESCUE_SECONDS` in all: those made, each counted at its width steps (a depth
    round's extra steps are outside the budget), and more of ``steps`` at the slowest pair's time per step."""
    seconds = AUTO_RESCUE_SECONDS[0]
    spent, per_step = 0.0, 0.0
    for pair in pairs:
        factor = DEPTH_STEPS_FACTOR if pair.sheds_layers else 1
        taken = pair.steps or planned_steps * factor
        spent += pair.seconds / factor
        per_step = max(per_step, pair.seconds / taken)
    return len(pairs) + int((seconds - spent) / (per_step * steps))


def _measured(pairs: Sequence[DistilledPair]) -> bool:
    return bool(pairs) and min(p.seconds for p in pairs) > 0


def rescue_steps(macs: int | None, pairs: Sequence[DistilledPair] = ()) -> int:
    """Steps of each student of the next pair for a round of widths (a depth round's: :func:`auto_rescue_config`):
    the plan's (:func:`auto_rescue_plan`), or where the plan gives the top of :data:`AUTO_DISTILL_STEPS` and, at the
    time the ``pairs`` made so far took, fewer than :data:`MIN_RESCUES` pairs of that many would fit in all, the
    floor, where more of those fit; 0 where automatic distillation is off."""
    planned, steps = auto_rescue_plan(macs)
    floor = AUTO_DISTILL_STEPS[0]
    if planned == 0 or steps <= floor or not _measured(pairs) or _fits(steps, pairs, steps) >= MIN_RESCUES:
        return steps
    return floor if _fits(steps, pairs, floor) > _fits(steps, pairs, steps) else steps


def auto_rescues(macs: int | None, pairs: Sequence[DistilledPair] = ()) -> int:
    """Cross-fitted distillations after the search for a model of ``macs`` per image (:func:`auto_rescue_plan`), or,
    once pairs were distilled (``pairs``: each pair's measured training time, :func:`training_seconds`, and steps),
    as many as fit :data:`AUTO_RESCUE_SECONDS` at the slowest pair's time per step with students of
    :func:`rescue_steps`, if more (at most its cap): the plan assumes one AVX2 core's rate, which the CPUs measured
    beat 2-6x (one Xeon core: a pair of ViT-tiny's 1,000-step students took 158 s, of CIFAR ResNet-44's 300-step ones
    220 s, where the plan assumed 1,200 s and over 600 s). Each pair counts at its width steps, so a depth round's
    longer pair (:data:`DEPTH_STEPS_FACTOR`) takes its extra time outside the budget and does not count as the time of
    every pair after it: CIFAR ResNet-56's pairs of 900 steps took 725-768 s on one Xeon core beside another run,
    and two of them spent the budget before the depth ladder reached the blocks that pay."""
    planned, steps = auto_rescue_plan(macs)
    if planned == 0 or not _measured(pairs):  # none measured yet
        return planned
    return max(planned, min(AUTO_RESCUE_SECONDS[1], _fits(steps, pairs, rescue_steps(macs, pairs))))


def auto_distill_config(
    macs: int | None,
    *,
    device: str = "cpu",
    seed: int = 0,
    precision: Precision = "fp32",
    attention: bool = False,
) -> DistillConfig | None:
    """The :class:`DistillConfig` of automatic distillation for a model of ``macs`` per image (None: off);
    ``attention``: the model has attention modules (:data:`AUTO_DISTILL_LR_ATTENTION`)."""
    steps = auto_distill_steps(macs)
    if steps == 0:
        return None
    return DistillConfig(
        steps=steps,
        lr=AUTO_DISTILL_LR_ATTENTION if attention else AUTO_DISTILL_LR,
        batch_size=AUTO_DISTILL_BATCH,
        feature_weight=AUTO_FEATURE_WEIGHT,
        device=device,
        seed=seed,
        precision=precision,
    )


def auto_rescue_config(
    macs: int | None,
    *,
    device: str = "cpu",
    seed: int = 0,
    precision: Precision = "fp32",
    sheds_layers: bool = False,
    pairs: Sequence[DistilledPair] = (),
    attention: bool = False,
) -> DistillConfig | None:
    """The :class:`DistillConfig` of each student of distillation after the search (:func:`rescue_steps`' steps
    after the ``pairs`` made so far; None: off). The steps never grow with the measured time: where the plan gives
    300, the time a pair of 1,000 would take buys more pairs instead, which count more (CIFAR ResNet-44: a second pair
    of 1,000 steps left no time for a third distillation, 11.8 % fewer parameters kept, against 16.1 % with three
    pairs of 300); where pairs of 1,000 take so long that fewer than :data:`MIN_RESCUES` fit, they shrink to 300.
    ``sheds_layers``: the round removes whole layers, and its students take :data:`DEPTH_STEPS_FACTOR` times the
    plan's steps, shrunk never: a removed block is learnt anew, and ResNet-20's three blocks came back at -1.28 /
    -2.06 unseen with 1,000 steps, at -0.40 / -0.68 with 3,000. ``attention``: as :func:`auto_distill_config`'s."""
    config = auto_distill_config(macs, device=device, seed=seed, precision=precision, attention=attention)
    if config is None:
        return None
    steps = DEPTH_STEPS_FACTOR * auto_rescue_plan(macs)[1] if sheds_layers else rescue_steps(macs, pairs)
    return config.model_copy(update={"steps": steps})


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


def distill_(student: nn.Module, teacher: nn.Module, images: torch.Tensor, config: DistillConfig) -> DistillReport:
    """Fine-tune ``student`` IN PLACE to match ``teacher``'s logits on ``images``; see the module doc.

    ``images`` is a preprocessed (N, ...) float batch. The student comes back in eval mode on its original
    device and dtype, with its ``requires_grad`` flags unchanged; the teacher is never modified.
    """
    if config.steps == 0 or len(images) == 0:
        return DistillReport(samples=len(images), lr=config.lr, temperature=config.temperature)
    device = resolve_device(config.device)
    student_device, student_dtype = _device_of(student), _float_dtype(student)
    teacher_device, teacher_dtype, teacher_training = _device_of(teacher), _float_dtype(teacher), teacher.training
    flags = {name: p.requires_grad for name, p in student.named_parameters()}
    if not any(flags.values()):
        raise ValueError("the student has no trainable parameter (all requires_grad=False)")
    n, batch_size = len(images), min(config.batch_size, len(images))
    steps, temperature = config.steps, config.temperature
    student.to(device=device, dtype=torch.float32)
    teacher.to(device=device).eval()
    trainable = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, steps))
    generator = torch.Generator().manual_seed(config.seed)
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    log_every = max(1, steps // 10)
    bf16 = config.precision == "bf16"

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    blocks = matched_blocks(student, teacher, images[:1].to(device)) if config.feature_weight > 0 else []
    student_outputs, teacher_outputs = _Outputs(student, blocks), _Outputs(teacher, blocks)
    if blocks:
        logger.info(
            "matching %d block outputs: %s", len(blocks), ", ".join(blocks[:4]) + (" ..." if len(blocks) > 4 else "")
        )
    start, cpu_start = time.perf_counter(), time.process_time()
    logger.info("distilling %d steps on %d images (batch %d) on %s%s", steps, n, batch_size, device, " in bf16" * bf16)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(config.seed)  # dropout
            _train_mode(student)
            for step in range(steps):
                if len(order) < batch_size:  # a new epoch: every image once, in a seeded order
                    order = torch.cat([order, torch.randperm(n, generator=generator)])
                index, order = order[:batch_size], order[batch_size:]
                batch = images[index].to(device=device, dtype=torch.float32)
                if config.augment:
                    batch = augment_batch(batch, generator)
                with torch.no_grad(), autocast():
                    target = forward_logits(teacher, batch.to(teacher_dtype)).float()
                with autocast():
                    logits = forward_logits(student, batch)
                loss = distill_loss(logits, target, temperature)
                if blocks:
                    features = feature_loss(
                        student_outputs.values, {k: v.detach() for k, v in teacher_outputs.values.items()}
                    )
                    loss = loss + config.feature_weight * features
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(float(loss.detach()))
                if (step + 1) % log_every == 0 or step + 1 == steps:
                    recent = losses[-log_every:]
                    logger.info("distill step %d/%d: loss %.4f", step + 1, steps, sum(recent) / len(recent))
    finally:
        student_outputs.remove()
        teacher_outputs.remove()
        optimizer.zero_grad(set_to_none=True)
        student.to(device=student_device, dtype=student_dtype).eval()
        teacher.to(device=teacher_device).train(teacher_training)
        for name, p in student.named_parameters():
            p.requires_grad_(flags.get(name, p.requires_grad))
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
        temperature=temperature,
        precision=config.precision,
    )
