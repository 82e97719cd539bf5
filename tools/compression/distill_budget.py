"""How much automatic distillation a run affords: steps per student, distillations after the search, the
recipe of each (:class:`~tools.compression.distill.DistillConfig`), from the model's MACs and the time the pairs
distilled so far took."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tools.compression.distill import DistillConfig, PrecisionSetting

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
    "LONGEST_PAIR_SECONDS",
    "MIN_RESCUES",
    "SOLO_STEPS_FACTOR",
    "TRAINING_MACS_PER_SECOND",
    "DistilledPair",
    "auto_distill_config",
    "auto_distill_floor_seconds",
    "auto_distill_steps",
    "auto_rescue_config",
    "auto_rescue_plan",
    "auto_rescues",
    "depth_rescue_steps",
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
#: Unlabelled images automatic distillation asks for (the calibration ones included), and the fewest it runs on.
AUTO_DISTILL_IMAGES = (1024, 4096)


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
#: about this many seconds in all, at most the second figure; planned at :data:`TRAINING_MACS_PER_SECOND`, then
#: counted at the time the pairs took (:func:`auto_rescues`). 600, not 1,200 s: with students of automatic
#: distillation's steps (:func:`auto_rescue_plan`, 300-359 for the CIFAR models) CIFAR ResNet-20 ran in 339 s and
#: kept 12.8 % (15.4 % in 1,137 s with 1,000-step students and 1,200 s), ViT-tiny in 280 s and kept 64.5 % (69.9 %
#: in 1,273 s; one AMD EPYC Zen 4 core beside another run, issue 91). At most five: a run whose distilled rounds
#: keep coming back within budget grows its target one step a distillation (``agents.planning.recovery``:
#: ``COMPLETE_RECOVERY_STEP``, or ``WHOLE_RECOVERY_STEP`` where every one came back whole); with three, CIFAR
#: ResNet-32 and -44 stopped at 13.7 % and 15.4 % with time left.
AUTO_RESCUE_SECONDS = (600.0, 5)

#: A round that removes whole layers is distilled from the top of :data:`AUTO_DISTILL_STEPS` (times
#: :data:`DEPTH_STEPS_FACTOR`) where a pair of that many takes at most this long at :data:`TRAINING_MACS_PER_SECOND`
#: (seconds; the CPUs measured beat that rate 2-6x): CIFAR ResNet-20, not ResNet-56 (:func:`depth_rescue_steps`).
LONGEST_PAIR_SECONDS = 1200.0

#: The steps of each student of distillation after the search for a round that removes whole layers (blocks), as a
#: multiple of a round of widths' (:func:`depth_rescue_steps`): a removed block's function is learnt anew by the
#: layers around it, which the plan's steps, enough for width, are not. Measured (``benchmarks/block_removal.py``,
#: one Xeon core, bf16, 1-point budget; unseen = the other half of CIFAR-10's test split): CIFAR ResNet-20's three
#: cheapest blocks
#: (10.3 % fewer parameters, 57 points lost training-free, 1.35x OpenVINO int8 of the original) came back at
#: -1.28 / -2.06 unseen with students of 1,000 steps (-2.34 cross-fitted in the run) and at -0.40 / -0.68 with 3,000
#: (-0.04 in the run). A pair takes that many times longer; :func:`auto_rescues` counts it per step.
DEPTH_STEPS_FACTOR = 3

#: Weight of matching the teacher's block outputs in automatic distillation (:attr:`DistillConfig.feature_weight`):
#: ViT-tiny's students, 1,000 steps, agreed with the original on 96.5-96.6 % of unseen images with it and 95.8 %
#: without; Swin-tiny's (300 steps) lost -0.72/-1.02 instead of -0.92/-1.02.
AUTO_FEATURE_WEIGHT = 1.0


#: A distillation after the search that trains one student on the fit images (the run's extra images among them:
#: ``tools.stages.cross_fit.solo``) gives it this many times the steps of each of a cross-fitted pair's two: the time of
#: the pair. Measured (``benchmarks/cross_fit_distill.py``, one AMD EPYC Zen 4 core, bf16, unseen = the other half of
#: CIFAR-10's test split): CIFAR ResNet-20 pruned by 28 % (-7.6 points repaired) came back at -1.80 / -1.72 after
#: 5,000 steps on 2,035 images and at -0.90 with the 50,000 CIFAR-10 training images added; its 19 % round at
#: -0.94 / -0.68 after 2,000 steps on 2,035 images, -0.74 with them: more images pay once students train long.
SOLO_STEPS_FACTOR = 2


def _seconds_per_step(macs: int) -> float:
    return 4 * macs * AUTO_DISTILL_BATCH / TRAINING_MACS_PER_SECOND


def auto_distill_floor_seconds(macs: int) -> float:
    """Seconds the fewest steps of automatic distillation (:data:`AUTO_DISTILL_STEPS`) take for a model of ``macs``
    per image at the planned rate (:data:`TRAINING_MACS_PER_SECOND`): over the limit of :data:`AUTO_DISTILL_SECONDS`,
    automatic distillation is off."""
    return AUTO_DISTILL_STEPS[0] * _seconds_per_step(macs)


def auto_rescue_plan(macs: int | None) -> tuple[int, int]:
    """``(rescues, steps of each student)`` of distillation after the search for a model of ``macs`` per image
    (see :data:`AUTO_RESCUE_SECONDS`): students of a round of widths take automatic distillation's steps
    (:func:`auto_distill_steps`: about 150 s at the assumed rate); ``(0, 0)`` where automatic distillation is off.
    Measured with ``benchmarks/cross_fit_distill.py`` (one AMD EPYC Zen 4 core beside another job; unseen = the other
    half of CIFAR-10's test split; the two students' change and agreement with the original): CIFAR ResNet-20's 6 %
    round came back at -0.02 / -0.30, 95.3 / 95.7 % with 300 steps (29 s a student) and -0.24 / -0.28, 95.5 / 95.6 %
    with 1,000 (94-117 s); ViT-tiny's 70 % round at -0.90 / -0.80, 93.3 / 93.1 % with 300 (28 s in FP32) and
    -0.54 / -0.68, 94.8 / 95.0 % with 1,000 (84 s). Students of 1,000 steps for ViT-tiny kept 69.9 % in 1,273 s;
    of 359, 64.5 % in 280 s."""
    steps = auto_distill_steps(macs)
    if steps == 0 or not macs:
        return 0, 0
    seconds, most = AUTO_RESCUE_SECONDS
    return max(1, min(most, int(seconds / (2 * steps * _seconds_per_step(macs))))), steps


def depth_rescue_steps(macs: int | None) -> int:
    """Steps of each student of distillation after the search for a round that removes whole layers: the top of
    :data:`AUTO_DISTILL_STEPS` where a pair of them takes at most :data:`LONGEST_PAIR_SECONDS` at the assumed rate,
    else automatic distillation's, times :data:`DEPTH_STEPS_FACTOR`; 0 where automatic distillation is off."""
    steps = auto_distill_steps(macs)
    if steps == 0 or not macs:
        return 0
    longest = AUTO_DISTILL_STEPS[1]
    return DEPTH_STEPS_FACTOR * (longest if 2 * longest * _seconds_per_step(macs) <= LONGEST_PAIR_SECONDS else steps)


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
    """Steps of each student of the next pair for a round of widths (a depth round's: :func:`depth_rescue_steps`):
    the plan's (:func:`auto_rescue_plan`), or where that is more than the floor of :data:`AUTO_DISTILL_STEPS` and,
    at the time the ``pairs`` made so far took, fewer than :data:`MIN_RESCUES` pairs of that many would fit in all,
    the floor, where more of those fit; 0 where automatic distillation is off."""
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
    precision: PrecisionSetting = "fp32",
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
    precision: PrecisionSetting = "fp32",
    sheds_layers: bool = False,
    pairs: Sequence[DistilledPair] = (),
    attention: bool = False,
) -> DistillConfig | None:
    """The :class:`DistillConfig` of each student of distillation after the search (:func:`rescue_steps`' steps
    after the ``pairs`` made so far; None: off). The steps never grow with the measured time: where the plan gives
    300, the time a pair of 1,000 would take buys more pairs instead, which count more (CIFAR ResNet-44: a second pair
    of 1,000 steps left no time for a third distillation, 11.8 % fewer parameters kept, against 16.1 % with three
    pairs of 300); where pairs of 1,000 take so long that fewer than :data:`MIN_RESCUES` fit, they shrink to 300.
    ``sheds_layers``: the round removes whole layers, and its students take :func:`depth_rescue_steps`, shrunk
    never: a removed block is learnt anew, and ResNet-20's three blocks came back at -1.28 /
    -2.06 unseen with 1,000 steps, at -0.40 / -0.68 with 3,000. ``attention``: as :func:`auto_distill_config`'s."""
    config = auto_distill_config(macs, device=device, seed=seed, precision=precision, attention=attention)
    if config is None:
        return None
    steps = depth_rescue_steps(macs) if sheds_layers else rescue_steps(macs, pairs)
    return config.model_copy(update={"steps": steps})
