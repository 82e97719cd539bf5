"""Plan validation against a real (tiny) model's prunable layers."""

from __future__ import annotations

import pytest

from agents.planning.base import PlanningContext
from agents.planning.rules import RulesPlanner
from agents.planning.validation import repair_plan, validate_plan
from tests.helpers import planning_context, tiny_resnet, tiny_vit
from tools.schemas import OptimizationPlan, PruningRecommendation, QuantizationRecommendation

HEADS = r"^vit\.layers\.\d+\.attention$"
FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"


@pytest.fixture(scope="module")
def vit_ctx() -> PlanningContext:
    return planning_context(tiny_vit(), 16, 1.0)


@pytest.fixture(scope="module")
def resnet_ctx() -> PlanningContext:
    return planning_context(tiny_resnet(), 32, 1.0)


def _plan(*recs: tuple[str, str, float], quant: list[QuantizationRecommendation] | None = None) -> OptimizationPlan:
    return OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=layer, pruning_type=kind, pruning_ratio=ratio)  # type: ignore[arg-type]
            for layer, kind, ratio in recs
        ],
        quantization_recommendations=quant or [],
    )


def test_valid_plans_pass(vit_ctx: PlanningContext, resnet_ctx: PlanningContext) -> None:
    quant = [QuantizationRecommendation(layer="all"), QuantizationRecommendation(layer=r"mlp\.fc\d$", dtype="float16")]
    assert validate_plan(_plan((HEADS, "head", 0.25), (FC1, "structured", 0.6), quant=quant), vit_ctx) == []
    # a head regex may name the projections, as the pruner accepts them
    assert validate_plan(_plan((r"attention\.q_proj$", "head", 0.5)), vit_ctx) == []
    for ctx in (vit_ctx, resnet_ctx):
        assert validate_plan(RulesPlanner().analyze(ctx).plan, ctx, require_pruning=True) == []


def test_regex_matching_nothing_lists_the_prunable_patterns(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((r"^encoder\.block\d+\.mlp$", "structured", 0.3)), vit_ctx)
    assert "pruning_recommendations[0]" in error and "matches no structured-prunable module" in error
    assert repr(FC1) in error
    (error,) = validate_plan(_plan((r"^nothing$", "head", 0.3)), vit_ctx)
    assert "matches no head-prunable attention module" in error and repr(HEADS) in error


def test_ratio_over_the_maximum(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((FC1, "structured", 0.95)), vit_ctx)
    assert "pruning_ratio 0.95 exceeds the maximum 0.6" in error


def test_pruning_the_classifier_is_an_error(vit_ctx: PlanningContext, resnet_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((r"^classifier$", "structured", 0.2)), vit_ctx)
    assert "selects the classifier 'classifier'" in error
    errors = validate_plan(_plan((r"classifier|fc1", "structured", 0.2)), vit_ctx)
    assert any("classifier" in e for e in errors)
    (error,) = validate_plan(_plan((r"classifier\.1", "structured", 0.2)), resnet_ctx)
    assert "classifier" in error


def test_narrowing_heads_is_validated_like_head_pruning(vit_ctx: PlanningContext, resnet_ctx: PlanningContext) -> None:
    # heads and their width are separate units: both on the same attention modules is one plan
    assert validate_plan(_plan((HEADS, "head", 0.25), (HEADS, "head_dim", 0.5)), vit_ctx) == []
    (error,) = validate_plan(_plan((HEADS, "head_dim", 0.25), (r"attention$", "head_dim", 0.5)), vit_ctx)
    assert "already selected by pruning_recommendations[0]" in error
    (error,) = validate_plan(_plan((r"attention", "head_dim", 0.25)), resnet_ctx)
    assert "has no head-prunable attention modules" in error


def test_head_pruning_on_a_cnn(resnet_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((r"attention", "head", 0.25)), resnet_ctx)
    assert "ResNetForImageClassification has no head-prunable attention modules" in error
    assert "structured" in error


def test_invalid_regex(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((r"vit.layers.(\d+.mlp", "structured", 0.2)), vit_ctx)
    assert "invalid regular expression" in error
    (error,) = validate_plan(_plan(quant=[QuantizationRecommendation(layer="fc[")]), vit_ctx)
    assert "quantization_recommendations[0]" in error and "invalid regular expression" in error


def test_blocked_modules_and_projections_are_explained(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((r"attention\.q_proj$", "structured", 0.2)), vit_ctx)
    assert "cannot be pruned" in error and "pruning_type 'head'" in error
    (error,) = validate_plan(_plan((r"mlp\.fc2$", "structured", 0.2)), vit_ctx)
    assert "residual stream" in error


def test_quantization_patterns_must_select_a_layer(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan(quant=[QuantizationRecommendation(layer=r"^features\.\d+$")]), vit_ctx)
    assert "matches no Linear or Conv module" in error
    plan = _plan(quant=[QuantizationRecommendation(layer=r"^head$")])
    assert validate_plan(plan, vit_ctx, model_layer_names=["head", "body"]) == []


def test_duplicates_and_empty_plans(vit_ctx: PlanningContext) -> None:
    (error,) = validate_plan(_plan((HEADS, "head", 0.25), (r"attention$", "head", 0.25)), vit_ctx)
    assert "already selected by pruning_recommendations[0]" in error
    assert validate_plan(OptimizationPlan(), vit_ctx) == []
    (error,) = validate_plan(OptimizationPlan(), vit_ctx, require_pruning=True)
    assert "no pruning_recommendations" in error


def test_repair_plan_clamps_and_drops(vit_ctx: PlanningContext) -> None:
    plan = _plan(
        (FC1, "structured", 0.9),
        (r"^classifier$", "structured", 0.2),
        (r"(", "head", 0.2),
        (HEADS, "head", 0.3),
        quant=[QuantizationRecommendation(layer="nothing")],
    )
    repaired, changes = repair_plan(plan, vit_ctx)
    assert validate_plan(repaired, vit_ctx) == []
    assert [(r.layer, r.pruning_ratio) for r in repaired.pruning_recommendations] == [(FC1, 0.6), (HEADS, 0.3)]
    assert repaired.quantization_recommendations == []
    assert len(changes) == 4
    assert repair_plan(repaired, vit_ctx) == (repaired, [])
