"""The LLM planner through the real ChatOpenAI client against a scripted OpenAI-compatible server.

Every case must end in a valid plan (from the LLM, after follow-ups, or from the rules fallback) and
record every exchange; none may raise.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.planning.base import PlanningContext, PlanResult, RoundRecord
from agents.planning.llm_planner import (
    JsonlExchangeLog,
    LLMPlanner,
    llm_planner_for_run,
    resolve_input_shape_with_llm,
    shape_metadata,
)
from agents.planning.rules import RulesPlanner
from agents.planning.validation import validate_plan
from tests.fake_openai import Delay, FakeOpenAI
from tests.helpers import tiny_vit
from tools.compression.pruning import prunable_layers
from tools.llm.client import (
    LLMConfigError,
    LLMSettings,
    LLMUnavailableError,
    check_endpoint,
    make_chat_model,
)
from tools.llm.structured import LLMExchange
from tools.profiling.profile import profile_model
from tools.schemas import OptimizationPlan, SensitivityPoint, SensitivityProfile, SensitivityUnit

HEADS = r"^vit\.layers\.\d+\.attention$"
FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"
GOOD: dict[str, Any] = {
    "pruning_recommendations": [
        {"layer": HEADS, "pruning_type": "head", "pruning_ratio": 0.25, "justification": "attention is 44% of latency"},
        {"layer": FC1, "pruning_type": "structured", "pruning_ratio": 0.3, "justification": "fc1 is internal"},
    ],
    "quantization_recommendations": [{"layer": "all", "quantization_type": "dynamic", "dtype": "qint8"}],
}


def _json(data: Any) -> str:
    return json.dumps(data)


def _with(**rec: Any) -> str:
    """GOOD with its first pruning recommendation changed."""
    data = json.loads(json.dumps(GOOD))
    data["pruning_recommendations"][0].update(rec)
    return _json(data)


@pytest.fixture(scope="module")
def ctx() -> PlanningContext:
    model = tiny_vit()
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return PlanningContext(
        profile=profile_model(model, x, family="vit", warmup=0, iters=1),
        prunable=prunable_layers(model, x).model_dump(),
        baseline_accuracy=0.9,
        max_accuracy_drop=1.0,
        max_ratio=0.6,
    )


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(model="fake-model") as fake:
        yield fake


def _settings(server: FakeOpenAI, timeout_s: float = 5.0) -> LLMSettings:
    return LLMSettings(model="fake-model", base_url=server.base_url, timeout_s=timeout_s, max_retries=0)


def _planner(server: FakeOpenAI, log: list[LLMExchange], timeout_s: float = 5.0) -> LLMPlanner:
    return LLMPlanner(_settings(server, timeout_s), exchange_log=log, max_attempts=3)


def _check(result: PlanResult, ctx: PlanningContext) -> None:
    assert validate_plan(result.plan, ctx) == [], "every outcome is a valid plan"
    json.dumps(result.planner_state)  # graph state is JSON only


# --- accepted answers ---------------------------------------------------------------------------


def test_good_answer_is_used_and_the_exchange_recorded(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [_json(GOOD)]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm"
    assert result.plan == OptimizationPlan.model_validate(GOOD)
    assert result.planner_state["attempts"] == 1 and result.planner_state["rejected"] == []
    (exchange,) = log
    assert exchange.ok and exchange.purpose == "analysis" and exchange.attempt == 1 and exchange.errors == []
    assert exchange.model == "fake-model"
    assert [m["role"] for m in exchange.prompt] == ["system", "user"]
    assert HEADS in exchange.prompt[1]["content"]
    assert exchange.raw_response == _json(GOOD)
    assert exchange.parsed == result.plan.model_dump(mode="json")
    assert exchange.token_usage["total_tokens"] > 0 and exchange.latency_s > 0
    (request,) = server.chat_requests
    assert request["model"] == "fake-model" and request["temperature"] == 0
    assert request["response_format"]["type"] == "json_schema"
    assert request["messages"][1]["content"] == exchange.prompt[1]["content"]


@pytest.mark.parametrize(
    "answer",
    [
        "Here is my plan, based on the profile:\n" + _json(GOOD) + "\nThe heads dominate, so they go first.",
        "Sure!\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nLet me know if you need anything else.",
        "<think>the attention is costly {not json}</think>\n```\n" + _json({"plan": GOOD}) + "\n```",
    ],
    ids=["prose", "json-fence", "think-and-wrapper"],
)
def test_answers_in_prose_and_fences_are_parsed(server: FakeOpenAI, ctx: PlanningContext, answer: str) -> None:
    server.script = [answer]
    result = _planner(server, []).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm"
    assert result.plan == OptimizationPlan.model_validate(GOOD)


def test_field_name_variants_are_mapped(server: FakeOpenAI, ctx: PlanningContext) -> None:
    variant = {
        "optimization_plan": {
            "pruning": [
                {"pattern": HEADS, "type": "attention_heads", "ratio": "25%", "reason": "heads"},
                {"regex": FC1, "method": "channel", "amount": 0.3},
            ],
            "quantization": {"layers": "all", "dtype": "int8"},
        }
    }
    server.script = [_json(variant)]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm"
    assert [(r.layer, r.pruning_type, r.pruning_ratio) for r in result.plan.pruning_recommendations] == [
        (HEADS, "head", 0.25),
        (FC1, "structured", 0.3),
    ]
    assert result.plan.quantization_recommendations[0].dtype == "qint8"
    assert any("read 'ratio' as 'pruning_ratio'" in n for n in log[0].notes)


def test_unknown_field_names_are_rejected_then_repaired(server: FakeOpenAI, ctx: PlanningContext) -> None:
    bad = {"pruning_recommendations": [{"layer_name": FC1, "prune_amount": 0.3}]}
    server.script = [_json(bad), _json(GOOD)]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm-repaired"
    (rejected,) = result.planner_state["rejected"]
    assert rejected["failure"] == "schema"
    assert any("Field required" in r for r in rejected["reasons"])
    assert any("layer_name" in r for r in rejected["reasons"])
    follow_up = server.chat_requests[1]["messages"]
    assert follow_up[-2] == {"role": "assistant", "content": _json(bad)}
    assert follow_up[-1]["role"] == "user" and "rejected" in follow_up[-1]["content"]
    assert "layer_name" in follow_up[-1]["content"]
    assert [e.ok for e in log] == [False, True] and [e.attempt for e in log] == [1, 2]


def test_regex_matching_nothing_then_a_good_answer(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [_with(layer=r"^encoder\.blocks\.\d+\.attn$"), _json(GOOD)]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm-repaired"
    assert result.planner_state["attempts"] == 2
    (rejected,) = result.planner_state["rejected"]
    assert rejected["plan"]["pruning_recommendations"][0]["layer"] == r"^encoder\.blocks\.\d+\.attn$"
    assert rejected["failure"] == "validation"
    assert "matches no head-prunable attention module" in rejected["reasons"][0]
    assert "matches no head-prunable" in server.chat_requests[1]["messages"][-1]["content"]
    assert log[0].errors == rejected["reasons"] and not log[0].ok


def test_ratio_over_the_maximum_is_rejected_until_the_fallback(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [_with(pruning_ratio=0.95)] * 3
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "rules-fallback"
    state = result.planner_state
    assert state["attempts"] == 3 and len(state["rejected"]) == 3
    assert all("exceeds the maximum 0.6" in r["reasons"][0] for r in state["rejected"])
    assert state["fallback_reason"] == "no valid plan after 3 attempts"
    assert state["level"] == RulesPlanner.start_level == state["fallback_state"]["level"]
    assert result.plan == RulesPlanner().analyze(ctx).plan
    assert len(log) == 3 and len(server.chat_requests) == 3


def test_pruning_the_classifier_is_rejected(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [_with(layer="^classifier$", pruning_type="structured"), _json(GOOD)]
    result = _planner(server, []).analyze(ctx)
    _check(result, ctx)
    assert result.source == "llm-repaired"
    assert "selects the classifier" in result.planner_state["rejected"][0]["reasons"][0]


def test_garbage_answers_end_in_the_fallback(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = ["I cannot help with that.", "", "{'broken': "]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "rules-fallback"
    assert [e.failure for e in log] == ["parse", "parse", "parse"]
    assert result.planner_state["rejected"][0]["raw"] == "I cannot help with that."


# --- transport failures ---------------------------------------------------------------------------


def test_http_500_falls_back_at_once(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [500]
    log: list[LLMExchange] = []
    result = _planner(server, log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "rules-fallback"
    (exchange,) = log
    assert exchange.failure == "http" and exchange.http_status == 500 and "500" in exchange.errors[0]
    assert "endpoint failed (http)" in result.planner_state["fallback_reason"]
    assert len(server.chat_requests) == 1


def test_timeout_falls_back(server: FakeOpenAI, ctx: PlanningContext) -> None:
    server.script = [Delay(3.0, _json(GOOD))]
    log: list[LLMExchange] = []
    started = time.perf_counter()
    result = _planner(server, log, timeout_s=1.0).analyze(ctx)
    elapsed = time.perf_counter() - started
    _check(result, ctx)
    assert result.source == "rules-fallback"
    assert log[0].failure == "timeout" and 0.9 < log[0].latency_s < 2.9
    assert elapsed < 2.9


def test_connection_refused_falls_back(ctx: PlanningContext) -> None:
    settings = LLMSettings(base_url=f"http://127.0.0.1:{_closed_port()}/v1", timeout_s=2, max_retries=0)
    log: list[LLMExchange] = []
    result = LLMPlanner(settings, exchange_log=log).analyze(ctx)
    _check(result, ctx)
    assert result.source == "rules-fallback" and log[0].failure == "connection"


def test_a_server_refusing_response_format_is_asked_without_it(server: FakeOpenAI, ctx: PlanningContext) -> None:
    def script(body: dict[str, Any]) -> str | int:
        return 400 if "response_format" in body else _json(GOOD)

    server.script = script
    planner = _planner(server, [])
    result = planner.analyze(ctx)
    assert result.source == "llm"
    # json_schema, then json_object are refused (HTTP 400): asked without one; remembered for the endpoint
    assert ["response_format" in r for r in server.chat_requests] == [True, True, False]
    planner.analyze(ctx)
    assert ["response_format" in r for r in server.chat_requests] == [True, True, False, False]


# --- iteration ------------------------------------------------------------------------------------


def _round(i: int, plan: OptimizationPlan, source: str, ok: bool, state: dict[str, Any]) -> RoundRecord:
    return RoundRecord(
        round=i,
        plan=plan,
        source=source,
        accuracy=0.895 if ok else 0.85,
        accuracy_drop_points=0.5 if ok else 5.0,
        params=15000 - 1000 * i,
        latency_s=0.001,
        within_budget=ok,
        planner_state=state,
    )


def test_next_plan_reads_the_history_and_keeps_quantization(server: FakeOpenAI, ctx: PlanningContext) -> None:
    first = OptimizationPlan.model_validate(GOOD)
    history = [
        _round(0, first, "llm", True, {"planner": "llm"}),
        _round(1, first, "llm", False, {"planner": "llm"}),
    ]
    pruning_only = {"pruning_recommendations": GOOD["pruning_recommendations"][:1]}
    server.script = [_json(pruning_only)]
    log: list[LLMExchange] = []
    result = _planner(server, log).next_plan(dataclasses.replace(ctx, history=history))
    _check(result, ctx)
    assert result.source == "llm"
    assert result.plan.quantization_recommendations == first.quantization_recommendations
    (exchange,) = log
    assert exchange.purpose == "iteration" and exchange.round == 2
    prompt = exchange.prompt[1]["content"]
    assert "Round 1 broke the accuracy budget by 4.00 points" in prompt
    assert "Round 0 [llm]" in prompt and "params 15,000" in prompt


def _with_sensitivity(ctx: PlanningContext) -> PlanningContext:
    """``ctx`` with a measured sensitivity profile of its attention modules and the run's settings."""
    units = [
        SensitivityUnit(
            pattern="^" + re.escape(name) + "$",
            pruning_type="head",
            modules=[name],
            size=heads,
            points=[
                SensitivityPoint(ratio=r, params_saved=int(1000 * r), agreement=1 - (i + 1) * r / 10, kl=(i + 1) * r)
                for r in (0.25, 0.5)
            ],
        )
        for i, (name, heads) in enumerate(sorted(ctx.prunable.heads.items()))
    ]
    sens = SensitivityProfile(
        samples=128, importance="act", recovery="reconstruct", ratios=[0.25, 0.5], seconds=1.0, units=units
    )
    profile = ctx.profile.model_copy(update={"sensitivity": sens})
    return dataclasses.replace(ctx, profile=profile, importance="act", recovery="reconstruct")


def test_the_sensitivity_table_and_recovery_reach_the_llm(server: FakeOpenAI, ctx: PlanningContext) -> None:
    measured = _with_sensitivity(ctx)
    server.script = [_json(GOOD), _json(GOOD)]
    log: list[LLMExchange] = []
    planner = _planner(server, log)
    _check(planner.analyze(measured), measured)
    history = [_round(0, OptimizationPlan.model_validate(GOOD), "llm", True, {"planner": "llm"})]
    _check(planner.next_plan(dataclasses.replace(measured, history=history)), measured)
    assert [e.purpose for e in log] == ["analysis", "iteration"]
    for request in server.chat_requests:
        prompt = request["messages"][1]["content"]
        assert "recovery 'reconstruct' after every prune" in prompt and "importance 'act'" in prompt
        assert "pruned ALONE at 25%, 50%" in prompt and "on 128 calibration images" in prompt
        rows = [line for line in prompt.splitlines() if line.startswith("- ^vit") and ": agree " in line]
        # layer 0 is the less damaging (KL 0.5 vs 1.0 at 50 %, same parameters saved): listed first
        assert [row.split(" ")[1] for row in rows] == [r"^vit\.layers\.0\.attention$", r"^vit\.layers\.1\.attention$"]
        assert "50%: agree 95.0%, KL 0.5000" in rows[0] and "50%: agree 90.0%, KL 1.0000" in rows[1]


def test_iteration_fallback_continues_the_rules_level_search(server: FakeOpenAI, ctx: PlanningContext) -> None:
    rules = RulesPlanner()
    first = rules.analyze(ctx)
    history = [
        _round(0, first.plan, "rules-fallback", True, {"level": first.planner_state["level"]}),
        _round(1, OptimizationPlan.model_validate(GOOD), "llm", False, {"planner": "llm"}),
    ]
    server.script = [503]
    result = _planner(server, []).next_plan(dataclasses.replace(ctx, history=history))
    _check(result, ctx)
    assert result.source == "rules-fallback"
    expected = rules.next_plan(dataclasses.replace(ctx, history=history[:1]))
    assert result.planner_state["level"] == expected.planner_state["level"] > first.planner_state["level"]
    assert result.plan == expected.plan


# --- input shape, logs, settings, endpoint check --------------------------------------------------------


def test_input_shape_from_the_llm(server: FakeOpenAI) -> None:
    model = tiny_vit()
    chat = make_chat_model(_settings(server))
    server.script = [
        'The model takes ```json\n{"input_shape": [3, 16, 16]}\n```',
        '{"channels": 3, "height": 1, "width": 2}',
    ]
    log: list[LLMExchange] = []
    shape, exchange = resolve_input_shape_with_llm(chat, shape_metadata(model), exchange_log=log)
    assert shape is not None and shape.as_tuple() == (3, 16, 16) and shape.source == "llm"
    assert exchange.ok and exchange.purpose == "input_shape" and log == [exchange]
    assert "image_size: 16" in server.chat_requests[0]["messages"][1]["content"]
    shape, exchange = resolve_input_shape_with_llm(chat, shape_metadata(model))
    assert shape is None and not exchange.ok and exchange.failure == "validation"


def test_jsonl_exchange_log(server: FakeOpenAI, ctx: PlanningContext, tmp_path: Path) -> None:
    server.script = [_with(pruning_ratio=0.9), _json(GOOD)]
    sink = JsonlExchangeLog(tmp_path / "llm" / "exchanges.jsonl")
    LLMPlanner(_settings(server), exchange_log=sink).analyze(ctx)
    exchanges = sink.read()
    assert [e.attempt for e in exchanges] == [1, 2] and [e.ok for e in exchanges] == [False, True]
    assert "api_key" not in sink.path.read_text()


def test_llm_planner_for_run_logs_to_the_run_dir(server: FakeOpenAI, ctx: PlanningContext, tmp_path: Path) -> None:
    server.script = [_json(GOOD)]
    planner = llm_planner_for_run(tmp_path, model="fake-model", base_url=server.base_url, timeout_s=5)
    assert planner.analyze(ctx).source == "llm"
    (exchange,) = JsonlExchangeLog(tmp_path / "llm" / "exchanges.jsonl").read()
    assert exchange.ok and exchange.model == "fake-model"


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "PROFILING_AGENT_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PROFILING_AGENT_LLM_BASE_URL", raising=False)
    with pytest.raises(LLMConfigError, match=r"OPENAI_API_KEY.*--llm-base-url"):
        LLMSettings.from_env()
    local = LLMSettings.from_env(base_url="http://127.0.0.1:8000/v1", model=None)
    assert local.api_key is not None and local.api_key.get_secret_value() == "not-needed"
    assert local.model == "gpt-4o-mini" and local.temperature == 0 and local.timeout_s == 60 and local.max_retries == 1
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("PROFILING_AGENT_LLM_MODEL", "my-model")
    settings = LLMSettings.from_env(timeout_s=5)
    assert settings.base_url == "http://127.0.0.1:1/v1" and settings.model == "my-model" and settings.timeout_s == 5
    assert "sk-secret" not in repr(settings) and "sk-secret" not in json.dumps(settings.public_dict())
    assert settings.public_dict()["api_key_set"] is True
    chat = make_chat_model(settings)  # no request is sent
    assert chat.model_name == "my-model"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_check_endpoint(server: FakeOpenAI) -> None:
    check_endpoint(_settings(server))
    assert server.requests[-1].path == "/v1/models"
    assert server.requests[-1].headers.get("Authorization") == "Bearer not-needed"

    started = time.perf_counter()
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(LLMUnavailableError, match=f"{url}/models does not answer"):
        check_endpoint(LLMSettings(base_url=url), timeout_s=2)
    assert time.perf_counter() - started < 2


def test_check_endpoint_without_models_route(ctx: PlanningContext) -> None:
    with FakeOpenAI(["pong"], models_status=404) as fake:
        check_endpoint(_settings(fake))
        assert fake.chat_requests[0]["max_tokens"] == 1
        fake.script = [500]
        with pytest.raises(LLMUnavailableError, match="chat/completions answered HTTP 500"):
            check_endpoint(_settings(fake))
    with FakeOpenAI(models_status=401) as fake, pytest.raises(LLMUnavailableError, match="rejected the API key"):
        check_endpoint(_settings(fake))
