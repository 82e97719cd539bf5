"""The selection policy: the accuracy budget and the best round, used by the pruning loop and the runner."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any, Protocol

from agents.context import Selection
from agents.planning.recovery import (
    AT_TARGET,
    DEPTH_KEY,
    TARGET_SLACK,
    recoverable_drop,
    recoveries_of,
    undershot,
)
from tools.compression.units import kind_of, sheds_layers
from tools.deploy.choice import TIE_MARGIN
from tools.schemas import OptimizationPlan, RoundResult
from tools.stats import CHOOSE_Z, budget_drop_points, selection_z, standard_error_points, within_budget

__all__ = [
    "TIE_Z",
    "accuracy_drop_points",
    "best_round",
    "blocks_removed",
    "budget_drop_points",
    "distillation_target",
    "kept_round",
    "ladder_starts",
    "layers_removed",
    "rescue_limit_points",
    "robust_rounds",
    "round_to_distill",
    "within_budget",
]

#: How many standard errors of the difference two rounds' accuracies must differ by for one to count as the more
#: accurate (95 %, two-sided). Within one standard error (the earlier rule) a round was "more accurate" on noise:
#: ViT-tiny distilled kept 47.7 % fewer parameters (+0.06 points in the run) over 57.8 % (-0.36), which lost the
#: same on 5,000 unseen images (-0.48 and -0.50); of 32 saved runs it changes only that one's kept round.
TIE_Z = NormalDist().inv_cdf(0.975)

#: With ``--objective latency``, the largest drop before distillation, in accuracy budgets, of a round distillation
#: after the search takes once the target grown from the rounds that came back reaches none (:func:`round_to_distill`).
#: At batch 1 speed comes from whole blocks, whose rounds lose several points training-free and come back whole, where
#: a target grown from a one-block round that came back never reaches them. CIFAR ResNet-20 with a 1-point budget:
#: one block lost 0.36 and came back at +0.32, so the target grew to 0.57 and the two-block round (3.34 points lost,
#: 1.21x in the original's build) was never distilled; distilled as the run would, it came back at +0.25
#: [-0.64, +1.14]. Collapsed rounds (tens of points) are not taken: a distillation costs minutes.
LATENCY_RESCUE_BUDGETS = 5.0
#: The same limit for a round whose plan removes whole blocks (a unit kind that ``sheds_layers``): distillation gives
#: back far more of what depth loses than of what width loses. Measured (``benchmarks/block_removal.py``, unseen
#: images, 1-point budget): block sets that lost 9.5-18.7 points training-free came back within a point distilled
#: (ResNet-20's one and two blocks, ResNet-56's nine, 1.49x OpenVINO int8 of the original). With a depth round's
#: longer distillation (``tools.compression.distill_budget.DEPTH_STEPS_FACTOR``), ResNet-20's three came back at -0.40 /
#: -0.68 unseen from the unrecovered blocks (``block_removal.py``); in a run (21 points lost, recovered), where 20
#: budgets had kept it from being distilled, at -0.27 cross-fitted and -1.54 unseen, refused as the best of 10 by
#: the multiplicity check; its four (31 points) at -3.12. A round that lost more is beyond any distillation here.
BLOCK_RESCUE_BUDGETS = 25.0


def rescue_limit_points(plan: OptimizationPlan | None, budget: float) -> float:
    """The most a round of ``plan`` may lose before distillation for the latency objective's rescue to take it:
    :data:`BLOCK_RESCUE_BUDGETS` budgets where the plan removes whole blocks, else :data:`LATENCY_RESCUE_BUDGETS`."""
    return (BLOCK_RESCUE_BUDGETS if sheds_layers(plan) else LATENCY_RESCUE_BUDGETS) * budget


def blocks_removed(r: RoundResult) -> set[str]:
    """The blocks round ``r`` removed whole, as pruning applied them (a distilled round: its source's); one
    recommendation may remove several (the rules planner writes a depth round's blocks as one pattern)."""
    applied = (r.prune_report or {}).get("applied") or []
    return {str(m) for a in applied if kind_of(str(a.get("pruning_type"))).sheds_layers for m in a.get("modules") or []}


def layers_removed(r: RoundResult) -> int:
    """How many blocks round ``r`` removed whole (:func:`blocks_removed`)."""
    return len(blocks_removed(r))


def ladder_starts(rounds: Sequence[RoundResult], source: RoundResult) -> list[RoundResult]:
    """The distilled rounds whose students ``source``'s may start from, the likeliest first: each removed some of
    the blocks ``source`` removes and no other (``tools.stages.cross_fit.extends_by_blocks`` checks the rest of the
    structure), the most blocks first, then the most accurate. Its students start nearer than the original's
    round does: CIFAR ResNet-56's eight blocks, 17 points lost training-free and 0.86 unseen after distillation from
    there, gained 0.54 unseen distilled from the five-block round's students (``tools.stages.cross_fit``)."""
    wanted = blocks_removed(source)
    distilled = [r for r in rounds if r.cross_fit is not None and r.cross_fit.students]
    removed = {r.round: blocks_removed(r) for r in distilled}
    starts = [r for r in distilled if removed[r.round] and removed[r.round] < wanted]  # a proper, non-empty subset
    return sorted(starts, key=lambda r: (-len(removed[r.round]), -(r.metrics.accuracy or 0.0), r.round))


class _Removing(Protocol):
    """What the depth ladder reads of a round (the planners' ``RoundRecord``)."""

    planner_state: dict[str, Any]
    within_budget: bool
    layers_removed: int


#: The depth ladder's growth: each step removes this many times the blocks of the largest round within budget
#: (rounded up, at least one more). Twice, before: CIFAR ResNet-20's two blocks came back within budget and the next
#: step, four, lost 31 points and was beyond distillation (-3.12 unseen after 3,000 steps), where three run 1.35x
#: OpenVINO int8 of the original and came back at -0.40 / -0.68 unseen in ``benchmarks/block_removal.py`` (in a run,
#: at -1.54 unseen, refused by the multiplicity check: the ladder tries the step, the budget test decides).
LADDER_GROWTH = 1.5


def ladder_step_wanted(rounds: Sequence[_Removing]) -> int | None:
    """The blocks the depth ladder's next step removes (``agents.planning.depth``): :data:`LADDER_GROWTH` times the
    most a round within budget removes (training-free or distilled); 0 once a depth round that many was planned
    (each step once); None before a round within budget removed any (the ladder's first step is the profile's)."""
    held = max((r.layers_removed for r in rounds if r.within_budget), default=0)
    if not held:
        return None
    step = max(held + 1, math.ceil(LADDER_GROWTH * held))
    return 0 if any(int(r.planner_state.get(DEPTH_KEY) or 0) >= step for r in rounds) else step


def accuracy_drop_points(baseline: float | None, accuracy: float | None) -> float | None:
    """Points lost against the baseline (negative: a gain); None when either accuracy is unknown."""
    if baseline is None or accuracy is None:
        return None
    return round(100.0 * (baseline - accuracy), 4)


def cost_of(r: RoundResult, objective: str = "params") -> float:
    """What ranks a round after accuracy: its parameters, or with the latency objective its batch-1 latency in the
    runtime the original deploys to, as a share of the original's timed with it (``1 / deploy_speedup``: the rounds
    are timed minutes apart, and another job on the machine moved CIFAR ResNet-20's absolute times in OpenVINO 2x
    from one round to the next while their ratios to the original held); infinite for a round whose build failed
    there, and its PyTorch latency in a run where no round was timed in that runtime (no original deployment)."""
    m = r.metrics
    if objective == "latency":
        if m.deploy_speedup:
            return 1.0 / float(m.deploy_speedup)
        return math.inf if m.deploy_backend else float(m.latency_s)
    return float(m.params)


def best_round(rounds: Sequence[RoundResult], selection: Selection, objective: str = "params") -> RoundResult | None:
    """The best round within budget: by accuracy, then params, then latency (or fewest params first).

    Accuracy differences the evaluation cannot resolve are ties: a round whose accuracy is within
    :data:`TIE_Z` standard errors of the difference from the most accurate round's (the difference's 95 %
    interval; that standard error taken as ``sqrt(se_best^2 + se_round^2)`` from the two rounds' paired
    differences with the original) counts as equally accurate, and the fewest parameters, then the lowest
    latency, decide among them. Every candidate passed the budget test, so its own standard error is at most the
    accuracy budget. With the latency objective, latency in the runtime the original deploys to comes before
    parameters, and latencies within :data:`~tools.deploy.choice.TIE_MARGIN` of the fastest are ties too
    (cifar10-vit-tiny kept a round timed 0.4 % faster than one with 25 % fewer parameters).
    Without paired results, accuracies must be equal to tie.
    """
    candidates = [r for r in rounds if r.within_budget]
    if not candidates:
        return None

    def accuracy(r: RoundResult) -> float:
        value = r.metrics.accuracy
        return -1.0 if value is None else float(value)

    def key(r: RoundResult) -> tuple[float, ...]:
        m = r.metrics
        if selection == "smallest-within-budget":
            return (cost_of(r, objective), -accuracy(r), m.latency_s, r.round)
        return (-accuracy(r), cost_of(r, objective), m.params, m.latency_s, r.round)

    best = min(candidates, key=key)
    if selection == "smallest-within-budget" or best.metrics.accuracy is None:
        return best

    def se(r: RoundResult) -> float:
        paired = r.metrics.paired
        return standard_error_points(paired) / 100 if paired else 0.0

    tied = [r for r in candidates if accuracy(r) >= accuracy(best) - TIE_Z * math.hypot(se(best), se(r)) - 1e-12]
    if objective == "latency":  # latencies within the deployment's tie margin are ties too: fewer parameters decide
        fastest = min(cost_of(r, objective) for r in tied)
        if math.isfinite(fastest):
            tied = [r for r in tied if cost_of(r, objective) <= fastest * (1.0 + TIE_MARGIN) + 1e-12]
        return min(tied, key=lambda r: (r.metrics.params, cost_of(r, objective), r.metrics.latency_s, r.round))
    return min(tied, key=lambda r: (cost_of(r, objective), r.metrics.params, r.metrics.latency_s, r.round))


def kept_round(
    rounds: Sequence[RoundResult], selection: Selection, budget: float, objective: str = "params"
) -> RoundResult | None:
    """The round the run keeps: the best of those within budget on the choose images, each judged alone (drop plus
    one standard error, ``tools.stats.CHOOSE_Z``). No margin for the number of rounds tried: keeping the most pruned of
    several that passed favours the ones the choose images happened to be kind to, but what ships is judged again on
    the confirm images, which nothing chose on (``agents.confirmation``), and its figure there is the one reported.
    The margin only sets how often a choice then fails its confirmation; the run's best-of-T test threw away most of
    what the search found (timm's Swin kept 49 % and shipped 16 %, though a round of 40 % lost 0.56 on unseen
    images)."""
    return best_round([r for r in rounds if r.within_budget], selection, objective)


def robust_rounds(rounds: Sequence[RoundResult], budget: float) -> list[RoundResult]:
    """The rounds within budget by the margin of the best of all the rounds judged (Bonferroni over them): what
    distillation after the search counts as safely kept. A round within the budget alone but not by this margin is
    the likeliest to fail its confirmation (its drop on the choose images was the luckiest of many), so distilling a
    smaller round is still worth it; the run keeps whichever is best within budget (:func:`kept_round`)."""
    z = selection_z(sum(1 for r in rounds if r.metrics.paired))
    return [r for r in rounds if r.within_budget and (not r.metrics.paired or _bound(r, z) <= budget + 1e-9)]


def _robust_kept(
    rounds: Sequence[RoundResult], robust: Sequence[RoundResult], selection: Selection, objective: str
) -> RoundResult | None:
    """The round distillation measures its gains against: the best of ``robust``; with none, the round within budget
    alone with the smallest drop plus one standard error."""
    within = [r for r in rounds if r.within_budget]
    if robust or not within:
        return best_round(robust, selection, objective)
    return min(within, key=lambda r: (_bound(r, 1.0), r.round))


def _bound(r: RoundResult, k: float) -> float:
    """The round's drop plus ``k`` standard errors of its paired difference (the drop alone without one)."""
    paired = r.metrics.paired
    drop = float(r.accuracy_drop_points or 0.0)
    if not paired:
        return drop
    return -paired.delta_points + k * standard_error_points(paired)


def distillation_target(rounds: Sequence[RoundResult], budget: float) -> float | None:
    """The largest drop before distillation that the next distillation after the search can be expected to bring
    back within the budget, from what the run's distillations recovered
    (:func:`agents.planning.recovery.recoverable_drop`, judged as the choose images judge every round: drop plus one
    standard error); None before a distilled round came back within budget, or when the target leaves no room
    beyond it."""
    return recoverable_drop(recoveries_of(rounds), budget, CHOOSE_Z)


def planned_since_recovery(rounds: Sequence[RoundResult]) -> list[RoundResult] | None:
    """The rounds the search planned after the last distilled round that came back within budget (oldest first);
    None before one came back."""
    back = [r.round for r in rounds if r.cross_fit is not None and r.within_budget]
    if not back:
        return None
    return [r for r in rounds if r.cross_fit is None and r.round > max(back)]


def round_to_distill(
    rounds: Sequence[RoundResult],
    selection: Selection,
    budget: float,
    rescues: int,
    original_params: int,
    *,
    search_goes_on: bool = True,
    objective: str = "params",
    targets_done: bool = False,
) -> RoundResult | None:
    """The round that distillation after the search tries next; None when ``rescues`` rounds were distilled already
    or none is left worth it. Worth it: a round the search evaluated (not one distilled), not tried before, with
    fewer parameters than the round distillation counts as kept (the original when none is): one over the budget, or
    one within it alone but not by the margin of the best of all rounds (:func:`robust_rounds`), which may fail its
    confirmation.

    Until a distilled round came back within budget, the one nearest the budget first (smallest drop + one
    standard error), as the likeliest to come back. After, what came back sets a target (:func:`distillation_target`):
    the search first plans a round at it (None until it has, unless ``search_goes_on`` is False: ``--no-iterate``
    plans none; None again while a round planned at it fell short by more than the slack and tries are left, so that
    the search plans past it: ``recovery.undershot``), then the most pruned round whose drop before distillation is
    within :data:`~agents.planning.recovery.TARGET_SLACK` of the target is taken. A round planned at the target
    (``recovery.AT_TARGET``) is taken even when it passed the budget alone and is kept: it was planned to be
    distilled, and its distilled version's cross-fitted estimate is the one to keep it by (CIFAR ResNet-56's passed
    alone at -0.20 points in the run and lost 1.60 on unseen images).

    With the latency objective a round is worth it only when faster than the kept one by more than the deployment's
    tie margin (``TIE_MARGIN``: CIFAR ResNet-20's channel round at 1.005x the original was distilled over a block
    round at 1.15x, and could not ship), and until a distilled round came back the fastest that lost at most
    :func:`rescue_limit_points` is taken, not the nearest the budget; after, once the search plans no more rounds at
    the target (``targets_done``) and none of them fits it, likewise."""
    distilled = [r.cross_fit.source_round for r in rounds if r.cross_fit is not None]
    if len(distilled) >= rescues:
        return None
    candidates = _distill_candidates(rounds, selection, budget, original_params, objective, distilled)
    rescuable = _rescuable(rounds, candidates, budget)
    planned = planned_since_recovery(rounds)
    if planned is None:
        if objective == "latency":
            return _fastest(rescuable, objective)
        return min(candidates, key=lambda r: (_budget_drop(r), r.round), default=None)
    since = {r.round for r in planned}
    ladder = [r for r in rescuable if DEPTH_KEY in r.planner_state and r.round in since]
    if objective == "latency" and ladder:  # the depth ladder's step after a depth round came back: its own target
        return _fastest(ladder, objective)
    target = distillation_target(rounds, budget)
    if target is None or (search_goes_on and not planned):
        return None
    tries_left = search_goes_on and not targets_done and bool(planned)
    if tries_left and undershot(planned[-1], target):
        return None  # the search plans again past it before a distillation is spent on a smaller round
    fits = [r for r in candidates if float(r.accuracy_drop_points or 0.0) <= TARGET_SLACK * target]
    if not fits and targets_done and objective == "latency":
        fits = rescuable
    return _fastest(fits, objective)


def _budget_drop(r: RoundResult) -> float:
    """The round's drop plus one standard error (infinite where unknown): how near the budget it stands."""
    value = budget_drop_points(r.accuracy_drop_points, r.metrics.paired)
    return math.inf if value is None else value


def _fastest(pool: Sequence[RoundResult], objective: str) -> RoundResult | None:
    """The round of ``pool`` that costs least (:func:`cost_of`), the earliest among equals; None for none."""
    return min(pool, key=lambda r: (cost_of(r, objective), r.round), default=None)


def _distill_candidates(
    rounds: Sequence[RoundResult],
    selection: Selection,
    budget: float,
    original_params: int,
    objective: str,
    distilled: Sequence[int],
) -> list[RoundResult]:
    """The rounds worth distilling (:func:`round_to_distill`): evaluated by the search, not ``distilled`` yet, with a
    known drop, and cheaper than the round distillation counts as kept (the original when none is), or planned at the
    distillation target and no dearer than it."""
    confirmed = robust_rounds(rounds, budget)
    kept = _robust_kept(rounds, confirmed, selection, objective)
    confirmed_rounds = {r.round for r in confirmed}
    ceiling: float
    if objective == "latency":  # a round faster than the kept one (the original when none is) is worth distilling
        ceiling = cost_of(kept, objective) if kept is not None else math.inf
    else:
        ceiling = kept.metrics.params if kept is not None else original_params

    def worth_it(r: RoundResult) -> bool:
        if objective == "latency":  # faster than the kept one by more than timing noise (the deployment's tie rule)
            cost, bar = cost_of(r, objective), ceiling / (1.0 + TIE_MARGIN)
        else:
            cost, bar = r.metrics.params, ceiling
        if AT_TARGET in r.planner_state:  # planned to be distilled: even the kept one itself
            return bool(cost <= ceiling)
        return r.round not in confirmed_rounds and cost < bar

    return [
        r
        for r in rounds
        if r.cross_fit is None
        and r.round not in distilled
        and r.metrics.artifact
        and math.isfinite(_budget_drop(r))
        and worth_it(r)
    ]


def _rescuable(rounds: Sequence[RoundResult], candidates: Sequence[RoundResult], budget: float) -> list[RoundResult]:
    """Of ``candidates``, what distillation may bring back for the latency objective: rounds within their kind's rescue
    limit (:func:`rescue_limit_points`), or whose students start from a distilled round within budget (the ladder's
    step: what it lost from the original's training-free does not say what its students start from)."""

    def rescuable_round(r: RoundResult) -> bool:
        held = any(s.within_budget for s in ladder_starts(rounds, r))
        return held or float(r.accuracy_drop_points or 0.0) <= rescue_limit_points(r.plan, budget)

    return [r for r in candidates if rescuable_round(r)]
