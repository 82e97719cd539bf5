"""The LLM planner's view of the pruning settings and the sensitivity profile: compact, deterministic text.

:func:`settings_lines` names the run's importance criterion and the training-free recovery every plan goes
through; :func:`sensitivity_lines` gives one line per unit (pattern, type, size, then ratio → agreement / KL
/ parameters saved), most prunable first and capped (:data:`MAX_UNITS`) so that the prompt fits the context
window of small local models, with what the numbers mean and how to use them.
"""

from __future__ import annotations

from agents.planning.base import PlanningContext
from tools.compression.recovery import RECOVERY_METHODS
from tools.compression.units import unit_kind
from tools.reporting.sensitivity_view import has_accuracy, kl_text, middle_ratio, ranked_units, ratio_label
from tools.schemas import SensitivityPoint, SensitivityUnit

__all__ = ["MAX_UNITS", "sensitivity_lines", "settings_lines"]

#: Units listed in the prompt at most (the most prunable ones); ~40 lines of ~150 characters.
MAX_UNITS = 40

_IMPORTANCE = {
    "act": "activation-aware: a channel's or head's output weight norm times its activation on calibration images",
    "l1": "L1 norm of the weights",
    "l2": "L2 norm of the weights",
    "random": "random",
}


def settings_lines(ctx: PlanningContext) -> list[str]:
    """How the plan will be applied: which channels/heads go first, and what repairs the model after."""
    sens = ctx.profile.sensitivity
    importance = ctx.importance or (sens.importance if sens else None)
    recovery = ctx.recovery or (sens.recovery if sens else None)
    if importance is None and recovery is None:
        return []
    lines = ["How your plan is applied:"]
    if importance is not None:
        lines.append(
            f"- importance '{importance}' ({_IMPORTANCE.get(importance, 'see the documentation')}): within each "
            "selected module, the least important channels/heads are removed first."
        )
    if recovery is not None:
        if recovery == "none":
            lines.append("- recovery 'none': nothing repairs the pruned model before it is evaluated.")
        else:
            what = RECOVERY_METHODS.get(recovery, "see the documentation")
            lines.append(f"- recovery '{recovery}' after every prune, before evaluation: {what}.")
    return lines


def _point(point: SensitivityPoint, total: int, accuracy: bool) -> str:
    saved = f"{100 * point.params_saved / total:.1f}%" if total else f"{point.params_saved:,}"
    text = f"{ratio_label(point.ratio)}: agree {100 * point.agreement:.1f}%, KL {kl_text(point.kl)}, saves {saved}"
    if accuracy and point.accuracy_drop_points is not None:
        text += f", drop {point.accuracy_drop_points:.2f} pts"
    return text


def _unit(unit: SensitivityUnit, total: int, accuracy: bool) -> str:
    kind = unit_kind(unit)
    points = "; ".join(_point(p, total, accuracy) for p in sorted(unit.points, key=lambda p: p.ratio))
    coupled = f", with {len(unit.members) - 1} coupled layers" if len(unit.members) > 1 else ""
    what = f"{unit.kind or kind.flavour}: {unit.size} {kind.removes_of(unit)}{coupled}"
    return f"- {unit.pattern} ({unit.pruning_type}; {what}) {points}"


def sensitivity_lines(ctx: PlanningContext, max_units: int = MAX_UNITS) -> list[str]:
    """The sensitivity table and how to read it; nothing when the run measured none."""
    sens = ctx.profile.sensitivity
    if sens is None or not sens.units:
        return []
    total = ctx.profile.total_params
    accuracy = has_accuracy(sens)
    ranked = ranked_units(sens)
    shown = ranked[:max_units]
    middle = middle_ratio(sens)
    order = f"least KL per parameter saved at {ratio_label(middle)}" if middle is not None else "least damage"
    lines = [
        f"Sensitivity, measured: each unit below was pruned ALONE at "
        f"{', '.join(ratio_label(r) for r in sorted(sens.ratios))}, repaired with recovery '{sens.recovery}', and "
        f"compared with the original on {sens.samples} calibration images. 'agree' = share of images keeping the "
        "original's top-1 class (100% = no change); 'KL' = mean KL divergence of the outputs (0 = no change); "
        f"'saves' = share of the model's parameters removed"
        + ("; 'drop' = accuracy points lost on those images" if accuracy else "")
        + f". {len(shown)} of {len(ranked)} units, most prunable first ({order}):",
        *(_unit(u, total, accuracy) for u in shown),
    ]
    if len(ranked) > len(shown):
        lines.append(f"- ({len(ranked) - len(shown)} more units, all more damaging per parameter: leave them alone)")
    if sens.skipped:
        lines.append(f"- not measured ({len(sens.skipped)}): " + ", ".join(sorted(sens.skipped)[:10]))
    lines += [
        "How to use it: damages of different units roughly add up, so spend the accuracy budget where damage per "
        "parameter saved is lowest. Give each unit its own recommendation with its pattern as 'layer' and its own "
        "pruning_ratio (high where damage is low, 0 or omitted where it is high); heads and channels are separate "
        "units and move independently. Stay near the measured ratios: damage grows faster than linearly beyond "
        "them.",
    ]
    return lines
