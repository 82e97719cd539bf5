"""The response format each endpoint accepts, learned from its refusals, against a scripted server.

Servers refuse formats in different ways: llama-cpp-python's answers 500 naming the format, others 400
or 422 without a word. Each refusal moves one step down (``json_schema`` → ``json_object`` → none), is
noted in the exchange, and is remembered for the endpoint (in the run dir, so a resume remembers too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agents.planning.base import PlanningContext
from agents.planning.llm_planner import JsonlExchangeLog, LLMPlanner
from tests.fake_openai import FakeOpenAI
from tests.helpers import planning_context, tiny_vit
from tools.llm.client import LLMSettings, make_chat_model
from tools.llm.response_format import ResponseFormatMemory, endpoint_key, refuses_format
from tools.llm.structured import LLMExchange, invoke_structured

LLAMA_CPP_500 = {
    "__status__": 500,
    "message": "[{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}]",
}
PLAN = json.dumps(
    {
        "pruning_recommendations": [
            {"layer": r"^vit\.layers\.\d+\.mlp\.fc1$", "pruning_type": "structured", "pruning_ratio": 0.3}
        ]
    }
)


class Answer(BaseModel):
    value: int


@pytest.fixture(scope="module")
def ctx() -> PlanningContext:
    return planning_context(tiny_vit(), 16, 1.0)


def _formats(server: FakeOpenAI) -> list[str]:
    return [(r.get("response_format") or {}).get("type", "none") for r in server.chat_requests]


def _settings(server: FakeOpenAI) -> LLMSettings:
    return LLMSettings(model="fake-model", base_url=server.base_url, timeout_s=5, max_retries=0)


def _refuse(refused: set[str], error: Any, answer: str) -> Any:
    def script(body: dict[str, Any]) -> Any:
        kind = (body.get("response_format") or {}).get("type", "none")
        return error if kind in refused else answer

    return script


def test_refusal_detection() -> None:
    assert refuses_format(500, "Input should be 'text' or 'json_object'")
    assert refuses_format(400, "response_format is not supported")
    assert refuses_format(422, "unknown field json_schema")
    assert not refuses_format(500, "CUDA out of memory")
    assert not refuses_format(None, "response_format")
    assert not refuses_format(200, "response_format")


def test_llama_cpp_500_moves_to_json_object_and_the_run_dir_remembers(tmp_path: Path, ctx: PlanningContext) -> None:
    log = JsonlExchangeLog(tmp_path / "llm" / "exchanges.jsonl")
    with FakeOpenAI(_refuse({"json_schema"}, LLAMA_CPP_500, PLAN)) as server:
        result = LLMPlanner(_settings(server), exchange_log=log).analyze(ctx)
        assert result.source == "llm"
        assert _formats(server) == ["json_schema", "json_object"]
        (exchange,) = log.read()
        assert exchange.ok and exchange.response_format == "json_object"
        assert exchange.refused_formats == ["json_schema"]
        assert any("refused response_format=json_schema (HTTP 500" in n for n in exchange.notes)
        assert any("json_object is used for this endpoint from now on" in n for n in exchange.notes)
        notes = result.planner_state["report_notes"]
        assert any("HTTP 500" in n and "response_format=json_object from then on" in n for n in notes)
        remembered = json.loads((tmp_path / "llm" / "response_format.json").read_text())
        key = endpoint_key(server.base_url, "fake-model")
        assert remembered["endpoints"][key]["response_format"] == "json_object"

        # a new planner on the same run dir (the next node, or a resume) asks with json_object at once
        result = LLMPlanner(_settings(server), exchange_log=log).next_plan(ctx)
        assert result.source == "llm"
        assert _formats(server) == ["json_schema", "json_object", "json_object"]
        second = log.read()[-1]
        assert second.refused_formats == [] and second.response_format == "json_object"
        assert any("learned earlier" in n for n in second.notes)


def test_a_server_refusing_both_formats_is_asked_without_one(ctx: PlanningContext) -> None:
    error = {"__status__": 400, "message": "response_format is not supported by this server"}
    with FakeOpenAI(_refuse({"json_schema", "json_object"}, error, PLAN)) as server:
        log: list[LLMExchange] = []
        planner = LLMPlanner(_settings(server), exchange_log=log)
        assert planner.analyze(ctx).source == "llm"
        assert planner.next_plan(ctx).source == "llm"
        assert _formats(server) == ["json_schema", "json_object", "none", "none"]
        assert log[0].refused_formats == ["json_schema", "json_object"] and log[0].response_format == "none"
        assert log[1].refused_formats == []


def test_a_plain_400_is_remembered_only_once_the_next_format_is_answered() -> None:
    memory = ResponseFormatMemory()
    with FakeOpenAI(_refuse({"json_schema"}, 422, '{"value": 1}')) as server:
        chat = make_chat_model(_settings(server))
        value, exchange = invoke_structured(
            chat, [{"role": "user", "content": "?"}], Answer, purpose="t", memory=memory
        )
        assert value == Answer(value=1) and exchange.refused_formats == ["json_schema"]
        assert memory.learned(endpoint_key(server.base_url, "fake-model")) == "json_object"
    # a 400 that is not about the format (here: every format fails alike) teaches nothing
    memory = ResponseFormatMemory()
    with FakeOpenAI(_refuse({"json_schema", "json_object", "none"}, 400, "")) as server:
        chat = make_chat_model(_settings(server))
        value, exchange = invoke_structured(
            chat, [{"role": "user", "content": "?"}], Answer, purpose="t", memory=memory
        )
        assert value is None and exchange.failure == "http" and exchange.http_status == 400
        assert len(server.chat_requests) == 3
        assert memory.learned(endpoint_key(server.base_url, "fake-model")) is None


def test_a_500_that_does_not_name_the_format_is_a_failure_not_a_refusal() -> None:
    memory = ResponseFormatMemory()
    with FakeOpenAI([{"__status__": 500, "message": "out of memory"}]) as server:
        chat = make_chat_model(_settings(server))
        value, exchange = invoke_structured(
            chat, [{"role": "user", "content": "?"}], Answer, purpose="t", memory=memory
        )
        assert value is None and exchange.failure == "http" and exchange.refused_formats == []
        assert _formats(server) == ["json_schema"]
        assert memory.learned(endpoint_key(server.base_url, "fake-model")) is None


def test_a_fixed_format_is_never_changed() -> None:
    with FakeOpenAI([LLAMA_CPP_500]) as server:
        chat = make_chat_model(_settings(server))
        value, exchange = invoke_structured(
            chat, [{"role": "user", "content": "?"}], Answer, purpose="t", response_format="json_schema"
        )
        assert value is None and exchange.failure == "http" and _formats(server) == ["json_schema"]


def test_an_unreadable_memory_file_is_learned_again(tmp_path: Path) -> None:
    path = tmp_path / "response_format.json"
    path.write_text("{not json")
    memory = ResponseFormatMemory(path)
    assert memory.learned("x m") is None and memory.start("x m", "auto") == ["json_schema", "json_object", "none"]
    assert memory.learn("x m", "json_object", "refused json_schema")
    assert not memory.learn("x m", "json_schema", "never back up")
    assert ResponseFormatMemory(path).start("x m", "auto") == ["json_object", "none"]
