"""Planning prompts within a context budget: shorter levels keep the most important groups, units and
rounds; the LLM planner picks the longest prompt that fits and says what it left out."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from agents.context import Context
from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.llm_planner import LLMPlanner
from agents.planning.prompt_budget import FULL, LEVELS, cuts, rounds_shown
from agents.planning.prompts import (
    SHAPE_LEVELS,
    input_shape_messages,
    iteration_messages,
    iteration_prompt,
    plan_schema_json,
)
from tests.fake_openai import FakeOpenAI
from tests.helpers import planning_context, tiny_vit
from tools.llm.budget import estimate_prompt_tokens, estimate_tokens, fit_messages
from tools.llm.client import LLMSettings
from tools.llm.structured import LLMExchange
from tools.schemas import (
    OptimizationPlan,
    PruningRecommendation,
    SensitivityPoint,
    SensitivityProfile,
    SensitivityUnit,
)

FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"
GOOD = json.dumps({"pruning_recommendations": [{"layer": FC1, "pruning_type": "structured", "pruning_ratio": 0.3}]})
BEST = 3  # the best round within budget in the history below
ROUNDS = 12


def _unit(i: int) -> SensitivityUnit:
    layer = i % 2
    points = [
        SensitivityPoint(ratio=r, params_saved=int(800 * r), agreement=1 - 0.01 * (i + 1) * r, kl=0.001 * (i + 1) * r)
        for r in (0.25, 0.5, 0.75)
    ]
    return SensitivityUnit(
        pattern=rf"^vit\.layers\.{layer}\.mlp\.fc1_{i}$",
        pruning_type="structured",
        modules=[f"vit.layers.{layer}.mlp.fc1"],
        size=32,
        points=points,
    )


def _round(i: int) -> RoundRecord:
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=FC1, pruning_type="structured", pruning_ratio=0.05 * (i % 10 + 1))
        ]
    )
    ok = i % 2 == 1
    accuracy = 0.899 if i == BEST else (0.89 if ok else 0.8)
    return RoundRecord(
        round=i,
        plan=plan,
        source="llm",
        accuracy=accuracy,
        accuracy_drop_points=round(100 * (0.9 - accuracy), 2),
        params=15000 - 100 * i,
        latency_s=0.001,
        within_budget=ok,
    )


@pytest.fixture(scope="module")
def big() -> PlanningContext:
    """The tiny ViT with 80 sensitivity units and 12 earlier rounds: about 6,000 tokens in full."""
    base = planning_context(tiny_vit(), 16, 1.0)
    sens = SensitivityProfile(
        samples=64, importance="act", recovery="reconstruct", ratios=[0.25, 0.5, 0.75], seconds=1.0,
        units=[_unit(i) for i in range(80)],
    )  # fmt: skip
    profile = base.profile.model_copy(update={"sensitivity": sens})
    history = [_round(i) for i in range(ROUNDS)]
    return dataclasses.replace(base, profile=profile, history=history, importance="act", recovery="reconstruct")


def test_estimates_and_fitting() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("x" * 35) == 10 and estimate_tokens("x" * 36) == 11
    assert estimate_prompt_tokens([{"role": "user", "content": "x" * 35}]) == 14  # 10 + 4 for the message

    def build(chars: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "x" * chars}]

    fitted = fit_messages([3500, 700, 70], build, budget_tokens=300)
    assert fitted.level == 700 and fitted.shortened and not fitted.over_budget
    assert (fitted.tokens, fitted.full_tokens) == (204, 1004)
    fitted = fit_messages([3500, 700, 70], build, budget_tokens=300, reserved_tokens=250)
    assert fitted.level == 70 and fitted.tokens == 274
    fitted = fit_messages([3500, 700], build, budget_tokens=100)
    assert fitted.level == 700 and fitted.over_budget  # the shortest is sent anyway, and says so
    assert not fit_messages([35], build, 100).shortened


def test_levels_shrink_and_keep_what_matters(big: PlanningContext) -> None:
    sizes = [estimate_prompt_tokens(iteration_messages(big, detail)) for detail in LEVELS]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert sizes[0] > 5000 and sizes[-1] < 2000
    assert iteration_messages(big, FULL) == iteration_messages(big)

    text = iteration_prompt(big, LEVELS[-1])
    shown = [int(n) for n in re.findall(r"^Round (\d+) \[", text, flags=re.MULTILINE)]
    assert shown == [BEST, ROUNDS - 1]  # the best within budget and the latest
    assert f"({ROUNDS - 2} earlier rounds left out to fit the context window, 6 of them over budget;" in text
    assert f"Best round within budget so far: round {BEST}" in text
    units = [line for line in text.splitlines() if ": agree " in line]
    assert len(units) == LEVELS[-1].units and r"fc1_0$" in units[0]  # the most prunable unit first
    assert "(77 more units, all more damaging per parameter: leave them alone)" in text
    assert r"^classifier$" in text  # the classifier stays listed as not prunable
    assert plan_schema_json() not in text and '"pruning_recommendations": [{"layer"' in text
    assert plan_schema_json() in iteration_prompt(big, LEVELS[0])


def test_cuts_say_what_was_left_out(big: PlanningContext) -> None:
    said = cuts(LEVELS[-1], big, iteration_prompt(big, LEVELS[-1]))
    assert "sensitivity table: 3 of 40 units" in said and "earlier rounds: 2 of 12 in full" in said
    assert "layer groups: 3 of 12" in said and any("compact example" in s for s in said)
    assert "prunable / not-prunable lists: at most 3 entries each" in said  # 7 not-prunable groups
    assert not any("lists" in s for s in cuts(LEVELS[1], big, iteration_prompt(big, LEVELS[1])))
    assert cuts(FULL, big) == []
    assert rounds_shown(list(big.history), FULL) == (sorted(big.history, key=lambda r: r.round), 0)


def test_the_planner_keeps_every_prompt_within_the_budget(big: PlanningContext, tmp_path: Path) -> None:
    budget = 2500
    with FakeOpenAI(["x" * 20_000, GOOD]) as server:
        log: list[LLMExchange] = []
        settings = LLMSettings(model="fake-model", base_url=server.base_url, timeout_s=5, max_retries=0)
        result = LLMPlanner(settings, exchange_log=log, context_tokens=budget).next_plan(big)
        assert result.source == "llm-repaired"
        first, second = server.chat_requests
    for request in (first, second):
        assert estimate_prompt_tokens(request["messages"]) <= budget
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"].endswith("... (cut)") and len(second["messages"][2]["content"]) < 3100
    assert log[0].notes[0].startswith(f"prompt shortened to fit --llm-context-tokens {budget:,} (estimated ")
    assert "sensitivity table:" in log[0].notes[0] and log[0].estimated_prompt_tokens <= budget
    (note,) = result.planner_state["report_notes"]
    assert "shortened to fit --llm-context-tokens 2,500" in note
    assert result.planner_state["prompt"]["budget_tokens"] == budget
    assert result.planner_state["prompt"]["detail"] != "full"


def test_a_prompt_that_fits_is_not_touched(tmp_path: Path) -> None:
    small = planning_context(tiny_vit(), 16, 1.0)
    with FakeOpenAI([GOOD]) as server:
        settings = LLMSettings(model="fake-model", base_url=server.base_url, timeout_s=5, max_retries=0)
        log: list[LLMExchange] = []
        result = LLMPlanner(settings, exchange_log=log).analyze(small)
    assert result.source == "llm" and "report_notes" not in result.planner_state
    assert result.planner_state["prompt"]["detail"] == "full" and not log[0].notes


def test_the_input_shape_prompt_shrinks_too() -> None:
    metadata = {"model_class": "X", "config": {f"field_{i}": "v" * 400 for i in range(40)}}
    sizes = [estimate_prompt_tokens(input_shape_messages(metadata, level)) for level in SHAPE_LEVELS]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 600 < sizes[0]


def test_the_budget_is_checked_when_the_run_starts() -> None:
    assert Context().llm_context_tokens == 6000
    with pytest.raises(ValueError, match="--llm-context-tokens must be at least 2000"):
        Context(llm_context_tokens=1500)
    with pytest.raises(ValueError, match="at least 2000"):
        LLMPlanner(LLMSettings(base_url="http://127.0.0.1:1/v1"), context_tokens=1999)
