"""How the rules planner predicts the damage of pruning several units together from their measured damage alone.

Each unit of the sensitivity profile was pruned alone at a few ratios and compared with the original on the
calibration images: the share of images whose top-1 class changed (``1 - agreement``) and the mean KL divergence
of the class probabilities. The two carry the same signal at very different noise: a flip count on ~100-250
images moves in steps of 0.4-1 % and is zero for most small changes, while the KL divergence is a mean of
continuous values. Pooled over every probe of a profile, the flip share follows the KL divergence closely as a
power law, ``flips = c * KL ** b``, with b near 1/2 (a small perturbation of the logits changes KL with its square
and the flip share with its size): measured on the profiles of CIFAR ViT-tiny, Swin-tiny, ResNet-tiny, ResNet-20/56
and a 224-px MobileNetV2, b = 0.47-0.84, residual spread 0.18-0.26 in log (0.47 with 102 images).

So a unit's *cost* is its KL divergence, interpolated in ratio on log-log axes between the measured ratios and
below the first by a power of the ratio (the slope of its first two points, 1 to 2: removing the weakest channels
first, damage grows faster than the ratio); costs of different units add (independent perturbations of the logits
add their variances, hence their KL). A damage budget in flips converts to a KL budget through the pooled fit and
back. Against the sum of flip shares (the previous currency), on the same profiles, pruned and repaired, measured on
5,000 other images: CIFAR ResNet-56 at the same agreement (93 %) 22.2 % fewer parameters instead of 13.5 %,
Swin-tiny 34.0 % at 93.4 % instead of 34.5 % at 93.0 %, ViT-tiny 56.1 % at 94.5 % instead of 54.1 % at 94.1 %; the
flips predicted matched the flips found within 10 % on ViT and ResNet-56 (the sum of flip shares overpredicted
ViT's 2x), while on shallow nets (ResNet-20, ResNet-tiny) both underpredict, which the rounds correct.

A profile without KL values (or without any flip to fit on) costs units by their flip share itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tools.schemas import SensitivityProfile, SensitivityUnit

__all__ = ["DamageModel"]

#: The exponent of the fit where a profile has too few flips to fit it (the small-perturbation value).
PRIOR_EXPONENT = 0.5
#: Bounds of the fitted exponent, and of the ratio exponent below a unit's first measured ratio.
EXPONENT_BOUNDS = (0.35, 1.0)
RATIO_EXPONENT_BOUNDS = (1.0, 2.0)
#: Probes with flips needed to fit the exponent (fewer: the prior exponent, the scale fitted).
MIN_FIT_POINTS = 4


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], value))


@dataclass(frozen=True)
class DamageModel:
    """``flips = scale * cost ** exponent``, a unit's cost its KL divergence (or its flip share: ``by_kl`` False)."""

    scale: float = 1.0
    exponent: float = 1.0
    by_kl: bool = False

    @classmethod
    def fit(cls, sensitivity: SensitivityProfile) -> DamageModel:
        """The pooled least-squares fit of log flips on log KL over every probe with both above zero."""
        points = [p for u in sensitivity.units for p in u.points]
        if not any(p.kl > 0 for p in points):
            return cls()
        pairs = [(math.log(p.kl), math.log(1.0 - p.agreement)) for p in points if p.kl > 0 and p.agreement < 1]
        if not pairs:  # KL but never a flip: nothing to scale by; the small-perturbation prior, flips ~ sqrt(KL)
            return cls(scale=0.4, exponent=PRIOR_EXPONENT, by_kl=True)
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mx) ** 2 for x in xs)
        exponent = PRIOR_EXPONENT
        if len(pairs) >= MIN_FIT_POINTS and spread > 1e-6:
            exponent = _clamp(sum((x - mx) * (y - my) for x, y in pairs) / spread, EXPONENT_BOUNDS)
        return cls(scale=math.exp(my - exponent * mx), exponent=exponent, by_kl=True)

    def flips(self, cost: float) -> float:
        """The share of images predicted to change class at a summed ``cost``."""
        return self.scale * max(0.0, cost) ** self.exponent

    def flips_of(self, pruned: Iterable[tuple[SensitivityUnit, float]]) -> float:
        """The share of images predicted to change class when each unit is pruned at its ratio (its costs summed; a
        ratio beyond a unit's last measured one costs nothing here)."""
        return self.flips(sum(self.cost(unit, ratio) or 0.0 for unit, ratio in pruned))

    def cost_of(self, flips: float) -> float:
        """The summed cost at which ``flips`` of the images are predicted to change class."""
        return (max(0.0, flips) / self.scale) ** (1.0 / self.exponent)

    def curve(self, unit: SensitivityUnit) -> list[tuple[float, float]]:
        """(ratio, cost) of the unit's measurements, made non-decreasing in ratio."""
        out: list[tuple[float, float]] = []
        worst = 0.0
        for point in sorted(unit.points, key=lambda p: p.ratio):
            worst = max(worst, point.kl if self.by_kl else 1.0 - point.agreement)
            out.append((point.ratio, worst))
        return out

    def cost(self, unit: SensitivityUnit, ratio: float) -> float | None:
        """The unit's cost at ``ratio`` (see the module doc); None beyond its last measured ratio."""
        if ratio <= 0:
            return 0.0
        curve = [(r, c) for r, c in self.curve(unit) if r > 0]
        if not curve or ratio > curve[-1][0] + 1e-9:
            return None
        (r1, c1), rest = curve[0], curve[1:]
        if ratio <= r1:
            slope = 2.0
            if rest and c1 > 0 and rest[0][1] > c1 and rest[0][0] > r1:
                slope = math.log(rest[0][1] / c1) / math.log(rest[0][0] / r1)
            return c1 * (ratio / r1) ** _clamp(slope, RATIO_EXPONENT_BOUNDS)
        for (r0, c0), (r1, c1) in zip(curve, rest, strict=False):
            if r0 <= ratio <= r1:
                if c0 <= 0 or c1 <= c0 or r1 <= r0:
                    return c0 + (c1 - c0) * (ratio - r0) / (r1 - r0) if r1 > r0 else c1
                return c0 * (ratio / r0) ** (math.log(c1 / c0) / math.log(r1 / r0))
        return curve[-1][1]
