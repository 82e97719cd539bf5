"""How much of the profile, the sensitivity table and the history a planning prompt shows.

A :class:`PromptDetail` caps each long part of the prompt; :data:`LEVELS` goes from everything to the
most important entries only (the layer groups with the largest latency share, the most prunable
sensitivity units, the best and the latest rounds) and swaps the JSON schema for a compact example.
The LLM planner picks the first level whose prompt fits the run's ``--llm-context-tokens``
(:func:`tools.llm.budget.fit_messages`) and says what was cut (:func:`cuts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.prompt_int8 import MAX_BLOCKS
from agents.planning.prompt_sensitivity import MAX_UNITS

__all__ = [
    "FULL",
    "LEVELS",
    "PromptDetail",
    "capped",
    "compact_schema_text",
    "cuts",
    "rounds_shown",
]


@dataclass(frozen=True)
class PromptDetail:
    """Caps on the long parts of a planning prompt (None: no cap)."""

    name: str
    groups: int = 12
    """Layer groups of the profile table, by latency share."""
    lines: int | None = None
    """Entries of each list: head-prunable, structured-prunable and not-prunable groups."""
    units: int = MAX_UNITS
    """Sensitivity units, most prunable first."""
    rounds: int | None = None
    """Earlier rounds shown in full: the latest ones, plus the best within budget."""
    int8_blocks: int = MAX_BLOCKS
    """Blocks of the int8 sensitivity table, most sensitive first."""
    compact_schema: bool = False
    """A short example of the answer instead of the full JSON schema."""


FULL = PromptDetail("full")
#: From everything to the essentials; each level cuts at least as much as the one before.
LEVELS: tuple[PromptDetail, ...] = (
    FULL,
    PromptDetail("shorter", groups=8, lines=12, units=20, rounds=6, int8_blocks=6),
    PromptDetail("short", groups=6, lines=8, units=12, rounds=4, int8_blocks=4, compact_schema=True),
    PromptDetail("shortest", groups=4, lines=5, units=6, rounds=2, int8_blocks=2, compact_schema=True),
    PromptDetail("minimal", groups=3, lines=3, units=3, rounds=1, int8_blocks=1, compact_schema=True),
)


_LIST_CUT = "left out to fit the context window"


def capped(lines: list[str], limit: int | None, what: str, advice: str = "") -> list[str]:
    """``lines`` cut to ``limit`` entries, with one line saying how many ``what`` were left out (and ``advice``)."""
    if limit is None or len(lines) <= limit:
        return lines
    extra = f"; {advice}" if advice else ""
    return [*lines[:limit], f"- ({len(lines) - limit} more {what} {_LIST_CUT}{extra})"]


def rounds_shown(history: list[RoundRecord], detail: PromptDetail) -> tuple[list[RoundRecord], int]:
    """The rounds shown in full (in order: the latest ``detail.rounds`` and the best within budget), and how
    many were left out."""
    ordered = sorted(history, key=lambda r: r.round)
    if detail.rounds is None or len(ordered) <= detail.rounds:
        return ordered, 0
    keep = {r.round for r in ordered[-detail.rounds :]}
    ok = [r for r in ordered if r.within_budget]
    if ok:
        best = min(ok, key=lambda r: (-(r.accuracy if r.accuracy is not None else -1.0), r.params, r.round))
        keep.add(best.round)
    shown = [r for r in ordered if r.round in keep]
    return shown, len(ordered) - len(shown)


def compact_schema_text(max_ratio: float, *, iteration: bool) -> str:
    """A short example of the answer's JSON (for prompts too small for the full schema)."""
    quantization = (
        ""
        if iteration
        else ', "quantization_recommendations": [{"layer": "all or a regex", "quantization_type": "dynamic or '
        'static", "dtype": "qint8, float16 or float32"}]'
    )
    return (
        'Answer format (OptimizationPlan): {"pruning_recommendations": [{"layer": "<a regex from the lists '
        f'above>", "pruning_type": "structured or head", "pruning_ratio": <number in [0, {max_ratio:g}]>, '
        f'"justification": "<short reason>"}}]{quantization}}}'
    )


def cuts(detail: PromptDetail, ctx: PlanningContext, text: str = "") -> list[str]:
    """What ``detail`` leaves out of ``ctx``'s full prompt, e.g. ``sensitivity table: 6 of 40 units``; ``text``,
    the prompt built at ``detail``, tells whether any list of layer groups was cut."""
    out = []
    groups = min(len(ctx.profile.groups), FULL.groups)
    if groups > detail.groups:
        out.append(f"layer groups: {detail.groups} of {groups}")
    sens = ctx.profile.sensitivity
    units = min(len(sens.units), FULL.units) if sens is not None else 0
    if units > detail.units:
        out.append(f"sensitivity table: {detail.units} of {units} units")
    int8 = ctx.profile.int8_sensitivity
    blocks = min(len(int8.groups), FULL.int8_blocks) if int8 is not None else 0
    if blocks > detail.int8_blocks:
        out.append(f"int8 sensitivity table: {detail.int8_blocks} of {blocks} blocks")
    shown, omitted = rounds_shown(list(ctx.history), detail)
    if omitted:
        out.append(f"earlier rounds: {len(shown)} of {len(ctx.history)} in full")
    if detail.lines is not None and f"groups {_LIST_CUT}" in text:
        out.append(f"prunable / not-prunable lists: at most {detail.lines} entries each")
    if detail.compact_schema:
        out.append("answer format: a compact example instead of the JSON schema")
    return out
