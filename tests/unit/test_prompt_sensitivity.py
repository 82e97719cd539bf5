"""The LLM planner's prompts carry the run's importance, recovery and the sensitivity table, compactly."""

from __future__ import annotations

import dataclasses
import re

import pytest

from agents.planning.base import PlanningContext
from agents.planning.prompt_sensitivity import MAX_UNITS, sensitivity_lines, settings_lines
from agents.planning.prompts import analysis_prompt, iteration_prompt
from agents.planning.validation import validate_plan
from tests.helpers import planning_context, tiny_vit
from tools.schemas import (
    OptimizationPlan,
    PruningRecommendation,
    SensitivityPoint,
    SensitivityProfile,
    SensitivityUnit,
)


def _pattern(name: str) -> str:
    return "^" + re.escape(name) + "$"


def _points(saved: int, kl: float) -> list[SensitivityPoint]:
    """At 25/50/75 %: KL and parameters saved grow with the ratio; agreement falls as KL grows."""
    return [
        SensitivityPoint(
            ratio=r,
            params_saved=int(saved * r / 0.25),
            agreement=round(1 - 2 * kl * r / 0.25, 4),
            kl=round(kl * r / 0.25, 6),
            accuracy_drop_points=round(100 * kl * r, 2),
        )
        for r in (0.25, 0.5, 0.75)
    ]


@pytest.fixture(scope="module")
def base_ctx() -> PlanningContext:
    return planning_context(tiny_vit(), 16, 1.5)


@pytest.fixture(scope="module")
def ctx(base_ctx: PlanningContext) -> PlanningContext:
    """The tiny ViT's real units (2 attention modules, 2 fc1 layers) with made-up damages."""
    damages = {  # name -> (params saved at 25 %, KL at 25 %)
        "vit.layers.0.attention": (400, 0.02),
        "vit.layers.1.attention": (400, 0.001),
        "vit.layers.0.mlp.fc1": (500, 0.0005),
        "vit.layers.1.mlp.fc1": (500, 0.05),
    }
    units = [
        SensitivityUnit(
            pattern=_pattern(name),
            pruning_type="head" if name.endswith("attention") else "structured",
            modules=[name],
            size=4 if name.endswith("attention") else 32,
            points=_points(saved, kl),
        )
        for name, (saved, kl) in damages.items()
    ]
    sens = SensitivityProfile(
        samples=256, importance="act", recovery="reconstruct", ratios=[0.25, 0.5, 0.75], seconds=3.0, units=units
    )
    profile = base_ctx.profile.model_copy(update={"sensitivity": sens})
    return dataclasses.replace(base_ctx, profile=profile, importance="act", recovery="reconstruct")


RANKED = [
    r"^vit\.layers\.0\.mlp\.fc1$",
    r"^vit\.layers\.1\.attention$",
    r"^vit\.layers\.0\.attention$",
    r"^vit\.layers\.1\.mlp\.fc1$",
]


def _unit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ^vit") and " agree " in line]


def test_both_prompts_carry_settings_and_the_table_in_rank_order(ctx: PlanningContext) -> None:
    for text in (analysis_prompt(ctx), iteration_prompt(ctx)):
        assert "importance 'act' (activation-aware" in text
        assert "recovery 'reconstruct' after every prune" in text and "least-squares" in text
        assert "pruned ALONE at 25%, 50%, 75%, repaired with recovery 'reconstruct'" in text
        assert "256 calibration images" in text and "4 of 4 units, most prunable first" in text
        assert "roughly add up" in text and "move independently" in text
        lines = _unit_lines(text)
        assert [line.split(" ")[1] for line in lines] == RANKED
        # fc1 of layer 0 at 50 %: 1,000 of 19,626 parameters, KL 0.001, agreement 1 - 2 * 0.001
        total = ctx.profile.total_params
        assert lines[0].startswith(
            r"- ^vit\.layers\.0\.mlp\.fc1$ (structured; channels: 32 output channels) 25%: agree 99.9%"
        )
        assert f"50%: agree 99.8%, KL 0.0010, saves {100 * 1000 / total:.1f}%, drop 0.03 pts" in lines[0]
        assert lines[1].startswith(r"- ^vit\.layers\.1\.attention$ (head; heads: 4 attention heads) 25%:")
        # the table comes before the budget and the rules
        assert text.index("Sensitivity, measured") < text.index("Budget:") < text.index("Rules:")


def test_listed_patterns_make_a_valid_plan(ctx: PlanningContext) -> None:
    """The LLM is told to use each unit's pattern as 'layer': a plan doing so passes validation."""
    sens = ctx.profile.sensitivity
    assert sens is not None
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=u.pattern, pruning_type=u.pruning_type, pruning_ratio=0.25) for u in sens.units
        ]
    )
    assert validate_plan(plan, ctx) == []


def test_the_table_is_capped_most_prunable_first(ctx: PlanningContext) -> None:
    sens = ctx.profile.sensitivity
    assert sens is not None
    many = [
        u.model_copy(update={"pattern": f"{u.pattern[:-1]}_{i}$", "points": _points(400, 0.001 * (i + 1))})
        for i, u in enumerate(sens.units * 20)
    ]
    big = dataclasses.replace(
        ctx, profile=ctx.profile.model_copy(update={"sensitivity": sens.model_copy(update={"units": many})})
    )
    lines = sensitivity_lines(big)
    listed = _unit_lines("\n".join(lines))
    assert len(listed) == MAX_UNITS == 40
    kls = [float(re.search(r"50%: agree [\d.]+%, KL ([\d.]+)", line).group(1)) for line in listed]  # type: ignore[union-attr]
    assert kls == sorted(kls) and kls[0] == pytest.approx(0.002)  # the least damaging 40 of 80
    assert "- (40 more units, all more damaging per parameter: leave them alone)" in lines
    # what a small local model has to read: the whole analysis prompt stays under ~6k tokens
    assert len(analysis_prompt(big)) < 24_000
    assert len(_unit_lines("\n".join(sensitivity_lines(big, max_units=3)))) == 3


def test_without_sensitivity_only_the_settings_or_nothing(base_ctx: PlanningContext, ctx: PlanningContext) -> None:
    assert settings_lines(base_ctx) == [] and sensitivity_lines(base_ctx) == []
    text = analysis_prompt(base_ctx)
    assert "How your plan is applied" not in text and "Sensitivity, measured" not in text
    blind = dataclasses.replace(base_ctx, importance="l2", recovery="none")
    text = analysis_prompt(blind)
    assert "importance 'l2' (L2 norm" in text and "recovery 'none'" in text and "nothing repairs" in text
    assert "Sensitivity, measured" not in text
    # the settings fall back to what the sensitivity profile was measured with
    assert "recovery 'reconstruct'" in "\n".join(settings_lines(dataclasses.replace(ctx, recovery=None)))
