"""Per-layer quantization decisions from the measured int8 sensitivity (the rules planner's, and the LLM's default).

The profile's ``int8_sensitivity`` (``tools.stages.ops.int8_sensitivity``) holds, per block of layers, what static int8
of that block alone does to the model in ONNX Runtime on this CPU (KL divergence and top-1 flips against the float
model, on calibration images), and what int8 of every block does. :func:`quantization_plan` turns it into the
paper's schema: every layer int8, then the blocks whose int8 dominates the damage kept in float (``float32``),
each with the numbers that justify it. The deployment builds both the full-int8 candidate and, from these
decisions, the mixed one, and measures which holds the budget (``tools.stages.deployment``).
"""

from __future__ import annotations

import re
import statistics

from tools.schemas import Int8GroupDamage, Int8Sensitivity, ModelProfile, QuantizationRecommendation

__all__ = ["DOMINANT_SHARE", "MAX_FLOAT_BLOCKS", "dominant_blocks", "quantization_plan"]

#: A block dominates int8's damage when its int8 alone does at least this share of the whole model's (KL) ...
DOMINANT_SHARE = 0.25
#: ... and at least this many times the median block's.
DOMINANT_RATIO = 4.0
#: At most this many blocks are kept in float by the plan (accuracy control may keep more at deployment).
MAX_FLOAT_BLOCKS = 2


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def dominant_blocks(sensitivity: Int8Sensitivity, int8_budget_points: float) -> list[Int8GroupDamage]:
    """The blocks to keep in float: int8 of every block flips more top-1 answers (%) than the int8 share of the
    budget allows (points), and these blocks alone do most of that damage (:data:`DOMINANT_SHARE` of the KL,
    :data:`DOMINANT_RATIO` times the median block's); at most :data:`MAX_FLOAT_BLOCKS`, the worst first."""
    if not sensitivity.groups or sensitivity.full_flips_pct <= int8_budget_points:
        return []
    median = statistics.median(g.kl for g in sensitivity.groups)
    dominant = [
        g
        for g in sensitivity.groups
        if g.kl > 0 and g.kl >= DOMINANT_SHARE * sensitivity.full_kl and g.kl >= DOMINANT_RATIO * median
    ]
    return dominant[:MAX_FLOAT_BLOCKS]


def _block_pattern(group: Int8GroupDamage) -> str:
    """A regex selecting exactly the block's layers (its name as a prefix, or the one layer)."""
    if group.layers == [group.group]:
        return f"^{re.escape(group.group)}$"
    return f"^{re.escape(group.group)}\\."


def quantization_plan(profile: ModelProfile, int8_budget_points: float) -> list[QuantizationRecommendation]:
    """The plan's quantization recommendations: every layer int8, then float32 for the blocks that dominate the
    measured int8 damage (:func:`dominant_blocks`). Without a measured int8 sensitivity (no calibration data, no
    ONNX Runtime), every layer int8, justified by where the parameters and MACs are."""
    sensitivity = profile.int8_sensitivity
    if sensitivity is None:
        linear = [g for g in profile.groups if g.type == "Linear"]
        params, macs = sum(g.params_share for g in linear), sum(g.macs_share for g in linear)
        not_measured = profile.int8_not_measured or "no calibration images"
        why = (
            f"no int8 sensitivity per block was measured ({not_measured}): every layer int8. nn.Linear layers hold "
            f"{_pct(params)} of parameters and {_pct(macs)} of MACs (dynamic int8 quantizes those); static int8 "
            "quantizes the convolutions too."
        )
        return [QuantizationRecommendation(layer="all", quantization_type="dynamic", dtype="qint8", justification=why)]
    target = str(sensitivity.int8.get("target", "?"))
    built_on = (sensitivity.int8.get("built_on") or {}).get("model_name", "this CPU")
    keep = dominant_blocks(sensitivity, int8_budget_points)
    why = (
        f"int8 of every layer, measured ({sensitivity.backend}, built for {target} CPUs, on {built_on}, "
        f"{sensitivity.images} calibration images): {sensitivity.full_flips_pct:.1f} % of top-1 answers change "
        f"(KL {sensitivity.full_kl:.4f})"
    )
    top = ", ".join(f"{g.group} (KL {g.kl:.4f}, {g.flips_pct:.1f} %)" for g in sensitivity.groups[:3])
    why += f"; most sensitive blocks alone: {top}" if top else ""
    why += (
        "; the blocks that dominate that damage stay float below."
        if keep
        else f"; no block dominates it (or it is within the {int8_budget_points:.2f}-point int8 share): all int8."
    )
    recs = [QuantizationRecommendation(layer="all", quantization_type="static", dtype="qint8", justification=why)]
    for g in keep:
        recs.append(
            QuantizationRecommendation(
                layer=_block_pattern(g),
                quantization_type="static",
                dtype="float32",
                justification=(
                    f"int8 of {g.group} alone: KL {g.kl:.4f} ({g.kl / max(sensitivity.full_kl, 1e-12):.0%} of the "
                    f"whole model's), {g.flips_pct:.1f} % top-1 flips: kept in float"
                ),
            )
        )
    return recs
