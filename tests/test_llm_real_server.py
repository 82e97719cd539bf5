"""The LLM planner against a real OpenAI-compatible server: llama-cpp-python's, on 127.0.0.1.

That server refuses ``response_format`` ``json_schema`` with HTTP 500 (``Input should be 'text' or
'json_object'``), the failure that once sent every round of a run to the rules planner. Here the first
refusal is the last: the request is asked again with ``json_object``, every later request (of this run
and of a resume) is sent with ``json_object`` at once, and each reaches the model, whose answer (``{}``,
a valid JSON object and never a valid plan; see :mod:`tests.llama_server`) is in the exchange log. A run
whose LLM never writes a valid plan still completes, and its report says why each plan is the rules
planner's.

Skipped unless the optional ``llm-server`` extra is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.planning.base import PlanningContext
from agents.planning.llm_planner import JsonlExchangeLog, LLMPlanner
from graph.cli import main
from tests.helpers import planning_context, save_tiny, tiny_vit
from tests.llama_server import MODEL_ALIAS, LlamaCppServer, llama_server
from tools.llm.client import LLMSettings, check_endpoint
from tools.llm.response_format import endpoint_key
from tools.llm.structured import LLMExchange

REFUSAL = "Input should be 'text' or 'json_object'"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    with llama_server(tmp_path_factory.mktemp("llama")) as started:
        yield started


def _settings(server: LlamaCppServer) -> LLMSettings:
    return LLMSettings(model=MODEL_ALIAS, base_url=server.base_url, timeout_s=60, max_retries=0)


def _reached_the_model(exchange: LLMExchange) -> bool:
    return exchange.raw_response == "{}" and exchange.token_usage.get("output_tokens", 0) > 0


def test_the_refused_format_is_asked_once_and_every_request_reaches_the_model(
    server: LlamaCppServer, tmp_path: Path
) -> None:
    ctx: PlanningContext = planning_context(tiny_vit(), 16, 1.0)
    check_endpoint(_settings(server))
    log = JsonlExchangeLog(tmp_path / "llm" / "exchanges.jsonl")
    result = LLMPlanner(_settings(server), exchange_log=log, max_attempts=2).analyze(ctx)
    assert result.source == "rules-fallback"  # "{}" is never a valid plan
    assert result.planner_state["fallback_reason"] == "no valid plan after 2 attempts"
    first, second = log.read()
    assert first.refused_formats == ["json_schema"] and first.response_format == "json_object"
    assert any("HTTP 500" in n and REFUSAL in n for n in first.notes), first.notes
    assert second.refused_formats == [] and second.response_format == "json_object"
    assert _reached_the_model(first) and _reached_the_model(second), server.log_tail()
    assert first.failure == second.failure == "validation"  # the answer parsed; the plan had no pruning
    assert any(REFUSAL in note for note in result.planner_state["report_notes"])
    memory = json.loads((tmp_path / "llm" / "response_format.json").read_text())
    assert memory["endpoints"][endpoint_key(server.base_url, MODEL_ALIAS)]["response_format"] == "json_object"

    # a resume, or the next round, builds a new planner on the same run dir: no refusal any more
    LLMPlanner(_settings(server), exchange_log=log, max_attempts=1).next_plan(ctx)
    third = log.read()[-1]
    assert third.purpose == "iteration" and third.refused_formats == [] and third.response_format == "json_object"
    assert _reached_the_model(third)


def test_a_run_whose_llm_never_plans_completes_and_says_so(server: LlamaCppServer, tmp_path: Path) -> None:
    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        "digits",
        "--run-dir",
        str(run_dir),
        "--planner",
        "llm",
        "--llm-base-url",
        server.base_url,
        "--llm-model",
        MODEL_ALIAS,
        "--llm-max-attempts",
        "2",
        "--llm-context-tokens",
        "2000",
        "--iterations",
        "1",
        "--eval-samples",
        "40",
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["plan"]["source"] == "rules-fallback"
    assert [r["source"] for r in report["rounds"]] == ["rules-fallback", "rules-fallback"]
    markdown = (run_dir / "report.md").read_text()
    # the analysis, round 0 (the analysis plan) and round 1 each say why the plan is the rules planner's
    assert markdown.count("fallback because: no valid plan after 2 attempts") == 3
    notes = report["notes"]
    assert sum(REFUSAL in n for n in notes) == 1, notes  # said once, not every round
    assert sum("shortened to fit --llm-context-tokens 2,000" in n for n in notes) == 1, notes

    exchanges = JsonlExchangeLog(run_dir / "llm" / "exchanges.jsonl").read()
    assert [e.purpose for e in exchanges] == ["input_shape"] + ["analysis"] * 2 + ["iteration"] * 2
    assert exchanges[0].refused_formats == ["json_schema"]
    assert all(e.refused_formats == [] and e.response_format == "json_object" for e in exchanges[1:])
    assert all(_reached_the_model(e) for e in exchanges), server.log_tail()
    assert all(e.estimated_prompt_tokens <= 2000 for e in exchanges[1:])
