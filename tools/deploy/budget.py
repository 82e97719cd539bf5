"""One accuracy budget for pruning and int8: how much of it the original's int8 deployment keeps back.

The int8 damage of the original is cheap to measure before pruning starts (the original through every runtime,
:func:`tools.stages.deployment.deploy`); :func:`split_budget` keeps that much of the budget in reserve, so that the
pruning search does not choose a round that int8 then pushes over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from tools.deploy.accuracy import AccuracyControl
from tools.deploy.base import PRECISION_FP32
from tools.deploy.choice import DeployCandidate, DeployChoice
from tools.deploy.registry import BACKENDS, runtime_and_precision
from tools.schemas import AccuracyBudget

__all__ = ["INT8_MARGIN", "Hold", "mixed_to_build", "not_faster_than_float", "split_budget"]

#: How much of the original's int8 loss :func:`split_budget` keeps back: ``expected``, the loss measured (its point
#: estimate); ``sure``, the part the evaluation images show for sure (the low end of its 95 % interval, 0 where the
#: interval covers no loss).
Hold = Literal["expected", "sure"]

#: The original's int8 deployment is given a share of the accuracy budget only when it is at least this much faster
#: than the original's fastest float runtime (on CPUs without VNNI int8 often is not).
INT8_MARGIN = 0.10


def _as_fast(row: DeployCandidate, chosen: DeployCandidate) -> bool:
    """Whether ``row`` runs within :data:`INT8_MARGIN` of ``chosen``: by the times the two got together alone before
    the original's deployment was chosen (``alone_latency_s``, the runoff) where both have one, else by the table's.
    The table times some 20 builds interleaved, the runoff the close ones alone: CIFAR ResNet-56 on an AMX CPU
    (another run on the other core), OpenVINO int8 and bf16 of the original 1.08 and 1.19 ms in the table (bf16 just
    past the margin, so int8's 0.43 points were kept back and a five-block round distilled to +0.23 in the run was
    refused as the best of 10), 1.00 and 1.07 alone, and 0.705 and 0.613 side by side on unseen images."""
    if row.alone_latency_s is not None and chosen.alone_latency_s is not None:
        return row.alone_latency_s <= chosen.alone_latency_s * (1 + INT8_MARGIN)
    return (
        row.latency_s is not None
        and chosen.latency_s is not None
        and row.latency_s <= chosen.latency_s * (1 + INT8_MARGIN)
    )


def _least_damage_as_fast(chosen: DeployCandidate, int8: list[DeployCandidate]) -> DeployCandidate:
    """The int8 candidate of the original whose loss is reserved: the least damaging one within budget that runs
    within :data:`INT8_MARGIN` of ``chosen`` (the fastest; :func:`_as_fast`), ``chosen`` itself when none loses less.
    Reserving the fastest's loss when another int8 nearly as fast loses nothing takes pruning room for a few percent
    of speed (CIFAR ResNet-20 on an AVX2 CPU: OpenVINO int8 3.40 ms, -0.36 points; ONNX Runtime static int8 3.60 ms,
    +0.25)."""
    as_fast = [c for c in int8 if c.source is None and c.within_budget and _as_fast(c, chosen)]
    return min([chosen, *as_fast], key=lambda c: (max(float(c.accuracy_drop_points or 0.0), 0.0), c is not chosen))


def _held(kept: DeployCandidate, hold: Hold) -> float:
    """What of ``kept``'s loss is kept back (:data:`Hold`): its point estimate, or the low end of its interval."""
    drop = float(kept.accuracy_drop_points or 0.0)
    if hold == "sure" and kept.paired is not None:
        drop = -kept.paired.ci95_high_points
    return max(drop, 0.0)


def _is_int8(c: DeployCandidate) -> bool:
    """Whether ``c`` runs below FP32 (int8, bf16): "int8" in :func:`split_budget`."""
    return c.precision != PRECISION_FP32


def _not_worth_room(chosen: DeployCandidate, candidates: list[DeployCandidate]) -> str | None:
    """Why the original's ``chosen`` int8 takes no pruning room: it runs within :data:`INT8_MARGIN` of the fastest
    float runtime within budget (None: it is faster, or there is no timing to tell)."""
    floats = [
        c.latency_s
        for c in candidates
        if c.ran and not _is_int8(c) and c.source is None and c.within_budget and c.latency_s is not None
    ]
    fastest_float = min(floats, default=None)
    if chosen.latency_s is None or fastest_float is None or not chosen.latency_s > fastest_float * (1 - INT8_MARGIN):
        return None
    return (
        f"{chosen.backend} of the original, the fastest, runs at {1e3 * chosen.latency_s:.2f} ms, within "
        f"{100 * INT8_MARGIN:.0f} % of the fastest float runtime ({1e3 * fastest_float:.2f} ms): int8 is not worth "
        "pruning room on this CPU"
    )


def _why_held(kept: DeployCandidate, chosen: DeployCandidate, hold: Hold) -> str:
    """Why ``kept``'s loss (that of ``chosen``, the fastest, or of one nearly as fast) is what int8 keeps back."""
    paired = kept.paired
    interval = f" [{-paired.ci95_high_points:+.2f}, {-paired.ci95_low_points:+.2f}]" if paired else ""
    drop = float(kept.accuracy_drop_points or 0.0)
    change = f"loses {drop:.2f}" if drop >= 0 else f"gains {-drop:.2f}"
    which = (
        "the fastest within budget"
        if kept is chosen
        else f"the least damaging int8 within {100 * INT8_MARGIN:.0f} % of the fastest ({chosen.backend})"
    )
    why = f"{kept.backend} of the original, {which}, {change} points (drop{interval}) on the evaluation images"
    if hold == "sure" and paired is not None and drop > 0:
        why += "; only the part its interval shows for sure is kept"
    return why


def split_budget(original: DeployChoice, total_points: float, hold: Hold = "expected") -> AccuracyBudget:
    """The accuracy budget split from the original's deployment table (``original``: :func:`deploy` of the original,
    every int8 at full precision). "int8" here is every precision below FP32 (int8, bf16): the chosen candidate's
    loss (or that of one nearly as fast that loses less: :func:`_least_damage_as_fast`) is kept for int8 (at least
    0, at most half the budget; with ``hold="sure"`` only the part its interval excludes: :data:`Hold`); when every
    int8 candidate ran over the budget, half of it (mixed precision will need room); when an FP32 runtime is chosen,
    when the int8 chosen is less than :data:`INT8_MARGIN` faster than the fastest FP32 runtime, or when the accuracy
    is unknown, nothing.

    ``sure`` is for the parameters objective: there a round is kept for its size and its int8 build only ships when
    it holds the whole budget, so a loss the evaluation images cannot tell from none takes no pruning room (the
    ViT-tiny in ``torch.nn``: OpenVINO int8 of the original -0.17 [-0.45, +0.11], kept 63.9 % with 0.17 held back,
    69.9 % without, its OpenVINO int8 shipped -0.72 on 5,000 unseen images). ``expected`` is for the latency
    objective, whose kept round is chosen for its int8 build's speed: a pruned CNN's int8 can lose more than the
    original's (CIFAR ResNet-20's three-block round, 0.38 points against its float on unseen images)."""
    half = round(total_points / 2, 4)
    chosen = next((c for c in original.candidates if c.backend == original.chosen and c.source is None), None)
    ran = [c for c in original.candidates if c.ran and _is_int8(c) and c.accuracy_drop_points is not None]
    measured: str | None = None
    not_worth = _not_worth_room(chosen, original.candidates) if chosen is not None and _is_int8(chosen) else None
    if not_worth is not None:  # int8 that is not really faster than float here is not worth pruning room
        reserve, why = 0.0, not_worth
    elif chosen is not None and _is_int8(chosen) and chosen.accuracy_drop_points is not None:
        kept = _least_damage_as_fast(chosen, ran)
        reserve, why, measured = min(_held(kept, hold), half), _why_held(kept, chosen, hold), kept.backend
    elif ran and not any(c.within_budget for c in ran):
        reserve, measured = half, None
        why = "every int8 deployment of the original is over the budget: half is kept for mixed-precision int8"
    else:
        reserve, measured = 0.0, None
        why = "the original deploys in float (no int8 faster within the budget, or accuracy unknown)"
    reserve = round(reserve, 4)
    pruning = round(total_points - reserve, 4)
    return AccuracyBudget(
        total_points=total_points,
        int8_reserve_points=reserve,
        pruning_points=pruning,
        measured_with=measured,
        why=f"{total_points:g} points: {reserve:.2f} kept for int8 ({why}), {pruning:.2f} for pruning",
    )


def not_faster_than_float(row: DeployCandidate, candidates: list[DeployCandidate]) -> str | None:
    """Why building ``row``'s mixed-precision version is pointless: ``row`` (full int8, timed) is less than
    :data:`INT8_MARGIN` faster than the fastest float candidate within budget, so keeping layers of it in float
    cannot make it worth deploying. None when it is faster, or when there is no timing to tell."""
    floats = [
        c
        for c in candidates
        if c.ran and c.within_budget and c.latency_s is not None and not c.precision.startswith("int8")
    ]
    if row.latency_s is None or not floats:
        return None
    fastest = min(floats, key=lambda c: c.latency_s or 0.0)
    if fastest.latency_s is None or row.latency_s < fastest.latency_s * (1 - INT8_MARGIN):
        return None
    return (
        f"full int8 ({row.backend}, {1e3 * row.latency_s:.2f} ms) is not {100 * INT8_MARGIN:.0f} % faster "
        f"than {fastest.key} ({1e3 * fastest.latency_s:.2f} ms), so no mixed precision of it can be worth it"
    )


def mixed_to_build(
    backends: list[str],
    candidates: list[DeployCandidate],
    control: Callable[[], AccuracyControl | None],
    always: bool = False,
    source: str | None = None,
    slower: Mapping[str, str] | None = None,
) -> tuple[list[str], list[DeployCandidate]]:
    """The mixed-precision backends to build from ``source`` (None: the best model; its full-int8 backend ran over
    the budget, or ``always``, and there is a labelled dataset to control accuracy with), and a skipped row for each
    of the others, saying why: among them those whose full int8 is ``slower[full]`` (why it cannot outrun the
    original's builds, as a build of another model must to ship: keeping layers of it in float only slows it)."""
    build: list[str] = []
    skipped: list[DeployCandidate] = []
    own = [c for c in candidates if c.source == source]
    for name in backends:
        full = BACKENDS[name].mixed_of if name in BACKENDS else None
        if full is None:
            continue
        row = next((c for c in own if c.backend == full), None)
        why = None
        if always:
            why = None
        elif row is None or not row.ran:
            why = f"{full} was not built"
        elif row.within_budget:
            why = f"not needed: full int8 ({full}) is within the accuracy budget"
        elif (slow := not_faster_than_float(row, own)) is not None:
            why = slow
        elif slower and full in slower:
            why = f"{slower[full]}, so no mixed precision of it can ship"
        if why is None and control() is None:
            why = "needs a labelled dataset to control accuracy"
        if why is None:
            build.append(name)
        else:
            runtime, precision = runtime_and_precision(name, unknown=("?", "?"))
            skipped.append(
                DeployCandidate(backend=name, runtime=runtime, precision=precision, skipped=why, source=source)
            )
    return build, skipped
