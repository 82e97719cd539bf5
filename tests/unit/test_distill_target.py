"""Distillation after the search, after a distilled round came back within budget: the recovery it measured sets
the next target (``agents/planning/recovery.py``), the rules planner plans a round at it, distillation takes the
most pruned round under it, and the number of distillations follows the time the pairs took."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from langgraph.runtime import Runtime

from agents.context import Context
from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.recovery import (
    AT_TARGET,
    COMPLETE_RECOVERY_STEP,
    NOISE_DROP,
    RECOVERY_CAP,
    TARGET_SLACK,
    WHOLE_RECOVERY_STEP,
    Recovery,
    damage_for_drop,
    recoverable_drop,
    recoveries_of,
)
from agents.planning.rules import RulesPlanner
from agents.planning.selection import distillation_target, round_to_distill
from graph.routing import route_after_evaluate_model
from tests.helpers import typed_state
from tools.compression.distill_budget import (
    AUTO_DISTILL_STEPS,
    AUTO_RESCUE_SECONDS,
    DEPTH_STEPS_FACTOR,
    MIN_RESCUES,
    auto_rescue_config,
    auto_rescue_plan,
    auto_rescues,
    depth_rescue_steps,
    rescue_steps,
    training_seconds,
)
from tools.compression.distill_budget import DistilledPair as Pair
from tools.schemas import CrossFitStudent, ModelProfile, OptimizationPlan, RoundResult
from tools.stats import selection_z

HALF_WIDTH = 0.6  # a 95 % interval of +/- 0.6 points: a standard error of 0.306


def _round(i: int, drop: float, params: int, ok: bool, damage: float, source: int | None = None) -> RoundResult:
    paired = {
        "delta_points": -drop,
        "ci95_low_points": -drop - HALF_WIDTH,
        "ci95_high_points": -drop + HALF_WIDTH,
        "agreement": 0.95,
        "samples": 4000,
        "gained": 10,
        "lost": 10,
    }
    record: dict[str, Any] = {
        "round": i,
        "plan": {},
        "source": "rules",
        "planner_state": {"damage_budget": damage, "predicted_damage": damage},
        "metrics": {
            "accuracy": 0.8 - drop / 100,
            "params": params,
            "latency_s": 0.001,
            "memory_mb": 1.0,
            "paired": paired,
            "artifact": f"rounds/round-{i:02d}/model",
        },
        "accuracy_drop_points": drop,
        "within_budget": ok,
    }
    if source is not None:
        record["cross_fit"] = {"source_round": source, "judged_on_half": 0, "images_per_student": 100, "students": []}
    return RoundResult.model_validate(record)


def _search() -> list[RoundResult]:
    """A CIFAR ResNet-32's search as measured: 5 %, 10 % (0.55, alone within), 13 % (1.31, over), 12 % (0.70)."""
    return [
        _round(0, 0.21, 950, True, 0.0165),
        _round(1, 0.55, 900, True, 0.0374),
        _round(2, 1.31, 868, False, 0.0491),
        _round(3, 0.70, 878, False, 0.0432),
    ]


def test_recovery_share_is_capped_and_the_target_follows_the_kept_rounds_check() -> None:
    assert Recovery(0.55, -0.19, 0.3, True).share == RECOVERY_CAP  # all of it came back: counted as the cap
    assert Recovery(0.72, 0.25, 0.3, True).share == pytest.approx(0.47 / 0.72)
    back = Recovery(0.55, -0.19, 0.3, True)
    z = selection_z(7)
    target = recoverable_drop([back], 1.0, z)
    assert target == pytest.approx((1.0 - z * 0.3) / (1 - RECOVERY_CAP))
    assert (1 - RECOVERY_CAP) * target + z * 0.3 == pytest.approx(1.0)  # recovered, it just passes
    assert recoverable_drop([], 1.0, z) is None
    assert recoverable_drop([Recovery(4.4, 0.9, 0.3, False)], 1.0, z) is None  # nothing came back yet
    # a distillation that failed still measures the share: the smallest share sets the target
    assert recoverable_drop([back, Recovery(4.4, 2.2, 0.3, False)], 1.0, z) < target
    # Swin-tiny: 0.51 -> 0.42 leaves no room for a larger round
    assert recoverable_drop([Recovery(0.51, 0.42, 0.27, True)], 1.0, z) is None


def test_rounds_that_gave_back_the_cap_grow_the_target_one_step_where_the_capped_share_leaves_no_room() -> None:
    z = selection_z(9)
    # CIFAR ResNet-32: 0.55 -> -0.19 and 1.31 -> -0.04, standard errors 0.29 and 0.32: the capped share gives
    # (1 - z * 0.32) / 0.25 = 1.1, under 1.1 x 1.31; both came back whole, so one larger step beyond 1.31
    whole = [Recovery(0.55, -0.19, 0.29, True), Recovery(1.31, -0.04, 0.32, True)]
    assert (1.0 - z * 0.32) / (1 - RECOVERY_CAP) < 1.1 * 1.31
    assert recoverable_drop(whole, 1.0, z) == pytest.approx(WHOLE_RECOVERY_STEP * 1.31)
    assert WHOLE_RECOVERY_STEP > COMPLETE_RECOVERY_STEP
    # ResNet-32's third: 1.56 -> 0.19 gave back 88 %, more than the cap but not all: one smaller step beyond it
    most = [*whole, Recovery(1.56, 0.19, 0.33, True)]
    assert recoverable_drop(most, 1.0, z) == pytest.approx(COMPLETE_RECOVERY_STEP * 1.56)
    # one that gave back less than the cap, beyond its standard error, ends the growth, within budget or not, as does
    # one over the budget
    assert recoverable_drop([*whole, Recovery(1.64, 0.70, 0.20, True)], 1.0, z) is None
    assert recoverable_drop([*whole, Recovery(1.64, 0.90, 0.32, False)], 1.0, z) is None
    assert recoverable_drop([*whole, Recovery(1.64, 0.30, 0.40, False)], 1.0, z) is None
    # a share measured on a small drop is noisy: within one standard error of the cap, it grows one step (CIFAR
    # ResNet-20 on an AMD EPYC: 0.91 -> 0.30, standard error 0.27, gave back 67 %; the run stopped at 5.8 %)
    small = Recovery(0.91, 0.30, 0.27, True)
    assert small.given_back < RECOVERY_CAP and small.gave_back(RECOVERY_CAP)
    assert recoverable_drop([small], 0.89, selection_z(10)) == pytest.approx(COMPLETE_RECOVERY_STEP * 0.91)
    assert not Recovery(0.91, 0.60, 0.27, True).gave_back(RECOVERY_CAP)
    assert recoverable_drop([Recovery(0.91, 0.60, 0.27, True)], 0.89, selection_z(10)) is None
    # where the capped share leaves room, it still sets the target
    assert recoverable_drop(whole[:1], 1.0, z) == pytest.approx((1.0 - z * 0.29) / (1 - RECOVERY_CAP))


def test_damage_for_drop_interpolates_to_a_round_beyond_else_extrapolates_along_the_fit() -> None:
    # CIFAR ResNet-56: 0.49 at 0.0559, 8.39 at 0.078: a target of 1.0 lies between them, well short of 0.078
    points = [(0.018, 0.13), (0.039, 0.20), (0.078, 8.39), (0.0559, 0.49)]
    damage = damage_for_drop(points, (0.0559, 0.49), 1.0)
    assert damage is not None and 0.0559 < damage < 0.065
    assert math.log(1.0 / 0.49) / math.log(damage / 0.0559) == pytest.approx(
        math.log(8.39 / 0.49) / math.log(0.078 / 0.0559)
    )
    # nothing beyond the target: along the least-squares slope from the anchor; a flat fit counts as slope 1
    steep = damage_for_drop([(0.01, 0.1), (0.02, 0.4), (0.04, 1.6)], (0.04, 1.6), 3.2)
    assert steep == pytest.approx(0.04 * 2**0.5)
    flat = damage_for_drop([(0.01, 0.5), (0.02, 0.5), (0.04, 0.5)], (0.04, 0.5), 1.0)
    assert flat == pytest.approx(0.08)
    assert damage_for_drop([(0.01, 0.5)], (0.01, 0.5), 1.0) is None  # one round: no slope
    # an anchor that lost nothing counts as losing the noise floor: ResNet-56's round 5 (0.0508, 0.00) and the round
    # that lost 0.49 at 0.0555 put a target of 0.16 just past the anchor, not at twice its damage (lost 13 points)
    zero = [(0.0439, 0.15), (0.0555, 0.49), (0.049, 0.10), (0.0508, 0.0)]
    at_zero = damage_for_drop(zero, (0.0508, 0.0), 0.16)
    assert at_zero is not None and 0.0508 < at_zero < 0.0555
    assert at_zero == pytest.approx(
        0.0508 * (0.16 / NOISE_DROP) ** (math.log(0.0555 / 0.0508) / math.log(0.49 / NOISE_DROP))
    )


def test_after_a_round_came_back_distillation_waits_for_a_round_planned_at_the_target() -> None:
    rounds = _search()
    first = round_to_distill(rounds, "accuracy", 1.0, 3, 1000)
    assert first is not None and first.round == 1  # before: the round nearest the budget
    rounds.append(_round(4, -0.19, 900, True, 0.0374, source=1))
    target = distillation_target(rounds, 1.0)
    assert target is not None and target > 1.31
    assert recoveries_of(rounds) == [Recovery(0.55, -0.19, pytest.approx(HALF_WIDTH / 1.96), True)]
    # nothing planned since: the search plans a round at the target first (round 2, 3 would do, but are smaller)
    assert round_to_distill(rounds, "accuracy", 1.0, 3, 1000) is None
    # with --no-iterate no round will be planned: the most pruned round under the target now
    now = round_to_distill(rounds, "accuracy", 1.0, 3, 1000, search_goes_on=False)
    assert now is not None and now.round == 2
    # a planned round within the target's slack: the most pruned of the rounds under it is taken
    rounds.append(_round(5, target, 830, False, 0.07))  # one more round: the target shrinks a little
    chosen = round_to_distill(rounds, "accuracy", 1.0, 3, 1000)
    assert chosen is not None and chosen.round == 5
    # planned beyond the slack: the most pruned earlier round under the target instead
    rounds[-1] = _round(5, TARGET_SLACK * target + 0.5, 830, False, 0.07)
    chosen = round_to_distill(rounds, "accuracy", 1.0, 3, 1000)
    assert chosen is not None and chosen.round == 2
    assert round_to_distill(rounds, "accuracy", 1.0, 1, 1000) is None  # the one distillation was made


def _resnet56_came_back() -> list[RoundResult]:
    """CIFAR ResNet-56's search: its 18.4 % round (round 3, 0.49 points) came back distilled (round 4, -0.28)."""
    return [
        _round(0, 0.13, 950, True, 0.01),
        _round(1, 0.20, 900, True, 0.02),
        _round(2, 8.39, 700, False, 0.08),
        _round(3, 0.49, 860, True, 0.03),
        _round(4, -0.28, 860, True, 0.03, source=3),
    ]


def test_a_round_planned_at_the_target_is_distilled_even_when_it_passed_alone_and_is_kept() -> None:
    # CIFAR ResNet-56: its 18.4 % round came back (0.49 -> -0.28); the round planned at the target (20.6 %) passed
    # alone at -0.20 in the run and was kept, and lost 1.60 on unseen images: it is distilled, like any round there
    rounds = _resnet56_came_back()
    planned = _round(5, 0.20, 800, True, 0.04)
    assert round_to_distill([*rounds, planned], "accuracy", 1.0, 3, 1000) is None  # kept, and not planned for it
    planned.planner_state[AT_TARGET] = 1.2
    # it fell short of the target: taken once the search plans no more rounds at it (the tries are spent)
    chosen = round_to_distill([*rounds, planned], "accuracy", 1.0, 3, 1000, targets_done=True)
    assert chosen is not None and chosen.round == 5
    distilled = _round(6, -0.30, 800, True, 0.04, source=5)
    assert round_to_distill([*rounds, planned, distilled], "accuracy", 1.0, 3, 1000, targets_done=True) is None  # once


def test_the_rules_planner_plans_the_round_after_a_recovery_at_the_target_damage() -> None:
    rounds = [*_search(), _round(4, -0.19, 900, True, 0.0374, source=1)]
    target = distillation_target(rounds, 1.0)
    history = [RoundRecord.of(RoundResult.model_validate(r)) for r in rounds]
    ctx = PlanningContext(
        profile=ModelProfile.model_construct(),
        prunable={},
        baseline_accuracy=0.8,
        max_accuracy_drop=1.0,
        history=history,
        distillation_target_points=target,
    )
    budgets = RulesPlanner._distillation_budgets(ctx)
    assert [b / budgets[0][0] for b, _ in budgets] == pytest.approx([1.0, 0.9, 0.8])
    assert 0.0491 < budgets[0][0] <= 2 * 0.0374  # past the largest round tried, at most twice the one that came back
    assert "before distillation" in budgets[0][1]
    untargeted = dataclasses.replace(ctx, distillation_target_points=None)
    assert RulesPlanner._distillation_budgets(untargeted) == []


def test_distillations_follow_the_time_the_pairs_took() -> None:
    macs = 127_881_866  # CIFAR ResNet-56: one pair of 300 steps planned at the assumed rate
    assert auto_rescue_plan(macs)[0] == 1
    assert auto_rescues(macs) == auto_rescues(macs, []) == 1
    seconds, most = AUTO_RESCUE_SECONDS
    assert auto_rescues(macs, [Pair(256.0)]) == 2  # measured on one Xeon core: two fit in 600 s
    assert auto_rescues(macs, [Pair(110.0)]) == most  # CIFAR ResNet-32's pairs in bf16: ten would fit, at most the cap
    assert auto_rescues(macs, [Pair(seconds / 2 + 1)]) == 1  # a slower CPU: no more than planned
    assert auto_rescues(macs, [Pair(500.0), Pair(500.0)]) == 2  # 1,000 s spent, the next would not fit
    assert auto_rescues(253_000_000, [Pair(10.0)]) == 0  # off where the plan is off
    assert auto_rescues(macs, [Pair(0.0)]) == 1  # a pair whose time was not recorded measures nothing
    # a depth round's pair of three times the steps counts at the plan's steps: its extra time is outside the budget
    depth = Pair(600.0, 3 * 300, sheds_layers=True)
    assert auto_rescues(macs, [depth]) == min(most, 1 + int((seconds - 200.0) / 200.0)) == 3
    assert auto_rescues(macs, [Pair(256.0, 300), Pair(768.0, 900, True)]) == 2 + int((seconds - 512.0) / 256.0) == 2
    assert auto_rescues(macs, [Pair(300.0, 300)]) == 2  # the same time at the plan's steps: one more fits
    assert auto_rescues(macs, [Pair(256.0), Pair(600.0, 300)]) == auto_rescues(macs, [Pair(256.0), Pair(600.0)])


def test_students_shrink_to_the_floor_where_pairs_of_the_plan_leave_room_for_too_few() -> None:
    macs = 20_000_000  # a small model: students of automatic distillation's 585 steps planned
    low, _ = AUTO_DISTILL_STEPS
    planned = auto_rescue_plan(macs)[1]
    assert planned == 585 and rescue_steps(macs) == planned
    # a pair of 585 steps that took 350 s: the budget's 250 s left fit no pair of 585, one of 300, so the later
    # students take 300 steps and the run makes two distillations instead of one
    slow = [Pair(350.0, planned)]
    assert rescue_steps(macs, slow) == low and auto_rescues(macs, slow) == 2
    config = auto_rescue_config(macs, pairs=slow)
    assert config is not None and config.steps == low
    depth = auto_rescue_config(macs, pairs=slow, sheds_layers=True)  # a removed block is learnt anew: never shrunk
    assert depth is not None and depth.steps == depth_rescue_steps(macs) == DEPTH_STEPS_FACTOR * AUTO_DISTILL_STEPS[1]
    # a CPU where pairs of the plan's steps leave room for MIN_RESCUES of them: the steps stay
    for first in (150.0, 290.0):
        fast = [Pair(first, planned)]
        assert rescue_steps(macs, fast) == planned
        assert auto_rescues(macs, fast) == 1 + int((600 - first) / first) >= MIN_RESCUES
    # ResNet-56's plan is already the floor: it never changes
    assert rescue_steps(127_881_866, [Pair(1100.0, low)]) == low


def test_a_pair_distilled_beside_other_jobs_counts_at_its_cpu_time() -> None:
    macs = 127_881_866  # CIFAR ResNet-56: one pair of 300 steps planned
    idle = {"seconds": 128.0, "cpu_seconds": 127.5}
    loaded = {"seconds": 192.0, "cpu_seconds": 128.0}  # three jobs on two cores: two thirds of a core each
    assert training_seconds(idle) == 127.5 and training_seconds(loaded) == 128.0
    pair_loaded, pair_idle = Pair(2 * training_seconds(loaded)), Pair(2 * training_seconds(idle))
    assert auto_rescues(macs, [pair_loaded]) == auto_rescues(macs, [pair_idle]) == 2
    assert auto_rescues(macs, [Pair(2 * 192.0)]) == 1  # counted at its wall time, the load would cost a distillation
    assert training_seconds({"seconds": 300.0}) == 300.0  # an older run's report, or another device: the wall time
    assert training_seconds({"seconds": 300.0, "cpu_seconds": None}) == 300.0
    assert training_seconds({"seconds": 300.0, "cpu_seconds": 450.0}) == 300.0  # never more than the wall time


def test_a_round_that_removes_layers_gets_more_steps() -> None:
    macs = 41_398_922  # CIFAR ResNet-20: a round of widths' students take 300 steps, a depth round's 3,000
    width, depth = auto_rescue_config(macs), auto_rescue_config(macs, sheds_layers=True)
    assert width is not None and depth is not None
    assert depth.steps == DEPTH_STEPS_FACTOR * AUTO_DISTILL_STEPS[1] and width.steps == auto_rescue_plan(macs)[1] == 300
    assert depth.model_copy(update={"steps": width.steps}) == width  # nothing else changes
    assert auto_rescue_config(253_000_000, sheds_layers=True) is None  # off where the plan is off


def test_the_students_keep_the_planned_steps_and_take_the_runs_precision() -> None:
    macs = 70_201_034  # CIFAR ResNet-32: 300-step students planned (a pair of 1,000 would not fit the plan)
    config = auto_rescue_config(macs, precision="bf16")
    assert config is not None and config.steps == auto_rescue_plan(macs)[1] == 300 and config.precision == "bf16"
    assert auto_rescue_config(253_000_000) is None  # off where the plan is off


def test_distillation_precision_follows_the_setting_and_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents import evaluation
    from tools.deploy import cpu

    assert evaluation.distill_precision(Context(distill_precision="fp32")) == "fp32"
    assert evaluation.distill_precision(Context(distill_precision="bf16")) == "bf16"
    for features, expected in ((["avx2"], "fp32"), (["avx2", "amx_bf16"], "fastest")):
        found = cpu.CpuFeatures(model_name="x", machine="x86_64", features=features)
        monkeypatch.setattr(cpu, "detect_cpu", lambda found=found: found)
        assert evaluation.distill_precision(Context()) == expected
    with pytest.raises(ValueError, match="--distill-precision"):
        Context(distill_precision="int8")


def test_a_round_that_overshot_the_target_gets_another_try_three_at_most() -> None:

    from agents.context import Context

    def at_target(record: RoundResult, target: float | None = 1.6) -> RoundResult:
        return record.model_copy(update={"planner_state": {**record.planner_state, AT_TARGET: target}})

    def state(overshot: int, last_at_target: bool = True) -> Any:
        rounds = [_round(0, 0.21, 950, True, 0.0165), _round(1, 0.55, 900, True, 0.0374)]
        rounds.append(_round(2, -0.19, 900, True, 0.0374, source=1))  # came back whole
        rounds += [at_target(_round(3 + i, 9.0 - i, 700 + i, False, 0.09 - 0.01 * i)) for i in range(overshot)]
        if not last_at_target:  # the planner found nothing new at the target and planned otherwise
            rounds[-1] = _round(rounds[-1].round, 8.0, 600, False, 0.2)
        return typed_state(
            {
                "dataset": "cifar10",
                "baseline": {"params": 1000, "accuracy": 0.8, "data_parts": {"calibration": 256, "evaluation": 4000}},
                "profile_summary": {"total_macs": 70_201_034},
                "rounds": rounds,
            }
        )

    assert distillation_target(state(1).rounds, 1.0) is not None
    runtime = Runtime(context=Context(iterations=1, distill_rescues=3))
    # past the T rounds, the planned round lost far more than the target's slack: nothing to distil, plan again
    assert route_after_evaluate_model(state(1), runtime) == "iterate_pruning"
    assert route_after_evaluate_model(state(2), runtime) == "iterate_pruning"
    assert route_after_evaluate_model(state(3), runtime) == "select_best_model"  # three tries
    assert route_after_evaluate_model(state(2, last_at_target=False), runtime) == "select_best_model"
    assert route_after_evaluate_model(state(1), Runtime(context=Context(iterations=1, iterate=False))) == (
        "select_best_model"
    )
    spent = Runtime(context=Context(iterations=1, distill_rescues=1))  # no distillation left for it
    assert route_after_evaluate_model(state(1), spent) == "select_best_model"


def test_the_round_at_the_target_is_planned_past_the_most_pruned_round_that_came_back() -> None:
    # CIFAR ResNet-56: its 18.4 % round (0.49 before) and its 20.6 % round (0.20 before) both came back; anchored on
    # the one that lost more, the rounds planned at the target were smaller than the kept 20.6 %
    rounds = [*_resnet56_came_back(), _round(5, 0.20, 800, True, 0.04), _round(6, -0.05, 800, True, 0.04, source=5)]
    ctx = PlanningContext(
        profile=ModelProfile.model_construct(),
        prunable={},
        baseline_accuracy=0.8,
        max_accuracy_drop=1.0,
        history=[RoundRecord.of(RoundResult.model_validate(r)) for r in rounds],
        distillation_target_points=0.61,
    )
    budgets = RulesPlanner._distillation_budgets(ctx)
    assert budgets and 0.04 < budgets[0][0] <= 2 * 0.04  # past round 5's damage, not round 3's


def test_with_the_latency_objective_the_fastest_round_within_five_budgets_is_distilled_after_the_target() -> None:
    """CIFAR ResNet-20 with --objective latency, as measured: one block (round 3, 0.36 points lost) came back at
    +0.32, the target grew to 0.57 and the three rounds planned at it lost 1.2-3.5; the two-block round (round 5,
    3.34 points, 1.21x in the original's build), which a cross-fitted distillation brings back to +0.25, is
    distilled next once no more rounds are planned at the target. A collapsed round, though faster, is not; nor
    anything with the parameter objective."""
    from agents.planning.selection import LATENCY_RESCUE_BUDGETS

    def fast(r: RoundResult, speedup: float) -> RoundResult:
        at_target = {**r.planner_state, AT_TARGET: 0.57} if r.round > 6 else r.planner_state
        metrics = r.metrics.model_copy(update={"deploy_speedup": speedup, "deploy_latency_s": 1e-3 / speedup})
        return r.model_copy(update={"metrics": metrics, "planner_state": at_target})

    rounds = [
        fast(_round(0, 0.44, 263, True, 0.01), 0.96),
        fast(_round(3, 0.36, 258, True, 0.02), 1.12),
        fast(_round(4, 0.55, 255, False, 0.03), 1.08),
        fast(_round(5, 3.34, 240, False, 0.06), 1.21),
        fast(_round(6, 0.30, 258, True, 0.02, source=3), 1.09),  # came back in part: a target near the one measured
        fast(_round(7, 1.16, 252, False, 0.03), 1.08),
        fast(_round(8, 3.51, 218, False, 0.05), 0.94),
        fast(_round(9, 3.13, 225, False, 0.05), 0.98),
        fast(_round(10, 30.0, 150, False, 0.3), 1.9),
    ]
    assert distillation_target(rounds, 1.0) is not None
    assert round_to_distill(rounds, "accuracy", 1.0, 3, 272, objective="latency") is None  # the search goes on
    chosen = round_to_distill(rounds, "accuracy", 1.0, 3, 272, objective="latency", targets_done=True)
    assert chosen is not None and chosen.round == 5
    assert 3.34 <= LATENCY_RESCUE_BUDGETS * 1.0 < 30.0
    params = round_to_distill(rounds, "accuracy", 1.0, 3, 272, targets_done=True)  # the parameter objective: as before
    assert params == round_to_distill(rounds, "accuracy", 1.0, 3, 272) and (params is None or params.round != 5)


def test_with_the_latency_objective_a_block_round_is_distilled_up_to_twenty_budgets_lost() -> None:
    """CIFAR ResNet-20 with --objective latency, as measured: two blocks removed lost 15-19 points training-free
    (1.21-1.23x in the original's build), where benchmarks/block_removal.py brings such sets back within a point
    by distillation; the rescue takes the fastest block round within 25 budgets, not a channel round that lost as
    much, nor a block round past 25 budgets (layer3.2 removed: 34 points)."""
    from agents.planning.selection import BLOCK_RESCUE_BUDGETS, rescue_limit_points

    def blocks(*names: str) -> dict[str, Any]:
        return {
            "pruning_recommendations": [
                {"layer": f"^{n}$", "pruning_type": "block", "pruning_ratio": 1.0, "justification": "b"} for n in names
            ]
        }

    def channels() -> dict[str, Any]:
        rec = {"layer": "^c$", "pruning_type": "structured", "pruning_ratio": 0.5, "justification": "c"}
        return {"pruning_recommendations": [rec]}

    def fast(r: RoundResult, speedup: float, plan: dict[str, Any], at_target: bool = False) -> RoundResult:
        state = {**r.planner_state, AT_TARGET: 0.78} if at_target else r.planner_state
        metrics = r.metrics.model_copy(update={"deploy_speedup": speedup, "deploy_latency_s": 1e-3 / speedup})
        return r.model_copy(
            update={"metrics": metrics, "planner_state": state, "plan": OptimizationPlan.model_validate(plan)}
        )

    rounds = [
        fast(_round(0, 3.99, 256, False, 0.12), 1.02, channels()),
        fast(_round(1, 0.48, 265, False, 0.17), 1.08, blocks("layer1.0")),
        fast(_round(2, 15.1, 260, False, 0.29), 1.21, blocks("layer1.0", "layer1.1")),
        fast(_round(3, 12.0, 200, False, 0.25), 1.40, channels()),
        fast(_round(4, 34.0, 196, False, 0.30), 1.24, blocks("layer3.2")),
        fast(_round(5, -0.57, 265, True, 0.17, source=1), 1.07, blocks("layer1.0")),
        fast(_round(6, 18.4, 260, False, 0.40), 1.23, blocks("layer1.0", "layer1.2"), at_target=True),
    ]
    assert rescue_limit_points(rounds[2].plan, 1.0) == BLOCK_RESCUE_BUDGETS > rescue_limit_points(rounds[3].plan, 1.0)
    chosen = round_to_distill(rounds, "accuracy", 1.0, 3, 270, objective="latency", targets_done=True)
    assert chosen is not None and chosen.round == 6  # the fastest block round within 25 budgets
    assert distillation_target(rounds, 1.0) is not None
    params = round_to_distill(rounds, "accuracy", 1.0, 3, 270, targets_done=True)  # the parameter objective: as before
    assert params is None or params.round not in {2, 6}


def test_with_the_latency_objective_the_first_distillation_takes_the_fastest_round_not_the_nearest_the_budget() -> None:
    """CIFAR ResNet-20 in ONNX Runtime int8 (no VNNI), as measured: the kept round 0 ran 1.001x the original, the
    depth round (one block, 0.48 points lost, passing alone but not as the best of 7) 1.15x, a channel round (0.65
    points) 1.005x; the nearest the budget first, the channel round was distilled, and could not ship. The fastest
    is taken; a round within the tie margin of the kept one is not worth a distillation."""

    def at(r: RoundResult, speedup: float) -> RoundResult:
        metrics = r.metrics.model_copy(update={"deploy_speedup": speedup, "deploy_latency_s": 1e-3 / speedup})
        return r.model_copy(update={"metrics": metrics})

    rounds = [
        at(_round(0, 0.44, 263, True, 0.02), 1.001),
        at(_round(1, 0.62, 265, True, 0.17), 1.15),
        at(_round(5, 0.65, 258, True, 0.05), 1.005),
    ]
    chosen = round_to_distill(rounds, "accuracy", 1.0, 3, 270, objective="latency")
    assert chosen is not None and chosen.round == 1
    assert round_to_distill([rounds[0], rounds[2]], "accuracy", 1.0, 3, 270, objective="latency") is None
    nearest = round_to_distill(rounds, "accuracy", 1.0, 3, 270)  # the parameter objective: the nearest the budget
    assert nearest is not None and nearest.round != 1


def test_with_the_latency_objective_the_depth_ladder_goes_on_after_a_depth_round_came_back() -> None:
    """CIFAR ResNet-56 with --objective latency, as measured: the depth round (three blocks in one pattern, 2.12
    points lost, 1.16x) came back distilled at -0.13, and the run ended there (the drop target left no room) at
    1.12x, where nine blocks come back within a point at 1.49x (benchmarks/block_removal.py). The ladder's next step,
    six blocks (the blocks pruning removed, not the patterns), is wanted while distillations are left, and once
    planned it is distilled though it lost more than the drop target allows; with the parameter objective, not."""
    from agents.planning.base import RoundRecord
    from agents.planning.recovery import DEPTH_KEY
    from agents.planning.selection import ladder_step_wanted, layers_removed

    def timed(r: RoundResult, speedup: float) -> RoundResult:
        metrics = r.metrics.model_copy(update={"deploy_speedup": speedup, "deploy_latency_s": 1e-3 / speedup})
        return r.model_copy(update={"metrics": metrics})

    def depth(r: RoundResult, speedup: float, n: int) -> RoundResult:
        names = [f"layer{1 + i % 3}.{i}" for i in range(n)]
        pattern = "^(?:" + "|".join(names) + ")$"
        rec = {"layer": pattern, "pruning_type": "block", "pruning_ratio": 1.0, "justification": "b"}
        applied = {"pattern": pattern, "pruning_type": "block", "ratio": 1.0, "modules": names, "before": n, "after": 0}
        return timed(r, speedup).model_copy(
            update={
                "planner_state": {**r.planner_state, DEPTH_KEY: n},
                "plan": OptimizationPlan.model_validate({"pruning_recommendations": [rec]}),
                "prune_report": {"applied": [applied]},
            }
        )

    def wanted(rounds: list[RoundResult]) -> int | None:
        return ladder_step_wanted([RoundRecord.of(r) for r in rounds])

    rounds = [
        timed(_round(0, 0.20, 850, True, 0.01), 1.01),
        depth(_round(1, 2.12, 820, False, 0.06), 1.16, 3),
        timed(_round(2, 0.40, 800, True, 0.02), 1.02),
    ]
    assert layers_removed(rounds[1]) == 3 and wanted(rounds) is None  # no round within budget removed a block
    rounds.append(depth(_round(3, -0.13, 820, True, 0.06, source=1), 1.12, 3))
    assert wanted(rounds) == 5  # half as many again, rounded up
    assert round_to_distill(rounds, "accuracy", 1.0, 4, 860, objective="latency") is None  # the step is not planned
    rounds.append(depth(_round(4, 8.5, 790, False, 0.15), 1.31, 5))
    assert wanted(rounds) == 0  # each step once
    chosen = round_to_distill(rounds, "accuracy", 1.0, 4, 860, objective="latency")
    assert chosen is not None and chosen.round == 4
    params = round_to_distill(rounds, "accuracy", 1.0, 4, 860)  # the parameter objective: the drop target decides
    assert params is None or params.round != 4
    rounds.append(depth(_round(5, 0.6, 790, True, 0.15, source=4), 1.28, 5))
    assert wanted(rounds) == 8
    collapsed = [*rounds, depth(_round(6, 45.0, 700, False, 0.6), 1.7, 8)]
    assert round_to_distill(collapsed, "accuracy", 1.0, 4, 860, objective="latency") is None  # past 25 budgets
    # unless its students start from a distilled round's within budget whose blocks it removes with more
    # (tools.stages.cross_fit): CIFAR ResNet-56's eight blocks from its five-block round's students, 54 points lost
    # before training, came back at +0.61
    students = [{"artifact": "s0", "judged_on_half": 1}, {"artifact": "s1", "judged_on_half": 0}]
    assert rounds[5].cross_fit is not None
    rounds[5].cross_fit.students = [CrossFitStudent.model_validate(s) for s in students]
    chosen = round_to_distill(collapsed, "accuracy", 1.0, 4, 860, objective="latency")
    assert chosen is not None and chosen.round == 6


def test_the_depth_ladder_goes_on_past_the_search_from_a_round_within_budget_training_free() -> None:
    """CIFAR ResNet-56 with --objective latency, as measured: the search's last round removed three blocks within
    budget training-free (0.54 points lost, 1.13x); no round was 3 % faster than the kept two blocks (1.10x), so
    none was worth distilling, and the run ended with its distillation unspent. Past the T rounds the ladder's next
    step (five blocks) is planned while distillations are left; past them, only while the last round was the
    ladder's; with the parameter objective, or without distillation, not."""
    from agents.planning.recovery import DEPTH_KEY

    def depth(i: int, drop: float, ok: bool, speedup: float, n: int) -> RoundResult:
        r = _round(i, drop, 850 - 10 * n, ok, 0.01 * n)
        names = [f"layer1.{k}" for k in range(n)]
        applied = {"pattern": "b", "pruning_type": "block", "ratio": 1.0, "modules": names, "before": n, "after": 0}
        metrics = r.metrics.model_copy(update={"deploy_speedup": speedup, "deploy_latency_s": 1e-3 / speedup})
        return r.model_copy(
            update={"planner_state": {DEPTH_KEY: n}, "prune_report": {"applied": [applied]}, "metrics": metrics}
        )

    def state(rounds: list[RoundResult]) -> Any:
        return typed_state(
            {
                "dataset": "cifar10",
                "baseline": {"params": 853, "accuracy": 0.8, "data_parts": {"calibration": 256, "evaluation": 3909}},
                "profile_summary": {"total_macs": 125_000_000},
                "rounds": rounds,
            }
        )

    searched = [depth(0, 0.20, True, 1.04, 1), depth(1, -0.05, True, 1.10, 2), depth(2, 0.54, True, 1.13, 3)]
    latency = Runtime(context=Context(iterations=2, distill_rescues=1, objective="latency"))
    assert route_after_evaluate_model(state(searched), latency) == "iterate_pruning"  # five blocks next
    planned = [*searched, depth(3, 0.30, True, 1.20, 5)]  # the ladder's step, within budget alone: eight next
    assert route_after_evaluate_model(state(planned), latency) == "iterate_pruning"
    other = [*searched, _round(3, 0.3, 840, True, 0.01)]  # the planner planned something else: the ladder ends
    assert route_after_evaluate_model(state(other), latency) == "select_best_model"
    params = Runtime(context=Context(iterations=2, distill_rescues=1))
    assert route_after_evaluate_model(state(searched), params) != "iterate_pruning"  # distils, or ends
    none = Runtime(context=Context(iterations=2, distill_rescues=0, objective="latency"))
    assert route_after_evaluate_model(state(searched), none) == "select_best_model"


def test_a_round_that_fell_short_of_the_target_is_planned_again_before_a_distillation_is_spent() -> None:
    """CIFAR ResNet-56's default run, as measured: round 9 (1.30 points before) came back at -0.31, the target grew
    to 2.09, and the round planned at it lost 1.33 (11.7 % fewer parameters, where round 10's 21 % lost 3.10); it
    was distilled, and the run ended at 13.8 %. A round short of the target over its slack is planned again, from a
    line through it; one within the slack, or the last try, is distilled."""

    def at_target(r: RoundResult, target: float = 2.09) -> RoundResult:
        return r.model_copy(update={"planner_state": {**r.planner_state, AT_TARGET: target}})

    rounds = [
        _round(0, 0.08, 832, True, 0.0186),
        _round(1, 3.61, 603, False, 0.0598),
        _round(9, 1.30, 744, False, 0.0372),
        _round(10, 3.60, 673, False, 0.0434),  # 3.10 measured; past the slack of the target one standard error sets
        _round(11, -0.31, 744, True, 0.0372, source=9),
    ]
    wide = rounds[-1].metrics.paired
    assert wide is not None  # its half of the images: [-0.67, +0.77] in the run
    wide = wide.model_copy(update={"ci95_low_points": 0.31 - 0.72, "ci95_high_points": 0.31 + 0.72})
    rounds[-1] = rounds[-1].model_copy(update={"metrics": rounds[-1].metrics.model_copy(update={"paired": wide})})
    target = distillation_target(rounds, 1.0)
    assert target is not None and target >= WHOLE_RECOVERY_STEP * 1.30  # it came back whole: a step past it at least
    short = at_target(_round(12, 1.33, 735, False, 0.0393), target)
    assert round_to_distill([*rounds, short], "accuracy", 1.0, 5, 853) is None  # planned again first
    last_try = round_to_distill([*rounds, short], "accuracy", 1.0, 5, 853, targets_done=True)
    assert last_try is not None and last_try.round == 12
    near = at_target(_round(12, target / TARGET_SLACK + 0.05, 735, False, 0.0393), target)
    chosen = round_to_distill([*rounds, near], "accuracy", 1.0, 5, 853)
    assert chosen is not None and chosen.round == 12
    # and the line the next round is planned on runs through the round that fell short, not the anchor alone
    points = [(0.0186, 0.08), (0.0598, 3.61), (0.0372, 1.30), (0.0434, 3.60), (0.0393, 1.33)]
    before = damage_for_drop(points[:4], (0.0372, 1.30), target)
    after = damage_for_drop(points, (0.0372, 1.30), target)
    assert before is not None and after is not None and 0.0393 < before < after < 0.0434
    assert math.log(target / 1.33) / math.log(after / 0.0393) == pytest.approx(
        math.log(3.60 / 1.33) / math.log(0.0434 / 0.0393)
    )
    # the graph: past the T rounds, the round that fell short sends the search on, not to distillation

    def state(last: RoundResult) -> Any:
        return typed_state(
            {
                "dataset": "cifar10",
                "baseline": {"params": 853, "accuracy": 0.8, "data_parts": {"calibration": 256, "evaluation": 3909}},
                "profile_summary": {"total_macs": 127_881_866},
                "rounds": [*rounds, last],
            }
        )

    runtime = Runtime(context=Context(iterations=1, distill_rescues=5))
    assert route_after_evaluate_model(state(short), runtime) == "iterate_pruning"
    assert route_after_evaluate_model(state(near), runtime) == "distill_over_budget_round"
    # the planner: past the round that fell short, and larger ones where that allocation was planned already
    ctx = PlanningContext(
        profile=ModelProfile.model_construct(),
        prunable={},
        baseline_accuracy=0.8,
        max_accuracy_drop=1.0,
        history=[RoundRecord.of(r) for r in [*rounds, short]],
        distillation_target_points=target,
    )
    budgets = RulesPlanner._distillation_budgets(ctx)
    assert budgets[0][0] == pytest.approx(after) and budgets[0][0] > 0.0393
    assert [b / budgets[0][0] for b, _ in budgets] == pytest.approx([1.0, 1.1, 1.2])
    ctx = dataclasses.replace(ctx, history=[RoundRecord.of(r) for r in [*rounds, near]])
    again = RulesPlanner._distillation_budgets(ctx)  # within the slack: smaller ones, as after one that overshot
    assert [b / again[0][0] for b, _ in again] == pytest.approx([1.0, 0.9, 0.8])
    # once the short round came back distilled, the next target's first round falls back the usual way
    back = _round(13, -0.05, 735, True, 0.0393, source=12)
    ctx = dataclasses.replace(ctx, history=[RoundRecord.of(r) for r in [*rounds, short, back]])
    later = RulesPlanner._distillation_budgets(ctx)
    assert [b / later[0][0] for b, _ in later] == pytest.approx([1.0, 0.9, 0.8])
