"""Planners turn a profile (and, in the loop, earlier rounds) into an :class:`OptimizationPlan`.

The default ``rules`` planner is offline and deterministic: the same profile and history give the
same plan. It targets the layer groups that cost the most latency and can be pruned without touching
a residual stream (attention heads, MLP expansion layers, convolutions inside residual blocks), and
searches the pruning level across rounds: more while accuracy stays within budget, less once it drops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, Field

from tools.profiling import name_pattern
from tools.schemas import (
    LayerGroupProfile,
    ModelProfile,
    OptimizationPlan,
    PruningRecommendation,
    QuantizationRecommendation,
)

TRANSFORMER_FAMILIES = {"vit", "deit", "swin", "transformer"}


class RoundRecord(BaseModel):
    """What a planner sees of one finished round."""

    round: int
    plan: OptimizationPlan
    source: str
    accuracy: float | None = None
    accuracy_drop_points: float | None = None
    params: int
    latency_s: float
    within_budget: bool
    planner_state: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class PlanningContext:
    """What a planner knows besides the profile."""

    profile: ModelProfile
    prunable: dict[str, Any]
    baseline_accuracy: float | None
    max_accuracy_drop: float
    max_ratio: float = 0.6
    history: list[RoundRecord] = field(default_factory=list)


class PlanResult(BaseModel):
    plan: OptimizationPlan
    source: str
    planner_state: dict[str, Any] = Field(default_factory=dict)


class Planner(Protocol):
    name: str

    def analyze(self, ctx: PlanningContext) -> PlanResult: ...

    def next_plan(self, ctx: PlanningContext) -> PlanResult: ...


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
        profile = ctx.profile
        layer_group = {}
        for g in profile.groups:
            rx = re.compile(g.pattern)
            for layer in profile.layers:
                if rx.search(layer.name):
                    layer_group[layer.name] = g
        max_share = max((g.latency_share for g in profile.groups), default=1.0) or 1.0
        targets: list[_Target] = []

        heads: dict[str, int] = ctx.prunable.get("heads", {})
        if heads:
            inside = [layer for layer in profile.layers if any(layer.name.startswith(f"{h}.") for h in heads)]
            share = sum(layer.latency_share for layer in inside)
            macs = sum(layer.macs_share for layer in inside)
            for pat in sorted({name_pattern(h) for h in heads}):
                members = [h for h in heads if re.search(pat, h)]
                counts = sorted({heads[h] for h in members})
                targets.append(_Target(
                    pat, "head", 0.5 + 0.5 * min(1.0, share / max_share),
                    f"{len(members)} attention modules ({'/'.join(map(str, counts))} heads each) take "
                    f"{_pct(share)} of latency and {_pct(macs)} of MACs; whole heads are removed with their "
                    "q/k/v rows and output columns, so the residual width is kept.",
                ))

        coupling: dict[str, int] = ctx.prunable.get("coupling", {})
        structured: list[str] = ctx.prunable.get("structured", [])
        layers = {layer.name: layer for layer in profile.layers}
        first_conv = next((layer.name for layer in profile.layers if layer.type == "Conv2d"), None)
        chosen: dict[str, LayerGroupProfile] = {}
        for name in structured:
            layer = layers.get(name)
            group = layer_group.get(name)
            if layer is None or group is None or coupling.get(name, 1) > 1 or name == first_conv:
                continue
            if layer.type == "Linear" and not self._expands(layer):
                continue  # projections back to the residual width are pruned with their expansion layer
            if layer.type not in ("Linear", "Conv2d"):
                continue
            chosen[group.pattern] = group
        for group in sorted(chosen.values(), key=lambda g: -g.latency_share):
            if group.latency_share < 0.002 and group.macs_share < 0.002:
                continue
            kind = "MLP expansion layers" if group.type == "Linear" else "convolutions inside residual blocks"
            targets.append(_Target(
                group.pattern, "structured", 0.5 + 0.5 * min(1.0, group.latency_share / max_share),
                f"{group.count} {kind} take {_pct(group.latency_share)} of latency, {_pct(group.macs_share)} of "
                f"MACs and {_pct(group.params_share)} of parameters; their output channels are internal to the "
                "block, so removing the weakest ones shrinks this layer and the next without touching the "
                "residual stream.",
            ))
        return targets

    @staticmethod
    def _expands(layer: Any) -> bool:
        if not layer.output_shape:
            return False
        out = int(layer.output_shape[-1])
        return out > 0 and out > layer.params // out  # params = in*out (+ out): in < out

    # --- how much -------------------------------------------------------------------------------

    def _plan_at(self, ctx: PlanningContext, level: float, note: str) -> PlanResult:
        recs = []
        for target in self._targets(ctx):
            ratio = round(min(ctx.max_ratio, level * target.weight), 2)
            if ratio <= 0:
                continue
            recs.append(PruningRecommendation(
                layer=target.pattern, pruning_type=target.pruning_type,  # type: ignore[arg-type]
                pruning_ratio=ratio, justification=f"{target.why} {note}",
            ))
        quant = self._quantization(ctx.profile)
        return PlanResult(
            plan=OptimizationPlan(pruning_recommendations=recs, quantization_recommendations=quant),
            source=self.name, planner_state={"level": round(level, 4)},
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
        gaps = [(b - a, (a + b) / 2) for a, b in zip(points, points[1:], strict=False)]
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


PLANNERS: dict[str, Planner] = {"rules": RulesPlanner()}


def get_planner(name: str) -> Planner:
    try:
        return PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}: choose one of {', '.join(PLANNERS)}") from None
