"""The default ``rules`` planner: offline and deterministic (the same profile and history give the same plan).

With a sensitivity profile (``profile.sensitivity``, measured on the calibration images) it *allocates*
per-unit ratios: every attention module's heads, the width of its heads, and every block-internal channel
group is a unit with a measured damage at a few ratios (against the original, after recovery: its KL divergence,
which adds across units, and the share of images it changes, fitted to the KL over the profile:
:mod:`agents.planning.damage`) and a saving (its share of the model's parameters).
Greedily, the step with the most saving per unit of damage is taken until the predicted damage reaches the round's
*damage budget* (a share of images changed); heads and channels move independently. The rounds then
search the damage budget with real evaluations: grow it while the evaluated candidate stays within the
accuracy budget (1.25x to 4x, by the headroom the candidate left), bisect once one does not. The saving uses
parameters, not timed latency, so plans do not depend on timing noise.

Without a sensitivity profile (no data, or ``--no-sensitivity``) it falls back to one global level over
the groups that cost the most MACs (parameters where MACs are unknown), searched the same way.

With ``--objective latency`` a unit's saving is its measured latency in the runtime the original deploys to, and
where distillation after the search follows, rounds that remove whole blocks are planned first, on a ladder that
doubles as they hold (:mod:`agents.planning.depth`).

Nothing timed at planning time reaches a plan: no decision, ratio, order or justification reads a round's
``latency_s`` or the profile's latency shares (the latency objective reads the sensitivity profile's measured
savings, saved with it), so the same saved profile and the same evaluated rounds give the same plans, byte for byte.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from agents.planning.allocation import (
    allocate,
    exact_pattern,
    next_reachable,
    params_saved,
    unit_saving,
)
from agents.planning.base import PlanningContext, PlanResult, RoundRecord
from agents.planning.damage import DamageModel
from agents.planning.depth import DEPTH_KEY, Spent, depth_step
from agents.planning.quantization import quantization_plan
from agents.planning.recovery import AT_TARGET, damage_for_drop, undershot
from tools.compression.units import UNIT_KINDS, unit_kind, unit_pattern
from tools.profiling.profile import name_pattern
from tools.schemas import (
    LayerProfile,
    ModelProfile,
    OptimizationPlan,
    PruningRecommendation,
    SensitivityUnit,
)

__all__ = ["SEARCH_KEYS", "RulesPlanner"]

#: planner_state keys that carry the rules planner's search (a round whose state has one is its own).
SEARCH_KEYS: tuple[str, ...] = ("damage_budget", "level", DEPTH_KEY)

#: A step toward the distillation target plans a round predicted to change at most this many times the answers of
#: the largest damage budget at the target (``RulesPlanner._step_toward_target``): one unit's next step can be far
#: coarser than the target. cifar10-vit-tiny with ``--objective latency`` (an Intel Xeon, VNNI): a whole encoder layer
#: was the step of least damage per latency saved from a round under the 1.1-point target, and its two rounds were
#: predicted to change 24 and 27 % of the answers where the target's budget was 10.7 %, lost 5.0 and 6.7 points, and
#: were never distilled; each one counted against the kept round as a try (17 of them).
TARGET_STEP_REACH = 2.0

#: The least and the most a damage budget that held is grown by (see ``RulesPlanner._growth``).
MIN_GROWTH = 1.25
MAX_GROWTH = 4

TRANSFORMER_FAMILIES = {"vit", "deit", "swin", "transformer"}

#: A round over the accuracy budget whose measured share of changed answers is more than this many times its
#: predicted damage is a miss of the damage model: the next budget shrinks by the miss, not by a third.
FAR_PAST_PREDICTION = 3.0
#: What of the miss-scaled budget is planned (damage grows faster than linearly past a unit's measured ratios).
SURPRISE_MARGIN = 0.8


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _predicted_damage(r: RoundRecord) -> float:
    return float(r.planner_state.get("predicted_damage") or r.planner_state.get("damage_budget") or 0.0)


def _units_to_step(
    ctx: PlanningContext, model: DamageModel, base: dict[str, float], step: float
) -> list[SensitivityUnit]:
    """The sensitivity units in the order a coordinate step from allocation ``base`` tries them: to grow (``step``
    > 0), least marginal damage per marginal saving first; to shrink, the most damaging after the step first."""
    sens = ctx.profile.sensitivity
    assert sens is not None

    def damage_after(unit: SensitivityUnit) -> float:
        ratio = min(ctx.max_ratio, max(0.0, base.get(unit.pattern, 0.0) + step))
        cost = model.cost(unit, ratio)
        return float("inf") if cost is None else cost

    def damage_per_saving(unit: SensitivityUnit) -> float:
        current = base.get(unit.pattern, 0.0)
        ratio = next_reachable(unit, current, step)
        if ratio is None:
            return float("inf")
        c0, c1 = model.cost(unit, current), model.cost(unit, ratio)
        v0 = unit_saving(unit, current, ctx.profile.total_params, ctx.objective)
        v1 = unit_saving(unit, ratio, ctx.profile.total_params, ctx.objective)
        if c1 is None or v1 is None or v1 <= (v0 or 0.0):
            return float("inf")
        return max(c1 - (c0 or 0.0), 0.0) / (v1 - (v0 or 0.0))

    if step > 0:
        return sorted(sens.units, key=damage_per_saving)
    return sorted(sens.units, key=damage_after, reverse=True)


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

    @staticmethod
    def _cost_shares(profile: ModelProfile, layers: list[LayerProfile]) -> tuple[float, float]:
        """(MACs share, parameters share) of ``layers``, from the exact counts (never from a timing)."""
        macs = sum(lp.macs for lp in layers) / profile.total_macs if profile.total_macs > 0 else 0.0
        params = sum(lp.params for lp in layers) / profile.total_params if profile.total_params > 0 else 0.0
        return macs, params

    def _targets(self, ctx: PlanningContext) -> list[_Target]:
        """Head groups and internal structured groups, weighted by their share of MACs (else of parameters).

        Ranked by that share, ties by pattern, so the same profile always gives the same targets in the same
        order: timed latency shares are too noisy to rank by.
        """
        profile = ctx.profile
        layers = {layer.name: layer for layer in profile.layers}
        by_macs = profile.total_macs > 0 and any(lp.macs > 0 for lp in profile.layers)
        raw: list[tuple[str, str, float, str]] = []  # pattern, type, cost share, justification
        # units the sensitivity profile tried and could not prune at any ratio (BiT's GroupNorm, PvtV2's reshape)
        failed = set(profile.sensitivity.skipped) if profile.sensitivity is not None else set()
        universe = list(layers)
        for kind in [k for k in UNIT_KINDS.values() if ctx.allows(k.name)]:
            for members, why in kind.level_targets(ctx.prunable, profile.layers):
                members = [m for m in members if unit_pattern(m) not in failed]
                inside = [
                    lp for lp in profile.layers if any(lp.name == m or lp.name.startswith(f"{m}.") for m in members)
                ]
                if not members or not inside:
                    continue
                macs, params = self._cost_shares(profile, inside)
                if macs < 0.002 and params < 0.002:
                    continue
                pattern = (
                    exact_pattern(members, universe) if all(m in layers for m in members) else name_pattern(members[0])
                )
                share = f"They hold {_pct(macs)} of MACs and {_pct(params)} of parameters; "
                raw.append((pattern, kind.name, macs if by_macs else params, share + why[0].lower() + why[1:]))

        top = max((share for _, _, share, _ in raw), default=0.0) or 1.0
        raw.sort(key=lambda t: (-t[2], t[0]))
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
        quant = quantization_plan(ctx.profile, ctx.int8_reserve_points)
        return PlanResult(
            plan=OptimizationPlan(pruning_recommendations=recs, quantization_recommendations=quant),
            source=self.name,
            planner_state={"level": round(level, 4)},
        )

    @staticmethod
    def _widest_gap(levels: list[float], upper: float) -> float:
        points = [lvl for lvl in levels if lvl < upper] + [upper]
        gaps = [(b - a, (a + b) / 2) for a, b in itertools.pairwise(points)]
        return max(gaps)[1] if gaps else upper / 2

    # --- allocation from the sensitivity profile ------------------------------------------------

    def _initial_budget(self, ctx: PlanningContext) -> float:
        """Damage budget of the first round: twice the accuracy budget as a fraction of predictions."""
        return max(0.002, 2 * ctx.max_accuracy_drop / 100)

    def _allocated(self, ctx: PlanningContext, budget: float, note: str) -> PlanResult:
        sens = ctx.profile.sensitivity
        assert sens is not None
        ratios, _ = allocate(sens, ctx.profile.total_params, budget, ctx.max_ratio, ctx.objective)
        for _ in range(12):  # a budget too small for any step would waste the round: raise it until one fits
            if ratios:
                break
            budget *= 2
            note += f" Raised the damage budget to {budget:.4f}: no unit fitted in less."
            ratios, _ = allocate(sens, ctx.profile.total_params, budget, ctx.max_ratio, ctx.objective)
        return self._plan_from(ctx, ratios, budget, note)

    def _plan_from(self, ctx: PlanningContext, ratios: dict[str, float], budget: float, note: str) -> PlanResult:
        """The plan that prunes each unit pattern of ``ratios`` at its ratio (same ratio, same recommendation)."""
        sens = ctx.profile.sensitivity
        assert sens is not None
        units = {u.pattern: u for u in sens.units}
        model = DamageModel.fit(sens)
        predicted = model.flips_of((units[p], r) for p, r in ratios.items())
        groups: dict[tuple[str, str, float], list[SensitivityUnit]] = {}
        removed = [units[p].modules[0] for p, r in ratios.items() if unit_kind(units[p]).whole and r > 0]
        for pattern, ratio in ratios.items():
            unit = units[pattern]
            if any(m.startswith(b + ".") for b in removed for m in (*unit.modules, *unit.members)):
                continue  # inside a block the plan removes whole
            groups.setdefault((unit.pruning_type, unit.kind, ratio), []).append(unit)
        # every layer a pattern can reach, not only the measured units: a generalised pattern must not take in
        # coupled layers never measured (ResNet's block-output conv, RegNet's squeeze-excite expand conv)
        universe = sorted(
            {m for u in sens.units for m in u.modules}
            | set(ctx.prunable.structured)
            | set(ctx.prunable.blocked)
            | set(ctx.prunable.heads)
            | set(ctx.prunable.blocks)
        )
        order = list(UNIT_KINDS)
        recs = []
        for (pruning_type, _, ratio), members in sorted(
            groups.items(), key=lambda kv: (-UNIT_KINDS[kv[0][0]].whole, order.index(kv[0][0]), kv[0][1], -kv[0][2])
        ):
            kind = UNIT_KINDS[pruning_type]
            names = [m for u in members for m in u.modules]
            measured = "; ".join(self._measured(u, ratio) for u in members[:4])
            more = f" (+{len(members) - 4} more)" if len(members) > 4 else ""
            what = kind.removes_of(members[0])
            share = f"lose {_pct(ratio)} of their {what}" if not kind.whole else f"are removed: {what}"
            recs.append(
                PruningRecommendation(
                    layer=exact_pattern(names, universe) if len(names) > 1 else members[0].pattern,
                    pruning_type=kind.name,
                    pruning_ratio=round(ratio, 4),
                    justification=(
                        f"{len(members)} unit(s) {share}; measured alone on "
                        f"{sens.samples} calibration images after {sens.recovery} recovery: {measured}{more}. "
                        f"{note}"
                    ),
                )
            )
        return PlanResult(
            plan=OptimizationPlan(
                pruning_recommendations=recs,
                quantization_recommendations=quantization_plan(ctx.profile, ctx.int8_reserve_points),
            ),
            source=self.name,
            planner_state={
                "damage_budget": round(budget, 6),
                "predicted_damage": round(predicted, 6),
                "allocation": {p: round(r, 4) for p, r in sorted(ratios.items())},
            },
        )

    @staticmethod
    def _measured(unit: SensitivityUnit, ratio: float) -> str:
        nearest = min(unit.points, key=lambda p: abs(p.ratio - ratio))
        return (
            f"{unit.modules[0]} at {nearest.ratio:g}: {100 * nearest.agreement:.1f}% agreement, "
            f"KL {nearest.kl:.4f}, -{nearest.params_saved} params"
        )

    @staticmethod
    def _growth(ctx: PlanningContext, budget: float) -> float:
        """How much to grow a damage budget that held: by the headroom its round left, 1.25x to 4x.

        The headroom is the accuracy budget over what the budget test held against it (drop + one standard
        error) in the round planned at ``budget``: a round that used a quarter of the accuracy budget grows
        4x, one that used half 2x, one that used 70 % 1.43x (at least :data:`MIN_GROWTH`): damage adds up faster
        than linearly, so a round close to the budget is grown by what is left, not doubled past it (CIFAR
        ResNet-56: doubling from a round at 0.84 of the budget lost 1.2 points). Rounds that lose little more
        than predicted (distillation after each prune recovers most of the predicted damage) so reach the larger
        reductions in fewer rounds. At most :data:`MAX_GROWTH`: a round that changed nothing measurable says little
        about a budget eight times its own (CIFAR ResNet-20, on an AVX2 CPU: 8x from a round at 0.00 lost 16.3
        points in one run and 5.7 in another; Swin-tiny's 4x round held in the run and lost 1.4 on unseen images).
        """
        used = [
            r.budget_drop_points
            for r in ctx.history
            if r.within_budget and r.planner_state.get("damage_budget") == round(budget, 6)
        ]
        if not used or used[-1] is None or ctx.max_accuracy_drop <= 0:
            return 2.0
        headroom = ctx.max_accuracy_drop / max(float(used[-1]), ctx.max_accuracy_drop / MAX_GROWTH)
        if headroom < 2:  # the round used more than half: doubling would overshoot, grow by what is left
            return round(max(MIN_GROWTH, headroom), 4)
        return float(min(MAX_GROWTH, int(headroom)))

    def _next_budgets(self, ctx: PlanningContext) -> list[tuple[float, str]]:
        """Damage budgets to try next, best first: grow while within the accuracy budget (:meth:`_growth`), else
        bisect between the largest budget that held and the smallest one above it that broke. A budget that broke
        below one that held says nothing about where the line lies (its round was unlucky, or a larger budget's
        allocation was a better one): bisecting under the held one only gives allocations tried before. CIFAR
        ResNet-56 on an AMD EPYC: round 0 broke at 0.0113 (0.51 points lost, 0.9 % of answers changed), round 1 held
        at 0.0151 (a smaller budget raised until a unit fitted), and rounds 2-5 moved one unit one step each, 3.7 %
        fewer parameters in all, leaving distillation no larger round to take."""
        tried = [
            (float(r.planner_state["damage_budget"]), r.within_budget)
            for r in ctx.history
            if "damage_budget" in r.planner_state
        ]
        if not tried:
            return [(self._initial_budget(ctx), "First allocation from the sensitivity profile.")]
        good = max((b for b, ok in tried if ok), default=0.0)
        bad = min((b for b, ok in tried if not ok and b > good), default=None)
        if bad is None:
            first = self._growth(ctx, good)
            note = f"Damage budget {good:.4f} stayed within the accuracy budget: growing it {first:g}x."
            return [(good * k, note) for k in (first, *(k for k in (2, 3, 4, 6, 8) if k > first))]
        if good <= 0:
            surprise = self._surprise(ctx, bad)
            if surprise is not None:
                factor, measured, predicted = surprise
                note = (
                    f"Damage budget {bad:.4f} broke the accuracy budget, its round changing {_pct(measured)} of the "
                    f"answers where {_pct(predicted)} were predicted: shrinking it {1 / factor:.1f}x, by that miss."
                )
                return [(bad * k, note) for k in (factor, factor / 3, factor * 2)]
            note = f"Damage budget {bad:.4f} broke the accuracy budget: shrinking it."
            return [(bad * k, note) for k in (1 / 3, 2 / 3, 1 / 9)]
        note = f"Damage budget {bad:.4f} broke the accuracy budget, {good:.4f} held: searching between them."
        between = [(good * bad) ** 0.5] + [good + (bad - good) * k / 8 for k in (4, 2, 6, 1, 3, 5, 7)]
        return [(b, note) for b in between]

    @staticmethod
    def _surprise(ctx: PlanningContext, budget: float) -> tuple[float, float, float] | None:
        """Where the round planned at damage ``budget`` changed far more answers than its damage model predicted
        (over :data:`FAR_PAST_PREDICTION` times): the factor that shrinks the budget by that miss (at most 1/3), with
        the measured and predicted shares. A collapsed round says the profile's damage did not add up as the model
        assumed; a third of its budget repeats most of it (an EfficientNet-Lite2 whose first round kept 0.5 % of its
        top-1 lost 80 points again at a third)."""
        rounds = [
            r
            for r in ctx.history
            if r.planner_state.get("damage_budget") == round(budget, 6)
            and r.measured_damage is not None
            and r.predicted_damage
        ]
        if not rounds:
            return None
        worst = max(rounds, key=lambda r: (r.measured_damage or 0.0) / (r.predicted_damage or 1.0))
        measured, predicted = float(worst.measured_damage or 0.0), float(worst.predicted_damage or 0.0)
        if measured <= FAR_PAST_PREDICTION * predicted:
            return None
        return min(1 / 3, SURPRISE_MARGIN * predicted / measured), measured, predicted

    def _coordinate_step(
        self,
        ctx: PlanningContext,
        seen: Spent,
        base_round: RoundRecord | None = None,
        max_damage: float | None = None,
    ) -> PlanResult | None:
        """When the budget search only finds tried allocations: move one unit of the best one by one step.

        From ``base_round``'s allocation, by default the smallest within-budget one (else the last one), grow one
        unit by 0.1, least marginal damage per marginal saving first (the allocation's measure); failing that (or
        first, without a round within budget), shrink one unit by 0.1, most damaging first; from a given
        ``base_round``, only grow; with ``max_damage``, only to an allocation predicted to change at most that share
        of the answers. The first allocation not tried yet is planned; None when every neighbour was
        tried. Ranked by damage alone, growth took the step that cost least however little it removed: CIFAR
        ResNet-32's two steps past its kept round took a 16-channel layer1 convolution to half (0.5 % of the
        parameters) and lost 1.05 and 1.10 points.
        """
        sens = ctx.profile.sensitivity
        assert sens is not None
        rounds = [r for r in ctx.history if isinstance(r.planner_state.get("allocation"), dict)]
        good = [r for r in rounds if r.within_budget]
        if not rounds:
            return None
        steps: tuple[float, ...] = (0.1, -0.1) if good else (-0.1, 0.1)
        if base_round is None:
            base_round = min(good, key=lambda r: r.params) if good else rounds[-1]
        else:
            steps = (0.1,)
        base = {str(k): float(v) for k, v in base_round.planner_state["allocation"].items()}
        budget = float(base_round.planner_state.get("damage_budget", 0.0))
        model = DamageModel.fit(sens)
        units = {u.pattern: u for u in sens.units}
        for step in steps:
            for unit in _units_to_step(ctx, model, base, step):
                current = base.get(unit.pattern, 0.0)
                ratio = next_reachable(unit, current, step)
                kind = unit_kind(unit)
                if ratio is None or not kind.allowed(ratio, ctx.max_ratio) or ratio < 0 or (step < 0 and current <= 0):
                    continue
                taken = [u for u in sens.units if base.get(u.pattern, 0.0) > 0]
                if current <= 0 and not kind.admits(unit, taken, sens.units):
                    continue
                ratios = {p: r for p, r in {**base, unit.pattern: ratio}.items() if r > 0}
                if not ratios or {p: round(r, 4) for p, r in sorted(ratios.items())} in seen:
                    continue
                if max_damage is not None and model.flips_of((units[p], r) for p, r in ratios.items()) > max_damage:
                    continue
                verb = "growing" if step > 0 else "shrinking"
                note = f"Budget search converged: {verb} {unit.modules[0]} to {ratio:g} from round {base_round.round}."
                return self._plan_from(ctx, ratios, budget, note)
        return None

    # --- the planner protocol -------------------------------------------------------------------

    def analyze(self, ctx: PlanningContext) -> PlanResult:
        if ctx.profile.sensitivity is not None and ctx.profile.sensitivity.units:
            budget = self._initial_budget(ctx)
            return self._allocated(ctx, budget, f"Allocated under a damage budget of {budget:.4f}.")
        return self._plan_at(ctx, self.start_level, f"Initial level {self.start_level:.2f}, scaled by MACs share.")

    @staticmethod
    def _distillation_anchor(ctx: PlanningContext) -> RoundRecord | None:
        """The source of the most pruned round that came back within budget by distillation (by its predicted
        damage), not the one that lost the most before: CIFAR ResNet-56's 20.6 % round lost 0.20 and its 18.4 % one
        0.49, and anchored on the latter the rounds planned at the target were smaller than the kept one."""
        back = [r for r in ctx.history if r.distilled_from is not None and r.within_budget]
        sources = [r for r in ctx.history if r.round in {b.distilled_from for b in back}]
        return max(sources, key=_predicted_damage, default=None)

    def _larger_than_anchor(self, ctx: PlanningContext, allocation: dict[str, float]) -> bool:
        """Whether ``allocation`` removes more parameters than the round distillation brought back (its source,
        :meth:`_distillation_anchor`), by the measured points: a round at the target is only worth distilling if it
        is the smaller model. CIFAR ResNet-32: the budgets at its target gave the kept round's allocation or a
        smaller one, which the search evaluated (0.421 M parameters against the kept 0.417 M) and could not use."""
        anchor = self._distillation_anchor(ctx)
        sens = ctx.profile.sensitivity
        kept = anchor.planner_state.get("allocation") if anchor is not None else None
        if sens is None or not isinstance(kept, dict):
            return True
        return params_saved(sens, allocation) > params_saved(sens, {str(k): float(v) for k, v in kept.items()})

    @staticmethod
    def _distillation_budgets(ctx: PlanningContext) -> list[tuple[float, str]]:
        """After a distilled round came back within budget: damage budgets at which a pruned round should lose
        :attr:`PlanningContext.distillation_target_points` before distillation (the drop the next distillation
        can be expected to bring back), from the pruned rounds' predicted damage and measured drop
        (:func:`~agents.planning.recovery.damage_for_drop`, from the most damaged source of a round that came back),
        at most twice that source's damage, then 0.9x and 0.8x where that allocation was tried (1.1x and 1.2x after a
        round at the target fell short of it: ``recovery.undershot``). Empty without a target or a fit."""
        target = ctx.distillation_target_points
        if target is None:
            return []

        points = [
            (_predicted_damage(r), float(r.accuracy_drop_points))
            for r in ctx.history
            if r.distilled_from is None and r.accuracy_drop_points is not None
        ]
        anchor = RulesPlanner._distillation_anchor(ctx)
        if anchor is None or anchor.accuracy_drop_points is None:
            return []
        largest = _predicted_damage(anchor)
        planned = damage_for_drop(points, (largest, float(anchor.accuracy_drop_points)), target)
        if planned is None:
            return []
        planned = min(planned, 2 * largest)
        note = (
            f"Distillation after the search brought a round back within budget: planning one that should lose "
            f"about {target:.2f} points before distillation (what the recovery measured so far brings back), at a "
            f"damage budget of {planned:.4f}."
        )
        last = ctx.history[-1] if ctx.history else None  # a try after one that fell short follows it directly
        short = last is not None and last.distilled_from is None and undershot(last, target)
        return [(planned * k, note) for k in ((1.0, 1.1, 1.2) if short else (1.0, 0.9, 0.8))]

    def _step_toward_target(
        self, ctx: PlanningContext, seen: Spent, at_target: list[tuple[float, str]]
    ) -> PlanResult | None:
        """When the damage budgets at the distillation target (``at_target``) only give tried allocations (the units'
        ratios are coarse): one unit one step beyond the most pruned round that lost at most the target before
        distillation (:meth:`_coordinate_step`), to a round predicted to change at most :data:`TARGET_STEP_REACH`
        times the largest of those budgets. Before, the search fell back to growing its budget from the rounds within
        budget and planned far past the target: CIFAR ResNet-20, target 1.7 points, lost 8.9."""
        target = ctx.distillation_target_points
        if target is None:
            return None
        under = [
            r
            for r in ctx.history
            if r.distilled_from is None
            and r.accuracy_drop_points is not None
            and r.accuracy_drop_points <= target
            and isinstance(r.planner_state.get("allocation"), dict)
        ]
        if not under:
            return None
        reach = TARGET_STEP_REACH * max(budget for budget, _ in at_target)
        return self._coordinate_step(ctx, seen, base_round=min(under, key=lambda r: r.params), max_damage=reach)

    def _depth_round(self, ctx: PlanningContext, seen: Spent) -> PlanResult | None:
        """The next depth round (:func:`~agents.planning.depth.depth_step`) as a plan, off the damage-budget search:
        a depth round's damage is far past the accuracy budget by design, and grown from as a budget that held it
        planned ResNet-20 rounds keeping 44-52 % of its top-1."""
        step = depth_step(ctx, seen)
        if step is None:
            return None
        planned = self._plan_from(ctx, step.allocation, step.predicted, step.note)
        planned.planner_state.pop("damage_budget", None)
        planned.planner_state[DEPTH_KEY] = step.blocks
        return planned

    def next_plan(self, ctx: PlanningContext) -> PlanResult:
        seen = Spent.of(ctx)
        depth = self._depth_round(ctx, seen)  # the latency objective's depth ladder first: blocks pay at batch 1
        if depth is not None:
            return depth
        if ctx.profile.sensitivity is not None and ctx.profile.sensitivity.units:
            at_target = self._distillation_budgets(ctx)
            for budget, note in at_target:
                planned = self._allocated(ctx, budget, note)
                allocation = planned.planner_state["allocation"]
                if allocation not in seen and self._larger_than_anchor(ctx, allocation):
                    planned.planner_state[AT_TARGET] = ctx.distillation_target_points
                    return planned
            stepped = self._step_toward_target(ctx, seen, at_target) if at_target else None
            if stepped is not None:
                stepped.planner_state[AT_TARGET] = ctx.distillation_target_points
                return stepped
        if any(r.distilled_from is not None for r in ctx.history):
            # once a round came back within budget by distillation, the rounds after it are distilled too: a
            # pruned round over the budget says nothing about its distilled version, so the search forgets them
            kept = [r for r in ctx.history if r.distilled_from is not None or r.within_budget]
            ctx = dataclasses.replace(ctx, history=kept)
        if ctx.profile.sensitivity is not None and ctx.profile.sensitivity.units:
            result = None
            for budget, note in self._next_budgets(ctx):  # the first budget whose allocation is new
                result = self._allocated(ctx, budget, note)
                if result.planner_state["allocation"] not in seen:
                    return result
            refined = self._coordinate_step(ctx, seen)
            if refined is not None:
                return refined
            assert result is not None
            return result
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
