"""The rules planner: profile-guided targets, deterministic plans, adaptive levels."""

from __future__ import annotations

import re

from agents.planning.allocation import exact_pattern
from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.registry import get_planner
from agents.planning.rules import RulesPlanner
from tools.profiling.profile import name_pattern
from tools.schemas import LayerGroupProfile, LayerProfile, ModelProfile, OptimizationPlan


def _vit_profile() -> tuple[ModelProfile, dict]:
    layers, groups = [], []
    for i in range(2):
        for name, out, params, share in (
            ("attention.q_proj", 32, 32 * 32 + 32, 0.05),
            ("attention.o_proj", 32, 32 * 32 + 32, 0.05),
            ("mlp.fc1", 128, 32 * 128 + 128, 0.2),
            ("mlp.fc2", 32, 128 * 32 + 32, 0.15),
        ):
            layers.append(
                LayerProfile(
                    name=f"vit.layers.{i}.{name}",
                    type="Linear",
                    params=params,
                    latency_share=share,
                    output_shape=[1, 17, out],
                )
            )
    for name, share in (
        ("attention.q_proj", 0.1),
        ("attention.o_proj", 0.1),
        ("mlp.fc1", 0.4),
        ("mlp.fc2", 0.3),
    ):
        groups.append(
            LayerGroupProfile(
                pattern=name_pattern(f"vit.layers.0.{name}"),
                type="Linear",
                count=2,
                params=100,
                macs=100,
                latency_s=share,
                latency_share=share,
                macs_share=share,
                params_share=share,
            )
        )
    profile = ModelProfile(
        model_class="ViTForImageClassification",
        family="vit",
        device="cpu",
        input_shape=[3, 16, 16],
        total_params=1000,
        total_macs=1000,
        latency_s=0.01,
        layers=layers,
        groups=groups,
    )
    prunable = {
        "structured": [layer.name for layer in layers if layer.name.endswith("fc1")],
        "coupling": {layer.name: 1 for layer in layers if layer.name.endswith("fc1")},
        "heads": {"vit.layers.0.attention": 4, "vit.layers.1.attention": 4},
    }
    return profile, prunable


def _ctx(history: list[RoundRecord] | None = None) -> PlanningContext:
    profile, prunable = _vit_profile()
    return PlanningContext(
        profile=profile,
        prunable=prunable,
        baseline_accuracy=0.9,
        max_accuracy_drop=1.0,
        history=history or [],
    )


def test_name_pattern_selects_siblings_only() -> None:
    pattern = name_pattern("vit.layers.3.mlp.fc1")
    assert re.search(pattern, "vit.layers.11.mlp.fc1")
    assert not re.search(pattern, "vit.layers.11.mlp.fc2")
    assert not re.search(pattern, "xvit.layers.1.mlp.fc1")


def test_analysis_targets_heads_and_mlp_expansion_with_justifications() -> None:
    plan = RulesPlanner().analyze(_ctx()).plan
    kinds = {(r.pruning_type, r.layer) for r in plan.pruning_recommendations}
    assert ("head", name_pattern("vit.layers.0.attention")) in kinds
    assert ("structured", name_pattern("vit.layers.0.mlp.fc1")) in kinds
    assert not any("fc2" in r.layer or "o_proj" in r.layer for r in plan.pruning_recommendations)
    assert all(r.justification and 0 < r.pruning_ratio < 1 for r in plan.pruning_recommendations)
    assert plan.quantization_recommendations[0].layer == "all"


def test_plans_are_deterministic() -> None:
    assert RulesPlanner().analyze(_ctx()).plan == RulesPlanner().analyze(_ctx()).plan


def _record(i: int, level: float, ok: bool) -> RoundRecord:
    return RoundRecord(
        round=i,
        plan=OptimizationPlan(),
        source="rules",
        accuracy=0.9 if ok else 0.5,
        params=10,
        latency_s=0.1,
        within_budget=ok,
        planner_state={"level": level},
    )


def _level(history: list[RoundRecord]) -> float:
    return float(RulesPlanner().next_plan(_ctx(history)).planner_state["level"])


def test_prunes_more_while_within_budget_and_backs_off_after_a_drop() -> None:
    grown = _level([_record(0, 0.25, True)])
    assert grown > 0.25
    backed = _level([_record(0, 0.25, True), _record(1, 0.4, False)])
    assert 0.25 < backed < 0.4
    rounds = [_record(0, 0.25, True)]
    for i in range(1, 6):
        rounds.append(_record(i, _level(rounds), i % 2 == 0))
    levels = [r.planner_state["level"] for r in rounds]
    assert len(set(levels)) == len(levels), "every round tries a new level"


def test_registry() -> None:
    assert get_planner("rules").name == "rules"


def test_exact_pattern_separates_internal_from_residual_convolutions() -> None:
    universe = [
        f"resnet.encoder.stages.{s}.layers.{b}.layer.{i}.convolution"
        for s in range(2)
        for b in range(3)
        for i in range(3)
    ]
    internal = [n for n in universe if not n.endswith("layer.2.convolution")]
    pattern = exact_pattern(internal, universe)
    assert {n for n in universe if re.search(pattern, n)} == set(internal)
    assert "(?:0|1)" in pattern
    odd = universe[:2] + universe[7:8]
    assert {n for n in universe if re.search(exact_pattern(odd, universe), n)} == set(odd)
