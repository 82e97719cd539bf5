"""What distillation after the search recovered in this run, and how large a round it can take next.

After a distilled round came back within the accuracy budget, the rounds the search evaluated before say how much
each pruned size loses *before* distillation, and the distilled round says how much of that distillation gave back.
Together they set the next distillation's target: the largest drop before distillation that, recovered by the
share measured so far, still passes the kept round's check (:func:`recoverable_drop`). The search plans its next
round at the damage that predicts that drop (:func:`damage_for_drop`), and distillation after the search takes it
(or, failing that, the most pruned earlier round under the target).

Measured, default runs on half of CIFAR-10's test split (one Xeon core): distillation after the search gave back
all of the drop of rounds losing under a point on the CIFAR ResNets (ResNet-32 0.55 -> -0.19 and 0.70 -> -0.13,
ResNet-44 0.53 -> -0.59, ResNet-56 0.49 -> -0.13, 300 steps), 65 % on ViT-tiny (0.72 -> 0.25), 18 % on Swin-tiny
(0.51 -> 0.42), and 73-80 % on ResNet-20 rounds losing 8.0 and 4.4 points (1,000 steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tools.schemas import RoundResult
from tools.stats import standard_error_points

__all__ = [
    "AT_TARGET",
    "COMPLETE_RECOVERY_STEP",
    "NOISE_DROP",
    "RECOVERY_CAP",
    "TARGET_SLACK",
    "WHOLE_RECOVERY_STEP",
    "Recovery",
    "damage_for_drop",
    "recoverable_drop",
    "recoveries_of",
    "undershot",
]

#: Drops at or under this many points are noise to the drop-for-damage fit (:func:`damage_for_drop`).
NOISE_DROP = 0.05

#: The largest share of a round's drop counted on coming back by distillation, however much came back before:
#: ResNet-20's rounds losing 4.4 and 8.0 points got 80 % and 73 % back (1,000 steps) where rounds losing under a
#: point got all of it.
RECOVERY_CAP = 0.75

#: A round planned at the target may lose somewhat more than predicted before distillation (the damage model's
#: error); distillation after the search still takes it up to this factor over the target: the budget test after
#: distillation decides.
TARGET_SLACK = 1.25

#: The planner_state key of a round planned at a distillation target (its value: the target, points), which the
#: router reads to give a round that overshot it another try.
AT_TARGET = "distillation_target_points"

#: The planner_state key of a depth round (``agents.planning.depth``; its value: the blocks it removes), which
#: distillation after the search reads to take the depth ladder's rounds.
DEPTH_KEY = "depth_blocks"

#: A target that allows less growth than this over the distilled rounds' own drop leaves nothing worth another round.
MIN_TARGET_GROWTH = 1.1

#: Where every distilled round came back within budget having given back at least :data:`RECOVERY_CAP` of its drop
#: (within one standard error: :meth:`Recovery.gave_back`) but the capped share leaves no room, the run's own evidence
#: outweighs the cap: the next target is this factor over the largest drop that came back, one step at a time (a step
#: that gives back less, or does not come back within budget, ends the growth; each distilled round is still judged
#: by the budget test). Measured on CIFAR ResNet-32 (default run, one Xeon core): rounds losing 0.55, 1.31 and 1.56
#: points came back at -0.27, -0.04 and +0.19 (88-100 % given back); growth that needed every one to come back whole
#: stopped at 13.7 % of the parameters, with a round losing 2.13 (17.6 %) never distilled.
COMPLETE_RECOVERY_STEP = 1.25

#: The step instead of :data:`COMPLETE_RECOVERY_STEP` where every distilled round gave back all of its drop (it came
#: back at or above the original's accuracy on the evaluation images). Measured on CIFAR ResNet-32 (default run,
#: AMD EPYC): its rounds at the 1.25x targets lost 0.55, 0.70, 0.99, 1.31 and 1.56 points and came back at +0.15,
#: +0.21, +0.04, +0.15 and +0.08; five distillations, the run's cap, took it from 10.2 % to 13.5 % of the parameters.
#: With 1.6x: 18.4 % in two runs (rounds losing 1.31, 2.13, 2.11 and 2.56 came back), −0.60 points on unseen images.
WHOLE_RECOVERY_STEP = 1.6


class _AtTarget(Protocol):
    """What :func:`undershot` reads of a round (a ``RoundResult`` or the planners' ``RoundRecord``)."""

    @property
    def planner_state(self) -> dict[str, Any]: ...

    @property
    def accuracy_drop_points(self) -> float | None: ...


@dataclass(frozen=True)
class Recovery:
    """One distilled round: its source's drop before, its drop and standard error after (points), and whether it
    came back within the budget."""

    before_points: float
    after_points: float
    after_se_points: float
    within_budget: bool

    @property
    def given_back(self) -> float:
        """The share of the drop distillation gave back (1 or more: it came back whole)."""
        return (self.before_points - self.after_points) / self.before_points

    @property
    def share(self) -> float:
        """The share of the drop distillation gave back, at most :data:`RECOVERY_CAP`."""
        return min(RECOVERY_CAP, self.given_back)

    def gave_back(self, share: float) -> bool:
        """Whether distillation gave back at least ``share`` of the drop, within one standard error of the drop after
        it: a share measured on a small drop is noisy (CIFAR ResNet-20 on an AMD EPYC: 0.91 -> 0.30 points, standard
        error 0.27, gave back 67 % +- 30 %, and the run ended there with four of its five distillations unspent and
        5.8 % fewer parameters, where the same run on a Xeon grew to 15.4 %)."""
        return self.before_points - self.after_points + self.after_se_points >= share * self.before_points


def recoveries_of(rounds: Sequence[RoundResult]) -> list[Recovery]:
    """The recoveries of a run's rounds: each distilled round, within budget or not, whose source round lost
    something before distillation."""
    by_round = {r.round: r for r in rounds}
    out = []
    for r in rounds:
        cross_fit, paired = r.cross_fit, r.metrics.paired
        if cross_fit is None or paired is None:
            continue
        source = by_round.get(cross_fit.source_round)
        before = source.accuracy_drop_points if source is not None else None
        if before is None or before <= 0 or r.accuracy_drop_points is None:
            continue
        se = standard_error_points(paired)
        out.append(Recovery(float(before), float(r.accuracy_drop_points), se, r.within_budget))
    return out


def recoverable_drop(recoveries: list[Recovery], budget: float, z: float) -> float | None:
    """The largest drop before distillation a next round may have and still, recovered by the smallest share
    measured on any distilled round (:attr:`Recovery.share`), pass the kept round's check:
    ``(1 - share) * drop + z * se <= budget``, ``se`` the largest standard error measured, ``z`` the multiplicity
    check's (``selection_z`` of the rounds there will be). Where that leaves no room beyond the drops already
    recovered (:data:`MIN_TARGET_GROWTH`) but every distilled round came back within budget, each having given back
    at least :data:`RECOVERY_CAP` of its drop within one standard error (:meth:`Recovery.gave_back`), one step beyond
    the largest (:data:`COMPLETE_RECOVERY_STEP`, or :data:`WHOLE_RECOVERY_STEP` where each gave back all of it);
    otherwise None, as before any distilled round came back within budget."""
    back = [r for r in recoveries if r.within_budget]
    if not back:
        return None
    share = min(r.share for r in recoveries)
    if share <= 0:
        return None
    se = max(r.after_se_points for r in recoveries)
    target = (budget - z * se) / (1.0 - share)
    largest = max(r.before_points for r in back)
    if target >= MIN_TARGET_GROWTH * largest:
        return target
    if all(r.within_budget and r.given_back >= 1.0 for r in recoveries):
        return WHOLE_RECOVERY_STEP * largest
    if all(r.within_budget and r.gave_back(RECOVERY_CAP) for r in recoveries):
        return COMPLETE_RECOVERY_STEP * largest
    return None


def undershot(r: _AtTarget, target: float) -> bool:
    """Whether round ``r`` was planned at the distillation ``target`` (:data:`AT_TARGET`) and lost less than the
    target over :data:`TARGET_SLACK` before distillation: distilled, it would spend a distillation on a smaller
    round than the target allows (CIFAR ResNet-56's default run: a round planned to lose 2.09 points lost 1.33,
    11.7 % fewer parameters where 21 % lost 3.10; it was distilled and the run ended at 13.8 %), so the search plans
    again past it."""
    return AT_TARGET in r.planner_state and float(r.accuracy_drop_points or 0.0) < target / TARGET_SLACK


def damage_for_drop(points: list[tuple[float, float]], anchor: tuple[float, float], drop: float) -> float | None:
    """The predicted damage at which a pruned round loses ``drop`` points before distillation, from ``anchor`` (the
    ``(predicted damage, drop)`` of the largest round that came back) and the evaluated rounds' ``points``: on the
    line in log-log between the anchor, or the most damaging round past it that lost less than ``drop`` (so that a
    round planned at the target that fell short is planned again past it: CIFAR ResNet-56's lost 1.33 points of a
    target of 2.09), and the least damaging round beyond that which lost at least ``drop``; without
    one, from the anchor along the slope of a least-squares line of log drop on log damage over the rounds that lost
    more than :data:`NOISE_DROP` points, the slope at least 1 (damage grows no faster than the drop: a flat fit of
    noisy small drops would extrapolate far). An anchor that lost less counts as losing :data:`NOISE_DROP`: CIFAR
    ResNet-56's came back from 0.00 and, with no damage to plan at, the search grew its budget twice over and lost
    13 points; from 0.05 the line to the round that lost 0.49 plans 5 % past the anchor. None with fewer than two
    such rounds."""
    usable = [(d, p) for d, p in points if d > 0 and p > NOISE_DROP]
    anchor_damage, anchor_drop = anchor[0], max(anchor[1], NOISE_DROP)
    if len(usable) < 2 or anchor_damage <= 0:
        return None
    short = [(d, p) for d, p in usable if d > anchor_damage and p < drop]
    if short:  # the most damaging round past the anchor that lost less than the drop: the line starts past it
        anchor_damage, anchor_drop = max(short)
    beyond = [(d, p) for d, p in usable if d > anchor_damage and p >= drop and p > anchor_drop]
    if beyond:
        d, p = min(beyond)
        slope = math.log(p / anchor_drop) / math.log(d / anchor_damage)
    else:
        xs, ys = [math.log(d) for d, _ in usable], [math.log(p) for _, p in usable]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 1.0
    return anchor_damage * (drop / anchor_drop) ** (1.0 / max(1.0, slope))
