"""Prompts of the LLM planner: built from a real (tiny) profile, they carry what the LLM needs."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.prompts import (
    _group_status,
    analysis_messages,
    analysis_prompt,
    input_shape_prompt,
    iteration_messages,
    iteration_prompt,
    plan_schema_json,
    retry_message,
)
from tests.helpers import planning_context, tiny_resnet, tiny_vit
from tools.schemas import OptimizationPlan, PruningRecommendation

VIT_HEADS = r"^vit\.layers\.\d+\.attention$"
VIT_FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"


@pytest.fixture(scope="module")
def vit_ctx() -> PlanningContext:
    return planning_context(tiny_vit(), 16, 1.5)


@pytest.fixture(scope="module")
def resnet_ctx() -> PlanningContext:
    return planning_context(tiny_resnet(), 32, 1.5)


def test_analysis_prompt_lists_top_groups_heads_structured_and_blocked(vit_ctx: PlanningContext) -> None:
    text = analysis_prompt(vit_ctx)
    top = [g for g in vit_ctx.profile.groups if g.latency_share >= 0.001][:5]
    for group in top:
        assert group.pattern in text
        assert f"{100 * group.latency_share:.1f}%" in text
    assert VIT_HEADS in text and "4 heads each" in text
    # fc1 is listed among the structured layers whatever its measured latency; among the top groups (12 of the
    # tiny ViT's 16, ranked by a one-call timing) only when it ranks there, with its status
    structured = text.split("pruning_type 'structured'")[1].split("\n\n")[0]
    assert f"- {VIT_FC1} :" in structured and "internal to their block" in structured
    fc1 = next(g for g in vit_ctx.profile.groups if g.pattern == VIT_FC1)
    status = _group_status(fc1, vit_ctx.profile, vit_ctx.prunable)
    assert status.startswith("structured-prunable, internal to its block")
    assert (f"{VIT_FC1} : " in text.split("pruning_type 'structured'")[0]) == (status in text)
    assert r"^classifier$" in text and "classifier / output head" in text
    assert "q/k/v projection" in text
    assert "ViTForImageClassification" in text
    assert "13 Linear layers" in text  # 2 x (q, k, v, o, fc1, fc2) + classifier
    assert "at most 1.5 accuracy points" in text and "between 0 and 0.6" in text
    assert plan_schema_json() in text
    assert json.loads(plan_schema_json()) == OptimizationPlan.model_json_schema()
    messages = analysis_messages(vit_ctx)
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == text


def test_analysis_prompt_for_a_cnn_separates_internal_and_coupled_and_has_no_heads(
    resnet_ctx: PlanningContext,
) -> None:
    text = analysis_prompt(resnet_ctx)
    assert "no head-prunable attention modules" in text
    lines = text.splitlines()
    internal = next(line for line in lines if r"layer\.(?:0)\.convolution$ :" in line)
    coupled = next(line for line in lines if r"layer\.(?:1)\.convolution$ :" in line)
    assert "internal to their block" in internal and "coupled:" in coupled
    assert r"^classifier\.\d+$" in text


def _round(i: int, acc: float, drop: float, params: int, ok: bool, source: str = "llm") -> RoundRecord:
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=VIT_HEADS, pruning_type="head", pruning_ratio=0.25 + 0.1 * i),
            PruningRecommendation(layer=VIT_FC1, pruning_type="structured", pruning_ratio=0.3),
        ]
    )
    return RoundRecord(
        round=i,
        plan=plan,
        source=source,
        accuracy=acc,
        accuracy_drop_points=drop,
        params=params,
        latency_s=0.00123 - 0.0001 * i,
        within_budget=ok,
    )


def test_iteration_prompt_has_every_round_and_the_over_budget_line(vit_ctx: PlanningContext) -> None:
    history = [_round(0, 0.8912, 0.88, 15000, True, "rules"), _round(1, 0.8630, 3.7, 12345, False)]
    text = iteration_prompt(dataclasses.replace(vit_ctx, history=history))
    assert "pruning plan for round 2" in text
    assert "Round 0 [rules]" in text and "Round 1 [llm]" in text
    assert "head ^vit\\.layers\\.\\d+\\.attention$ @ 0.35" in text
    assert "accuracy 0.8912 (drop 0.88 points)" in text and "accuracy 0.8630 (drop 3.70 points)" in text
    assert "params 15,000" in text and "params 12,345" in text
    assert "latency 1.230 ms" in text
    assert "Round 1 broke the accuracy budget by 2.20 points" in text
    assert "Best round within budget so far: round 0" in text
    assert "back off" in text
    assert VIT_HEADS in text  # the profile summary P is repeated
    assert iteration_messages(dataclasses.replace(vit_ctx, history=history))[1]["content"] == text


def test_iteration_prompt_without_history_and_after_a_good_round(vit_ctx: PlanningContext) -> None:
    assert "No round has been evaluated yet" in iteration_prompt(vit_ctx)
    text = iteration_prompt(dataclasses.replace(vit_ctx, history=[_round(0, 0.895, 0.5, 15000, True)]))
    assert "prune more" in text and "broke" not in text


def test_iteration_prompt_says_which_rounds_were_distilled_after_the_search(vit_ctx: PlanningContext) -> None:
    distilled = _round(2, 0.89, 0.1, 12345, True).model_copy(update={"distilled_from": 1})
    history = [_round(0, 0.8912, 0.88, 15000, True), _round(1, 0.8630, 3.7, 12345, False), distilled]
    text = iteration_prompt(dataclasses.replace(vit_ctx, history=history))
    assert "Round 2 [llm] (round 1's model distilled from the original after the search," in text
    assert "Round 1 [llm]: " in text
    assert "before distillation" not in text
    # once a distilled round came back, the LLM is given the rules planner's target, not "prune more"/"back off"
    targeted = iteration_prompt(dataclasses.replace(vit_ctx, history=history, distillation_target_points=1.64))
    assert "brought round(s) 1 back within the budget" in targeted
    assert "loses about 1.64 points before distillation" in targeted and "at most about 2.05 points" in targeted
    assert "prune more" not in targeted and "back off" not in targeted


def test_input_shape_prompt_shows_config_and_processor_fields() -> None:
    model = tiny_vit()
    config: Any = model.config
    metadata = {
        "model_class": type(model).__name__,
        "config": config.to_dict(),
        "processor": {"crop_size": {"height": 16, "width": 16}, "image_mean": [0.5, 0.5, 0.5], "size": 18},
    }
    text = input_shape_prompt(metadata)
    for needle in (
        "ViTForImageClassification",
        "image_size: 16",
        "num_channels: 3",
        "patch_size: 4",
        'crop_size: {"height": 16, "width": 16}',
        "image_mean: [0.5, 0.5, 0.5]",
        '"channels"',
    ):
        assert needle in text
    assert "id2label" not in text


def test_retry_message_lists_the_errors() -> None:
    text = retry_message(["first problem", "second problem"])
    assert "- first problem" in text and "- second problem" in text and "JSON" in text
