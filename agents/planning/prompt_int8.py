"""The LLM planner's view of the measured int8 sensitivity: what int8 does per block, on this CPU.

:func:`int8_lines` gives the int8 settings the deployment uses (the CPU kind, the share of the accuracy budget kept
for int8), the damage of int8 on every layer, and one line per block, most sensitive first and capped, so that the
planner can keep the blocks that dominate int8's damage in float (``dtype`` ``float32``).
"""

from __future__ import annotations

from agents.planning.base import PlanningContext

__all__ = ["MAX_BLOCKS", "int8_lines"]

#: Blocks listed in the prompt at most (the most sensitive ones).
MAX_BLOCKS = 8


def int8_lines(ctx: PlanningContext, max_blocks: int = MAX_BLOCKS) -> list[str]:
    """The int8 sensitivity table (when none was measured, why, where the run said)."""
    sens = ctx.profile.int8_sensitivity
    if sens is None:
        why = ctx.profile.int8_not_measured
        return [f"Int8 sensitivity per block: not measured ({why}): every layer int8."] if why else []
    target = sens.int8.get("target", "?")
    lines = [
        f"Measured int8 sensitivity ({sens.backend}, static int8 built for {target} CPUs, on {sens.images} "
        f"calibration images; {ctx.int8_reserve_points:.2f} accuracy points of the budget are kept for int8):",
        f"- every layer int8: {sens.full_flips_pct:.1f} % of top-1 answers change, KL {sens.full_kl:.4f}",
        "- one block int8 alone, the rest float (most sensitive first): block, layers, KL, top-1 flips",
    ]
    lines += [
        f"  {g.group}: {len(g.layers)} layer(s), KL {g.kl:.4f}, {g.flips_pct:.1f} %" for g in sens.groups[:max_blocks]
    ]
    if len(sens.groups) > max_blocks:
        lines.append(f"  ({len(sens.groups) - max_blocks} more blocks, less sensitive)")
    return lines
