"""Sensitivity profile: the measured damage of pruning each prunable unit alone, after recovery.

A *unit* is what a plan can address on its own (:mod:`tools.compression.units`): one attention module's heads or
the width of its heads, one block-internal Conv2d/Linear (an MLP's hidden channels, a residual block's inner
convolution), or one coupled group (a mobile block's expansion and depthwise channels, a residual stage's stream).
For every unit and every ratio, a copy of the original is pruned at that ratio on that unit only, repaired with
the run's recovery, and compared with the original on the calibration images: top-1 agreement, mean KL divergence of
the softmax outputs, and, where labels exist, the accuracy drop. Next to it: the parameters it removes, and
the MACs and latency of the unit's layers (profiled) times the ratio.

The cost is one pruning (a dependency-graph trace for channel units) and one forward pass of what follows the
unit's first change (:class:`~tools.compression.prefix.PrefixCache` replays what runs before it from the original's
outputs): reconstruction refits the consumers and corrects the BatchNorms in that pass, whose logits are the repaired
probe's. The original's activations (importance statistics, reconstruction targets, BatchNorm statistics,
logits, the replayed outputs) are computed once (:class:`~tools.compression.reference.ReferencePasses`). Requested
ratios are probed at what rounding leaves of them (:func:`~tools.compression.units.reachable_ratio`), each once.

The profile is deterministic: the calibration images are a seeded part of the data, their number
(:func:`auto_samples`) follows from the model's MACs, never from a timing, every probe starts from the same
seed, and torch runs with deterministic algorithms meanwhile. So the same model, data, settings and machine
(CPU, thread count, library versions) give the same profile; only ``seconds`` differs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tools.compression.calibration import chunks
from tools.compression.forward import forward_logits, one_line
from tools.compression.prefix import PrefixCache
from tools.compression.pruning import apply_pruning, count_params
from tools.compression.recipes import PruningConfig
from tools.compression.recovery import (
    RecoveryConfig,
    recover_,
    refit_seconds,
)
from tools.compression.reference import ReferencePasses
from tools.compression.repair import held_out_count, kl_agreement
from tools.compression.reports import PruneReport
from tools.compression.units import reachable_ratio, unit_kind, unit_step
from tools.models.base import clone_module
from tools.schemas import (
    LayerProfile,
    PruningRecommendation,
    SensitivityPoint,
    SensitivityProfile,
    SensitivityUnit,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RATIOS",
    "affordable_units",
    "auto_samples",
    "deterministic_torch",
    "measure_sensitivity",
]

#: Ratios each unit is measured at (those above the planner's highest ratio are left out).
DEFAULT_RATIOS: tuple[float, ...] = (0.3, 0.6, 0.9)

#: Share of the calibration images a probe is judged on and not repaired on (the first ones are repaired on).
PROBE_HOLDOUT = 0.5

#: Disagreement with the original past which a unit's larger ratios are not probed.
STOP_DAMAGE = 0.5

#: A probe whose consumers' cross-validated refits would take longer than the first figure (estimated from their
#: shapes), or take the profile's cross-validated refits past the second, refits them at :data:`PROBE_FIXED_RIDGE`
#: instead (one solve a layer, not one per option and fold): in DenseNet a channel of an early layer feeds every later
#: layer of its block, and cross-validating those refits took 90 % of a 12-minute profile (EfficientNet-Lite2's
#: probes take about a minute in all). Rounds keep the cross-validated refit.
MAX_PROBE_REFIT_SECONDS = 10.0
MAX_PROFILE_REFIT_SECONDS = 120.0
PROBE_FIXED_RIDGE = 1e-2


#: Time the automatic sample count aims the whole sensitivity profile at, and its floor in images.
TARGET_SECONDS = 120.0
MIN_SAMPLES = 32
#: The batched forward speed the automatic evaluation size assumes (about a 2-core CPU's on ViT-B/16): a fixed
#: figure rather than a measured one, so that the count, hence the profile and the plans, never depend on timing.
ASSUMED_MACS_PER_SECOND = 5e10
#: The speed the sensitivity profile's sample count assumes, one thread, and the forward passes a probe costs (the
#: refitting pass and, for BatchNorm models, the logits pass). Measured on a 2-core AMD EPYC at 1 thread with the
#: other core busy: ResNet-18 at 224 px 7.5·10⁹ MAC/s, MobileNetV2 2.2·10⁹ (depthwise convolutions). At 5·10¹⁰ a
#: 224-px MobileNetV2 was probed on 240 images (a 26-minute profile), CIFAR ResNet-56 on 256 (744 s); at this rate
#: 49 and 102. ResNet-56's unit damages on 51 images ranked as on 256 with Spearman 0.86 (87 points).
SENSITIVITY_MACS_PER_SECOND = 2e10
PASSES_PER_PROBE = 2


def auto_samples(macs: int, probes: int, available: int, seconds: float = TARGET_SECONDS) -> int:
    """Calibration images to probe with so that ``probes`` probes take about ``seconds``.

    ``macs`` is the model's count per image; the time per image is estimated from it at
    :data:`SENSITIVITY_MACS_PER_SECOND`, :data:`PASSES_PER_PROBE` passes a probe, so the answer is the same on every
    run. At least :data:`MIN_SAMPLES`, at most ``available``: small models use every calibration image, ViT-B/16 the
    floor.
    """
    if macs <= 0 or probes <= 0:
        return available
    per_image_s = macs / SENSITIVITY_MACS_PER_SECOND
    passes = PASSES_PER_PROBE * probes + 3
    return max(min(available, MIN_SAMPLES), min(available, int(seconds / (per_image_s * passes))))


#: A probe's cost counts each layer's output values at this many MACs: on a CPU the element-wise work a mobile network
#: does around its convolutions (BatchNorm, ReLU6, padding, depthwise convolutions) costs far more than its MACs say.
#: Measured at one thread: EfficientNet-Lite2 (898 M MACs, 33 M output values an image) at about 5·10⁹ MAC/s where
#: a ResNet-18 runs 7.5·10⁹ and the profile assumes 2·10¹⁰; at 64 its cost is 3.0·10⁹ MAC-equivalents.
VALUE_COST_MACS = 64


def _layer_costs(layers: Sequence[LayerProfile]) -> list[float]:
    """Each layer's cost in MAC-equivalents an image (its MACs and :data:`VALUE_COST_MACS` per output value)."""
    return [lp.macs + VALUE_COST_MACS * (math.prod(lp.output_shape[1:]) if lp.output_shape else 0) for lp in layers]


def affordable_units(
    units: Sequence[SensitivityUnit],
    layers: Sequence[LayerProfile],
    images: int,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    seconds: float = TARGET_SECONDS,
    *,
    latency: bool = False,
) -> tuple[list[SensitivityUnit], dict[str, str]]:
    """The units the profile probes within about ``seconds`` on ``images`` images (at the assumed rate, in
    MAC-equivalents: a fixed figure, so the choice never depends on timing), and why the others are not probed.

    A probe runs what follows the unit's first layer, once for each of the unit's ratios its kind probes
    (``UnitKind.probe_ratios``: a block one, removed whole; channels each of ``ratios``); units are taken by their
    saving per cost of their probes, best first, until the time is spent; every unit where it all fits. The saving
    is the unit's layers' share of the parameters plus of the MACs; with ``latency`` (``--objective latency``), their
    share of the MAC-equivalents (:func:`_layer_costs`: at batch 1 a layer costs per value it writes too), so the
    early, high-resolution blocks a latency run gains most from are weighed as such: EfficientNet-Lite2 at 260 px
    runs 1.08x and 1.07x in OpenVINO int8 without its second stage's blocks, 1.03-1.05x without one of its last
    stage's, the only blocks its profile probed by parameters and MACs. A 260-px mobile CNN probed at the floor of
    :data:`MIN_SAMPLES` images cannot probe everything in a few minutes: the early, costly-to-probe units give way.
    """
    if not layers or images <= 0:
        return list(units), {}
    costs = _layer_costs(layers)
    after = [sum(costs[i:]) for i in range(len(costs))]  # the cost of a pass from each layer on
    total_params = sum(lp.params for lp in layers) or 1
    total_macs = sum(lp.macs for lp in layers) or 1
    total_cost = sum(costs) or 1.0

    def own(unit: SensitivityUnit) -> list[int]:
        names = [*unit.modules, *unit.members]
        return [i for i, lp in enumerate(layers) if any(lp.name == n or lp.name.startswith(n + ".") for n in names)]

    def cost(unit: SensitivityUnit) -> float:
        first = min(own(unit), default=0)
        probes = len(unit_kind(unit).probe_ratios(ratios, 1.0))
        return PASSES_PER_PROBE * images * probes * after[first]

    def value(unit: SensitivityUnit) -> float:
        mine = own(unit)
        if latency:
            return sum(costs[i] for i in mine) / total_cost
        return sum(layers[i].params for i in mine) / total_params + sum(layers[i].macs for i in mine) / total_macs

    budget = seconds * SENSITIVITY_MACS_PER_SECOND
    if sum(cost(u) for u in units) <= budget:
        return list(units), {}
    ranked = sorted(units, key=lambda u: (-value(u) / max(cost(u), 1.0), u.pattern))
    kept: set[str] = set()
    spent = 0.0
    for unit in ranked:
        if spent + cost(unit) <= budget or not kept:
            kept.add(unit.pattern)
            spent += cost(unit)
    reason = (
        f"not probed: its saving per probe cost was among the lowest, and probing every unit on {images} images "
        f"would take the profile well past its {seconds:.0f} s"
    )
    return [u for u in units if u.pattern in kept], {u.pattern: reason for u in units if u.pattern not in kept}


@contextlib.contextmanager
def deterministic_torch(seed: int) -> Iterator[None]:
    """Deterministic torch algorithms (a warning where an op has none) and a seeded RNG, restored on exit."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _logits(model: nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([forward_logits(model, part).float().cpu() for part in chunks(images, batch_size)])


def _accuracy(logits: torch.Tensor, targets: torch.Tensor | None) -> float | None:
    if targets is None:
        return None
    known = targets >= 0
    if not bool(known.any()):
        return None
    return float((logits.argmax(-1)[known] == targets[known]).float().mean())


def _probe(
    model: nn.Module,
    passes: ReferencePasses,
    consumers: list[str],
    recovery: RecoveryConfig,
    batch_size: int,
    kept_outputs: dict[str, list[bool]] | None = None,
) -> torch.Tensor:
    """Repair the pruned ``model`` with ``recovery`` on the passes' fit images; its logits on the held-out ones."""
    rows, stats = None, None
    if recovery.method == "reconstruct":
        rows, stats = passes.outputs(consumers, recovery.max_rows), passes.batchnorm_stats()
    images = passes.all_images
    repaired: list[torch.Tensor] = []  # reconstruction's pass gives the repaired model's logits
    recover_(
        model,
        passes.original,
        images,
        consumers,
        recovery,
        rows,
        stats,
        logits_out=repaired,
        fit=passes.fit,
        kept_outputs=kept_outputs,
    )
    if not repaired:
        repaired.append(_logits(model, images, images.shape[0] if recovery.method != "bn" else batch_size))
    logits = repaired[0].cpu()
    return logits[passes.fit :] if passes.held_images.shape[0] else logits


def _measured_latency(
    unit: SensitivityUnit, ratio: float, model: nn.Module, latency_saving: Callable[[nn.Module], float]
) -> None:
    """Each probe's latency saving where the model will run, from one timing: the probe at the unit's largest
    ``ratio`` (its ``model``) timed against the original, the others taking their share of it by the MACs they
    save. A probe is timed in about 2 s (compiled, then 0.5 s of calls against the original's): CIFAR ResNet-56's
    55 units at three ratios took 324 of its profile's 330 s, one timing a unit a third of that, and a low ratio's
    saving, a per cent or two of the model's time, is the one timing resolves worst."""
    saved = latency_saving(model)
    top = next((p.macs_saved for p in unit.points if p.ratio == ratio), 0)
    for point in unit.points:
        point.latency_saved_s = saved if point.ratio == ratio or top <= 0 else saved * point.macs_saved / top


def _probe_order(ratios: Sequence[float]) -> list[float]:
    """The lowest ratio, the highest, then those between (ascending): where the two ends say a unit's damage grows
    gently, the ones between are not needed (:func:`_enough`)."""
    if len(ratios) < 3:
        return list(ratios)
    return [ratios[0], ratios[-1], *ratios[1:-1]]


def _enough(unit: SensitivityUnit, requested: float) -> bool:
    """Whether ``unit``'s probes so far make the one at ``requested`` needless: one at a lower ratio already changed
    more than :data:`STOP_DAMAGE` of the answers (larger ratios can only be worse), or ``requested`` lies between a
    lowest and a highest probe whose KL grew at most with the square of the ratio (the damage model interpolates
    such a unit as a power of the ratio between them, as it extrapolates below the first; measured on
    EfficientNet-Lite2, 11 of its 29 units, a seventh of the profile's probes)."""
    points = sorted(unit.points, key=lambda p: p.ratio)
    if any(p.ratio < requested and 1.0 - p.agreement > STOP_DAMAGE for p in points):
        return True
    if len(points) < 2 or not points[0].ratio < requested < points[-1].ratio:
        return False
    low, high = points[0], points[-1]
    return high.kl <= low.kl * (high.ratio / low.ratio) ** 2 and 1.0 - high.agreement <= STOP_DAMAGE


def measure_sensitivity(
    original: nn.Module,
    images: torch.Tensor,
    units: Sequence[SensitivityUnit],
    *,
    targets: torch.Tensor | None = None,
    layers: Sequence[LayerProfile] = (),
    ratios: Sequence[float] = DEFAULT_RATIOS,
    pruning: PruningConfig | None = None,
    recovery: RecoveryConfig | None = None,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
    latency_saving: Callable[[nn.Module], float] | None = None,
) -> SensitivityProfile:
    """Prune each unit alone at each ratio, recover, and measure against ``original`` (see module doc).

    ``latency_saving``: what a probe's model runs faster than the original where the model will be deployed
    (seconds, measured: ``--objective latency``); without it each point's saving is the profile's per-layer latency
    times the ratio.

    ``images`` are the calibration images (preprocessed); ``targets`` their model classes (-1: unknown)
    where labels exist; ``layers`` the profile's per-layer MACs and latency. ``original`` is not modified.
    Runs under :func:`deterministic_torch` with the pruning config's seed (the caller's RNG is left as it was).
    """
    pruning = pruning or PruningConfig()
    recovery = recovery or RecoveryConfig()
    with deterministic_torch(pruning.seed):
        return _measure(
            original, images, units, targets, layers, ratios, pruning, recovery, batch_size, progress, latency_saving
        )


@dataclass
class _Probing:
    """What every probe of one profile shares: the original and its reference passes, the logits and targets probes
    are judged against, the settings, and the profile being filled with its progress."""

    original: nn.Module
    example: torch.Tensor
    passes: ReferencePasses
    prefix: PrefixCache | None
    reference: torch.Tensor
    targets: torch.Tensor | None
    reference_acc: float | None
    scores: dict[str, torch.Tensor] | None
    by_layer: dict[str, LayerProfile]
    pruning: PruningConfig
    recovery: RecoveryConfig
    batch_size: int
    result: SensitivityProfile
    steps: int
    progress: Callable[[int, int], None] | None
    latency_saving: Callable[[nn.Module], float] | None
    done: int = 0
    refit_spent: float = 0.0  # estimated seconds of the cross-validated refits so far


def _measure(
    original: nn.Module,
    images: torch.Tensor,
    units: Sequence[SensitivityUnit],
    targets: torch.Tensor | None,
    layers: Sequence[LayerProfile],
    ratios: Sequence[float],
    pruning: PruningConfig,
    recovery: RecoveryConfig,
    batch_size: int,
    progress: Callable[[int, int], None] | None,
    latency_saving: Callable[[nn.Module], float] | None = None,
) -> SensitivityProfile:
    """:func:`measure_sensitivity`'s work, its defaults filled in."""
    start = time.perf_counter()
    original = original.eval()
    asked = list(ratios)
    ratios = sorted({float(r) for r in ratios if 0 < r <= pruning.max_ratio})
    prefix, reference = _reference_logits(original, images, units, recovery, batch_size)
    passes = ReferencePasses(original, images, targets, batch_size, holdout=held_out_count(len(images), PROBE_HOLDOUT))
    judged = passes.fit if passes.held_images.shape[0] else 0  # too few images to hold any out: judged in sample
    reference = reference[judged:]  # probes are judged on the images their repair was not fit on
    targets = None if targets is None else targets[judged:]
    run = _Probing(
        original=original,
        example=images[:1],
        passes=passes,
        prefix=prefix,
        reference=reference,
        targets=targets,
        reference_acc=_accuracy(reference, targets),
        scores=passes.channel_scores(pruning.importance),
        by_layer={lp.name: lp for lp in layers},
        pruning=pruning,
        recovery=recovery,
        batch_size=batch_size,
        result=SensitivityProfile(
            samples=int(reference.shape[0]),
            fit_samples=passes.fit,
            importance=pruning.importance,
            recovery=recovery.method,
            ratios=ratios,
            seconds=0.0,
        ),
        steps=len(units) * len(ratios),
        progress=progress,
        latency_saving=latency_saving,
    )
    if recovery.method == "reconstruct":
        passes.batchnorm_stats()  # on the whole model, before any probe replays a part of it
    total_params = count_params(original)
    for unit in units:
        _profile_unit(run, unit, asked)
    run.result.seconds = round(time.perf_counter() - start, 2)
    _log_profile(run.result, total_params)
    return run.result


def _log_profile(result: SensitivityProfile, total_params: int) -> None:
    """Log what the profile measured, and in how long."""
    logger.info(
        "sensitivity: %d units x %d ratios on %d images in %.1f s (%.1f%% of %d params probed)",
        len(result.units),
        len(result.ratios),
        result.samples,
        result.seconds,
        100 * sum(u.params for u in result.units) / max(1, total_params),
        total_params,
    )


def _reference_logits(
    original: nn.Module,
    images: torch.Tensor,
    units: Sequence[SensitivityUnit],
    recovery: RecoveryConfig,
    batch_size: int,
) -> tuple[PrefixCache | None, torch.Tensor]:
    """The cache that replays what runs before each unit's first change (None where BatchNorm is re-estimated
    outright: that needs every layer run; the other recoveries only need what follows a change), and the original's
    logits on ``images``."""
    if recovery.method == "bn":
        return None, _logits(original, images, batch_size)
    firsts = [name for unit in units for name in (*unit.modules, *unit.members)]
    return PrefixCache.build(original, images, firsts)


def _profile_unit(run: _Probing, unit: SensitivityUnit, asked: Sequence[float]) -> None:
    """Probe ``unit`` at each of the ``asked`` ratios its kind probes, into the profile (or why it is not there)."""
    measured = unit.model_copy(deep=True)
    measured.size = unit_kind(unit).size(run.original, unit)
    measured.step = unit_step(measured, run.pruning)
    try:
        largest, why_not = _probe_ratios(run, unit, measured, asked)
    except Exception as exc:  # one unit that cannot be probed must not cost the others
        logger.warning("sensitivity of %s failed: %s", unit.pattern, one_line(exc))
        run.result.skipped[unit.pattern] = one_line(exc)
        return
    measured.points.sort(key=lambda p: p.ratio)
    if largest is not None and run.latency_saving is not None:
        _measured_latency(measured, *largest, run.latency_saving)
    if measured.points:
        run.result.units.append(measured)
    else:
        run.result.skipped[unit.pattern] = f"nothing was pruned at any ratio ({why_not})"


def _probe_ratios(
    run: _Probing, unit: SensitivityUnit, measured: SensitivityUnit, asked: Sequence[float]
) -> tuple[tuple[float, nn.Module] | None, str]:
    """Probe ``unit`` at the ratios its kind probes, needed ones only, into ``measured``: (the largest ratio probed
    and its model, where the latency saving is measured; the last reason pruning gave for not pruning)."""
    why_not = "no ratio removes a channel"
    largest: tuple[float, nn.Module] | None = None
    for requested in _probe_order(unit_kind(unit).probe_ratios(asked, run.pruning.max_ratio)):
        if _enough(measured, requested):
            run.done += 1
            continue
        ratio = reachable_ratio(measured, requested)  # what rounding leaves of the ratio
        if ratio <= 0 or any(p.ratio == ratio for p in measured.points):
            run.done += 1
            continue
        probed = _probe_point(run, unit, measured, ratio)
        if isinstance(probed, str):
            why_not = probed or why_not
            continue
        if run.latency_saving is not None and (largest is None or ratio > largest[0]):
            largest = (ratio, probed)
        if run.progress is not None:
            run.progress(run.done, run.steps)
    return largest, why_not


def _probe_point(run: _Probing, unit: SensitivityUnit, measured: SensitivityUnit, ratio: float) -> nn.Module | str:
    """Prune a copy of the original on ``unit`` alone at ``ratio``, repair it and add its point to ``measured``: the
    probe's model, or why pruning left it as it was."""
    model = clone_module(run.original)
    rec = PruningRecommendation(
        layer=unit.pattern,
        pruning_type=unit.pruning_type,
        pruning_ratio=ratio,
        justification="sensitivity probe",
    )
    torch.manual_seed(run.pruning.seed)  # each probe as if it were the only one (random importance)
    report = apply_pruning(model, [rec], run.example, run.pruning, channel_scores=run.scores)
    run.done += 1
    if not report.applied:
        return "; ".join(dict.fromkeys(sk.reason for sk in report.skipped))
    consumers = report.consumers()
    repair = _probe_recovery(run, unit.pattern, model, consumers)
    with contextlib.ExitStack() as replay:
        if run.prefix is not None:  # the probe and the original run only what follows the first change
            first = run.prefix.first_change(model)
            replay.enter_context(run.prefix.skip(model, first))
            replay.enter_context(run.prefix.skip(run.original, first))
        logits = _probe(model, run.passes, consumers, repair, run.batch_size, report.kept_outputs())
    _add_point(run, unit, measured, ratio, report, logits)
    return model


def _probe_recovery(run: _Probing, pattern: str, model: nn.Module, consumers: list[str]) -> RecoveryConfig:
    """The recovery of a probe: the profile's, or at :data:`PROBE_FIXED_RIDGE` where its cross-validated refits would
    take too long (:data:`MAX_PROBE_REFIT_SECONDS`, :data:`MAX_PROFILE_REFIT_SECONDS`)."""
    recovery = run.recovery
    refits = refit_seconds(model, consumers, recovery)
    if recovery.ridge is None and refits > 0.0:
        if refits > MAX_PROBE_REFIT_SECONDS or run.refit_spent + refits > MAX_PROFILE_REFIT_SECONDS:
            run.result.fixed_ridge[pattern] = len(consumers)
            return recovery.model_copy(update={"ridge": PROBE_FIXED_RIDGE})
        run.refit_spent += refits
    return recovery


def _add_point(
    run: _Probing,
    unit: SensitivityUnit,
    measured: SensitivityUnit,
    ratio: float,
    report: PruneReport,
    logits: torch.Tensor,
) -> None:
    """Add to ``measured`` the probe at ``ratio``: what it saved (``report``) and how its repaired ``logits`` differ
    from the original's."""
    kind = unit_kind(unit)
    kl, agreement = kl_agreement(run.reference, logits)
    accuracy = _accuracy(logits, run.targets)
    involved = kind.involved(unit, list(run.by_layer), report.consumers())
    macs = sum(run.by_layer[n].macs for n in involved if n in run.by_layer)
    latency = sum(run.by_layer[n].latency_s for n in involved if n in run.by_layer) * ratio
    measured.params = (
        report.params_before - report.params_after
        if kind.whole
        else sum(p.numel() for n in involved for p in run.original.get_submodule(n).parameters(recurse=False))
    )
    measured.points.append(
        SensitivityPoint(
            ratio=ratio,
            params_saved=report.params_before - report.params_after,
            macs_saved=int(macs * ratio),
            latency_saved_s=latency,
            agreement=round(agreement, 5),
            kl=round(kl, 6),
            accuracy_drop_points=(
                None
                if accuracy is None or run.reference_acc is None
                else round(100 * (run.reference_acc - accuracy), 3)
            ),
        )
    )
