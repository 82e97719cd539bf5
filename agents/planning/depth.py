"""Depth for ``--objective latency``: which rounds are not worth planning, and the ladder of whole-block rounds.

At batch 1 an int8 CNN costs per layer, so channel cuts barely pay while a removed block saves every call of its
layers; blocks lose points training-free and come back distilled (``selection.BLOCK_RESCUE_BUDGETS``). The rules
planner's budget search allocates within the accuracy budget training-free, so it fills a 1-point budget with channel
cuts and at most a block or two: CIFAR ResNet-20 in ONNX Runtime int8 (a CPU without VNNI), five channel rounds at
0.99-1.01x the original while its blocks measured 63-168 µs of its 490 each; ResNet-56 in OpenVINO int8, eleven rounds
of channels and one block at 0.99-1.04x, where nine blocks distilled run 1.49x within a point
(``benchmarks/block_removal.py``). :func:`depth_step` plans the blocks instead, on a ladder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.damage import DamageModel
from agents.planning.recovery import DEPTH_KEY
from agents.planning.selection import ladder_step_wanted, rescue_limit_points
from tools.compression.units import unit_kind
from tools.schemas import SensitivityUnit

__all__ = ["DEPTH_FIRST_MACS_SHARE", "DEPTH_KEY", "DepthStep", "Spent", "depth_step"]

#: The first depth round removes the fewest blocks that save this share of the model's MACs: a round must run 3 %
#: faster than the kept one to be worth a distillation (the deployment's tie margin), and one of CIFAR ResNet-56's 27
#: blocks (3.7 % of its MACs) ran 1.00-1.06x in OpenVINO int8, where ResNet-20's one of nine (11 %) ran 1.15x.
DEPTH_FIRST_MACS_SHARE = 0.10


@dataclass(frozen=True)
class Spent:
    """The allocations not worth planning: every round's so far (kept or not), the empty one, and any that prunes
    every unit of a *collapsed* round at least as much: a training-free round that lost more than distillation is
    ever asked to take back (:func:`~agents.planning.selection.rescue_limit_points`), since pruning more of the same
    loses more. CIFAR ResNet-20 with ``--objective latency``: layer3.2 removed lost 34 points, and the round planned
    after it removed layer1.0 with it (32.7)."""

    allocations: list[Any]
    collapsed: list[dict[str, float]]

    @classmethod
    def of(cls, ctx: PlanningContext) -> Spent:
        collapsed = [
            {str(p): float(v) for p, v in r.planner_state["allocation"].items()}
            for r in ctx.history
            if r.distilled_from is None
            and isinstance(r.planner_state.get("allocation"), dict)
            and r.planner_state["allocation"]
            and float(r.accuracy_drop_points or 0.0) > rescue_limit_points(r.plan, ctx.max_accuracy_drop)
        ]
        return cls([r.planner_state.get("allocation") for r in ctx.history], collapsed)

    def __contains__(self, allocation: object) -> bool:
        if allocation in self.allocations:
            return True
        if not isinstance(allocation, dict):
            return False
        if not allocation:  # prunes nothing: the original again (CIFAR ResNet-56's round 4 was)
            return True
        return any(all(float(allocation.get(p, 0.0)) >= r for p, r in c.items()) for c in self.collapsed)


class DepthStep(NamedTuple):
    """A depth round: its allocation (ratio by unit pattern), predicted damage (share of answers changed), note, and
    the blocks it removes (``DEPTH_KEY``)."""

    allocation: dict[str, float]
    predicted: float
    note: str
    blocks: int


def _held(ctx: PlanningContext) -> RoundRecord | None:
    """The latest round within budget that removes the most blocks (training-free or distilled): a ladder step
    removes more blocks on top of everything it cut."""
    held = max((r.layers_removed for r in ctx.history if r.within_budget), default=0)
    rounds = [r for r in ctx.history if r.within_budget and held and r.layers_removed == held]
    return rounds[-1] if rounds else None


def depth_step(ctx: PlanningContext, seen: Spent) -> DepthStep | None:
    """The next depth round; None where it is not the latency objective, blocks are not allowed or the ladder's step
    was planned. Where distillation follows, a depth round over the budget is brought back by it; where it does not
    (``--distill-rescues 0``, or off at this size as for 224-260 px models), the round is judged training-free like any
    other and kept only within the budget: EfficientNet-Lite2's stride-1 blocks removed alone changed 3 % of the
    answers on 64 ImageNet images, where 100 steps of distillation on 312 images made one removed block worse (97.3 ->
    91.5 % agreement with the original on 188 images it did not see).

    The ladder: the fewest blocks that save :data:`DEPTH_FIRST_MACS_SHARE` of the MACs first (one block where no
    distillation follows: the share is what makes a round worth a distillation), then
    :data:`~agents.planning.selection.LADDER_GROWTH` times the most a round within budget removes (training-free or
    distilled), each step once (a depth round with that many was planned), the blocks that save the most MACs per
    unit of damage first (not their probes' timed savings: a removed block always saves its layers' calls, and a
    probe's few per cent drown in timing noise on a loaded machine, where 23 of CIFAR ResNet-56's 25 blocks timed
    slower removed). A step keeps everything the round it grows from cut (its channels too) and removes more blocks:
    so it runs faster than that round, and its students may start from that round's (``tools.stages.cross_fit``). CIFAR
    ResNet-56's latency run kept three blocks with the first stage's inner channels halved (1.32x in OpenVINO int8);
    its next step, five blocks alone, ran no faster (1.31x), so it was never distilled and the run shipped 1.21x."""
    sens = ctx.profile.sensitivity
    if ctx.objective != "latency" or sens is None:
        return None
    model = DamageModel.fit(sens)
    ranked = _ranked_blocks(ctx, model)
    step = ladder_step_wanted(ctx.history)
    wanted = _blocks_wanted(ctx, ranked, step)
    if wanted < 1 or any(int(r.planner_state.get(DEPTH_KEY) or 0) >= wanted for r in ctx.history):
        return None
    grows = _held(ctx) if step is not None else None  # a ladder step: the round within budget it grows from
    kept = grows.planner_state.get("allocation") if grows is not None else None
    base = {str(p): float(v) for p, v in kept.items()} if isinstance(kept, dict) else {}
    units = {u.pattern: u for u in sens.units}
    removed = [p for p, v in base.items() if v >= 1.0 and p in units and unit_kind(units[p]).sheds_layers]
    chosen = [u for u in ranked if u.pattern not in base][: max(0, wanted - len(removed))]
    allocation = {**base, **{u.pattern: 1.0 for u in chosen}}
    if len(removed) + len(chosen) < wanted or allocation in seen:
        return None
    predicted = model.flips_of((units[p], v) for p, v in allocation.items() if p in units)
    names = ", ".join(u.modules[0] for u in chosen)
    share = f"{100 * DEPTH_FIRST_MACS_SHARE:.0f} %"
    why = f"the fewest that save {share} of MACs" if ctx.distills else "one first, training-free"
    if grows is not None:
        cuts = f"round {grows.round}'s cuts with {len(chosen)} more block(s), " if len(base) > len(removed) else ""
        why = f"{cuts}more than a round within budget removes ({grows.layers_removed})"
    back = "which distillation after the search brings back" if ctx.distills else "kept only within the budget as is"
    note = (
        f"Depth round: {wanted} block(s) ({names}), the most MACs saved per unit of damage, {why}: at batch 1 "
        f"speed comes from whole blocks, {back}."
    )
    return DepthStep(allocation, predicted, note, len(removed) + len(chosen))


def _macs_saved(unit: SensitivityUnit) -> int:
    """The most MACs (parameters where MACs are unknown) a unit's probes saved."""
    return max((p.macs_saved or p.params_saved for p in unit.points), default=0)


def _ranked_blocks(ctx: PlanningContext, model: DamageModel) -> list[SensitivityUnit]:
    """The units the plan may remove whole (a kind that sheds layers) that save anything, the most MACs saved per unit
    of damage first (then by pattern)."""
    sens = ctx.profile.sensitivity
    assert sens is not None

    def worth(unit: SensitivityUnit) -> float:
        cost = model.cost(unit, 1.0)
        return _macs_saved(unit) / max(cost, 1e-9) if cost is not None else 0.0

    return sorted(
        (u for u in sens.units if unit_kind(u).sheds_layers and ctx.allows(u.pruning_type) and worth(u) > 0),
        key=lambda u: (-worth(u), u.pattern),
    )


def _blocks_wanted(ctx: PlanningContext, ranked: list[SensitivityUnit], step: int | None) -> int:
    """How many blocks the next depth round removes: the ladder's ``step`` where it has one; else one where no
    distillation follows, or the fewest of ``ranked`` that save :data:`DEPTH_FIRST_MACS_SHARE` of the MACs."""
    if step is not None:
        return step
    if not ctx.distills:  # training-free, a step costs an evaluation, not a distillation: one block first
        return 1
    total = max(1, ctx.profile.total_macs)
    wanted, saved = 0, 0
    for unit in ranked:
        wanted, saved = wanted + 1, saved + _macs_saved(unit)
        if saved >= DEPTH_FIRST_MACS_SHARE * total:
            break
    return wanted
