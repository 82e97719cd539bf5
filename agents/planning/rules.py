"""The default ``rules`` planner: offline and deterministic (the same profile and history give the same plan).

It targets the layer groups that cost the most latency and can be pruned without touching a residual
stream (attention heads, MLP expansion layers, convolutions inside residual blocks), and searches the
pruning level across rounds: more while accuracy stays within budget, less once it drops.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from agents.planning.base import PlanningContext, PlanResult
from tools.profiling.profile import name_pattern
from tools.schemas import (
    ModelProfile,
    OptimizationPlan,
    PruningRecommendation,
    QuantizationRecommendation,
)

__all__ = ["RulesPlanner", "exact_pattern"]

TRANSFORMER_FAMILIES = {"vit", "deit", "swin", "transformer"}


def exact_pattern(members: list[str], universe: list[str]) -> str:
    """A regex selecting exactly ``members`` among ``universe``: block indices generalised where possible."""
    wanted = set(members)

    def exact(pattern: str) -> bool:
        rx = re.compile(pattern)
        return {n for n in universe if rx.search(n)} | wanted == wanted and all(rx.search(n) for n in wanted)

    generic = name_pattern(members[0])
    if exact(generic):
        return generic
    parts = [m.split(".") for m in members]
    for i, part in enumerate(parts[0]):
        if not part.isdigit():
            continue
        values = sorted({p[i] for p in parts}, key=int)
        pieces = [
            ("(?:" + "|".join(values) + ")") if j == i else (r"\d+" if piece.isdigit() else re.escape(piece))
            for j, piece in enumerate(parts[0])
        ]
        candidate = "^" + r"\.".join(pieces) + "$"
        if exact(candidate):
            return candidate
    return "^(?:" + "|".join(re.escape(m) for m in sorted(wanted)) + ")$"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


@dataclass(frozen=True)
class _Target:
    pattern: str
    pruning_type: str
    weight: float
    why: str


class RulesPlanner:
    """Profile-driven rules, no network, deterministic."""

    name = "rules"
    start_level = 0.25
    growth = 1.6
    min_step = 0.02

    # --- what to prune --------------------------------------------------------------------------

    def _targets(self, ctx: PlanningContext) -> list[_Target]:
        """Head groups and internal structured groups, weighted by their share of latency."""
        profile = ctx.profile
        layers = {layer.name: layer for layer in profile.layers}
        raw: list[tuple[str, str, float, str]] = []  # pattern, type, latency share, justification

        heads: dict[str, int] = ctx.prunable.get("heads", {})
        for pat in sorted({name_pattern(h) for h in heads}):
            members = [h for h in heads if re.search(pat, h)]
            inside = [lp for lp in profile.layers if any(lp.name.startswith(f"{h}.") or lp.name == h for h in members)]
            share = sum(lp.latency_share for lp in inside)
            macs = sum(lp.macs_share for lp in inside)
            counts = "/".join(str(c) for c in sorted({heads[h] for h in members}))
            raw.append(
                (
                    pat,
                    "head",
                    share,
                    f"{len(members)} attention modules ({counts} heads each) take {_pct(share)} of latency and "
                    f"{_pct(macs)} of MACs; whole heads are removed with their q/k/v rows and output columns, "
                    "so the residual width is kept.",
                )
            )

        coupling: dict[str, int] = ctx.prunable.get("coupling", {})
        first_conv = next((lp.name for lp in profile.layers if lp.type == "Conv2d"), None)
        by_template: dict[str, list[str]] = {}
        for name in ctx.prunable.get("structured", []):
            if name in layers and coupling.get(name, 1) == 1 and name != first_conv:
                by_template.setdefault(name_pattern(name), []).append(name)
        universe = list(layers)
        for members in by_template.values():
            stats = [layers[n] for n in members]
            share = sum(lp.latency_share for lp in stats)
            macs = sum(lp.macs_share for lp in stats)
            params = sum(lp.params_share for lp in stats)
            if share < 0.002 and macs < 0.002:
                continue
            kind = "Linear layers" if stats[0].type == "Linear" else "convolutions"
            raw.append(
                (
                    exact_pattern(members, universe),
                    "structured",
                    share,
                    f"{len(members)} {kind} take {_pct(share)} of latency, {_pct(macs)} of MACs and "
                    f"{_pct(params)} of parameters; their output channels are internal to their block (the "
                    "dependency graph couples them to no other layer's outputs), so removing the weakest ones "
                    "shrinks this layer and the next without touching a residual stream.",
                )
            )

        top = max((share for _, _, share, _ in raw), default=0.0) or 1.0
        raw.sort(key=lambda t: -t[2])
        return [_Target(p, kind, 0.5 + 0.5 * min(1.0, share / top), why) for p, kind, share, why in raw]

    # --- how much -------------------------------------------------------------------------------

    def _plan_at(self, ctx: PlanningContext, level: float, note: str) -> PlanResult:
        recs = []
        for target in self._targets(ctx):
            ratio = round(min(ctx.max_ratio, level * target.weight), 2)
            if ratio <= 0:
                continue
            recs.append(
                PruningRecommendation(
                    layer=target.pattern,
                    pruning_type=target.pruning_type,  # type: ignore[arg-type]
                    pruning_ratio=ratio,
                    justification=f"{target.why} {note}",
                )
            )
        quant = self._quantization(ctx.profile)
        return PlanResult(
            plan=OptimizationPlan(pruning_recommendations=recs, quantization_recommendations=quant),
            source=self.name,
            planner_state={"level": round(level, 4)},
        )

    @staticmethod
    def _quantization(profile: ModelProfile) -> list[QuantizationRecommendation]:
        linear = [g for g in profile.groups if g.type == "Linear"]
        params = sum(g.params_share for g in linear)
        latency = sum(g.latency_share for g in linear)
        why = (
            f"nn.Linear layers hold {_pct(params)} of parameters and take {_pct(latency)} of latency; "
            "dynamic int8 stores their weights in a quarter of the space and runs them with int8 kernels, "
            "activations are quantized on the fly so no calibration data is needed."
        )
        if params < 0.2:
            why += " Most of this model is convolutional, so the saving is limited to its Linear layers."
        return [QuantizationRecommendation(layer="all", quantization_type="dynamic", dtype="qint8", justification=why)]

    @staticmethod
    def _widest_gap(levels: list[float], upper: float) -> float:
        points = [lvl for lvl in levels if lvl < upper] + [upper]
        gaps = [(b - a, (a + b) / 2) for a, b in itertools.pairwise(points)]
        return max(gaps)[1] if gaps else upper / 2

    def analyze(self, ctx: PlanningContext) -> PlanResult:
        return self._plan_at(ctx, self.start_level, f"Initial level {self.start_level:.2f}, scaled by latency share.")

    def next_plan(self, ctx: PlanningContext) -> PlanResult:
        tried = [(float(r.planner_state.get("level", 0.0)), r.within_budget) for r in ctx.history]
        good = max((lvl for lvl, ok in tried if ok), default=0.0)
        bad = min((lvl for lvl, ok in tried if not ok), default=None)
        cap = ctx.max_ratio
        if bad is None:
            level = min(cap, max(good * self.growth, good + 0.05))
            note = f"Previous level {good:.2f} stayed within the accuracy budget: pruning more."
        else:
            level = (good + bad) / 2
            note = f"Level {bad:.2f} broke the accuracy budget, {good:.2f} held: backing off to the midpoint."
        if any(abs(level - lvl) < self.min_step for lvl, _ in tried):
            level = self._widest_gap(sorted({0.0, *(lvl for lvl, _ in tried)}), bad if bad is not None else cap)
            note += " The search has converged: probing the widest untried interval."
        return self._plan_at(ctx, level, note)
