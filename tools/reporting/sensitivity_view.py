"""The sensitivity profile for people and planners: units in the order a planner cares about, and text.

A :class:`~tools.schemas.SensitivityProfile` holds, for each unit a plan can address (one attention
module's heads, one block-internal channel group), the damage of pruning that unit alone at a few ratios
after recovery. :func:`ranked_units` orders units most prunable first: least damage (output KL on the
calibration images) per parameter saved at the middle ratio. ``report.md`` shows :func:`markdown_lines`,
``report.html`` :mod:`tools.reporting.html_sensitivity`, and the LLM planner's prompt a compact form of
the same ranking.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tools.compression.units import reachable_ratio
from tools.reporting.format import drop_as_change
from tools.schemas import SensitivityPoint, SensitivityProfile, SensitivityUnit

__all__ = [
    "as_profile",
    "has_accuracy",
    "kl_text",
    "markdown_lines",
    "middle_ratio",
    "point_at",
    "ranked_units",
    "ratio_label",
    "summary_text",
]


def as_profile(value: Any) -> SensitivityProfile | None:
    """``value`` as a profile; ``None`` for ``None`` and for what is not a whole profile (a summary)."""
    if value is None:
        return None
    try:
        return SensitivityProfile.model_validate(value)
    except ValidationError:
        return None


def ratio_label(ratio: float) -> str:
    """0.25 -> ``25%``."""
    return f"{100 * ratio:g}%"


def kl_text(kl: float) -> str:
    """A KL divergence readable at every scale: ``0.0123``, ``2.1e-05``, ``0``."""
    if kl <= 0:
        return "0"
    return f"{kl:.2g}" if kl < 0.001 else f"{kl:.4f}"


def middle_ratio(profile: SensitivityProfile) -> float | None:
    """The middle of the measured ratios (the upper middle of an even count), ``None`` without ratios."""
    ratios = sorted(profile.ratios)
    return ratios[len(ratios) // 2] if ratios else None


def point_at(unit: SensitivityUnit, ratio: float) -> SensitivityPoint | None:
    """The unit's point measured for the requested ``ratio``: at the ratio itself, or at what rounding leaves of it
    (:func:`~tools.compression.units.reachable_ratio`: whole heads, channel counts rounded), the point's own ratio
    saying which; ``None`` when nothing was pruned there."""
    wanted = (ratio, reachable_ratio(unit, ratio))
    return next((p for p in unit.points if any(abs(p.ratio - r) < 1e-4 for r in wanted)), None)


def _nearest(unit: SensitivityUnit, ratio: float | None) -> SensitivityPoint | None:
    if not unit.points:
        return None
    if ratio is None:
        return unit.points[0]
    return min(unit.points, key=lambda p: (abs(p.ratio - ratio), p.ratio))


def ranked_units(profile: SensitivityProfile) -> list[SensitivityUnit]:
    """Units most prunable first: output KL per parameter saved at the middle ratio (the nearest measured
    ratio where the middle one removed nothing), then more parameters saved, then the pattern."""
    middle = middle_ratio(profile)

    def key(unit: SensitivityUnit) -> tuple[float, float, str]:
        point = _nearest(unit, middle)
        if point is None:
            return (float("inf"), 0.0, unit.pattern)
        return (max(point.kl, 0.0) / max(point.params_saved, 1), -float(point.params_saved), unit.pattern)

    return sorted(profile.units, key=key)


def has_accuracy(profile: SensitivityProfile) -> bool:
    """Whether any point has an accuracy drop (labels existed)."""
    return any(p.accuracy_drop_points is not None for u in profile.units for p in u.points)


def summary_text(profile: SensitivityProfile) -> str:
    """One sentence: what was measured, on what, how, and what it cost."""
    ratios = ", ".join(ratio_label(r) for r in sorted(profile.ratios)) or "no ratios"
    return (
        f"{len(profile.units)} units, each pruned alone at {ratios} with importance `{profile.importance}`, "
        f"then repaired with recovery `{profile.recovery}`, and compared with the original on "
        f"{profile.samples} calibration images (disjoint from the evaluation images); measured in "
        f"{profile.seconds:.1f} s." + _fixed_ridge_text(profile)
    )


def _fixed_ridge_text(profile: SensitivityProfile) -> str:
    if not profile.fixed_ridge:
        return ""
    most = max(profile.fixed_ridge.values())
    return (
        f" The probes of {len(profile.fixed_ridge)} units refit their consumers (up to {most} each) at a fixed ridge "
        "strength, not a cross-validated one: cross-validating them would have taken the profile far past its time "
        "(rounds cross-validate)."
    )


def _share(saved: int, total_params: int | None) -> str:
    if total_params:
        return f"{100 * saved / total_params:.1f}%"
    return f"{saved:,}"


def _cell(point: SensitivityPoint | None, ratio: float, total_params: int | None, accuracy: bool) -> str:
    if point is None:
        return "-"
    parts = [_share(point.params_saved, total_params), f"{100 * point.agreement:.1f}%", kl_text(point.kl)]
    if accuracy:
        parts.append(drop_as_change(point.accuracy_drop_points))
    reached = "" if abs(point.ratio - ratio) < 1e-4 else f"(at {ratio_label(round(point.ratio, 3))}) "
    return reached + " / ".join(parts)


def markdown_lines(profile: SensitivityProfile, total_params: int | None = None) -> list[str]:
    """``report.md``'s sensitivity section: a sentence, then one row per unit, most prunable first."""
    accuracy = has_accuracy(profile)
    ratios = sorted(profile.ratios)
    middle = middle_ratio(profile)
    saved = "params saved" if total_params else "params saved (count)"
    what = f"{saved} / agreement / KL" + (" / Δacc (pts)" if accuracy else "")
    lines = [
        "",
        "## Sensitivity: damage of pruning each unit alone",
        "",
        summary_text(profile),
        "",
        "Agreement: share of calibration images where the pruned model keeps the original's top-1 class; KL: "
        "mean KL(original ‖ pruned) of the softmax outputs, in nats"
        + ("; Δacc: accuracy change on the calibration images, in points" if accuracy else "")
        + ". Damages of different units roughly add up; heads and channels are separate units. Sorted most "
        + (f"prunable first (least KL per parameter saved at {ratio_label(middle)})." if middle else "prunable first."),
        "",
        "| unit | type | size | " + " | ".join(f"{ratio_label(r)}: {what}" for r in ratios) + " |",
        "|---|---|---|" + "---|" * len(ratios),
    ]
    for unit in ranked_units(profile):
        cells = [_cell(point_at(unit, r), r, total_params, accuracy) for r in ratios]
        pattern = unit.pattern.replace("|", "\\|")
        lines.append(f"| `{pattern}` | {unit.pruning_type} | {unit.size} | " + " | ".join(cells) + " |")
    if profile.skipped:
        lines += ["", "Not measured:"] + [f"- `{p}`: {why}" for p, why in sorted(profile.skipped.items())]
    return lines
