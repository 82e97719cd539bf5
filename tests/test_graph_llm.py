"""The whole graph with --planner llm against a scripted OpenAI-compatible server on loopback.

The LLM is asked for the input shape, the analysis plan and every iterative round; garbage, over-
aggressive plans, HTTP errors and timeouts never stop the run, the best model respects the budget and
the report lists what was rejected and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.planning.prompts import ANALYSIS_SYSTEM, INPUT_SHAPE_SYSTEM, ITERATION_SYSTEM
from graph.cli import main
from tests.fake_openai import Delay, FakeOpenAI
from tests.helpers import save_tiny, tiny_vit

HEADS = r"^vit\.layers\.\d+\.attention$"
FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"


def _plan(head_ratio: float, fc1_ratio: float, layer: str = FC1) -> str:
    return json.dumps(
        {
            "pruning_recommendations": [
                {"layer": HEADS, "pruning_type": "head", "pruning_ratio": head_ratio, "justification": "heads"},
                {"layer": layer, "pruning_type": "structured", "pruning_ratio": fc1_ratio, "justification": "mlp"},
            ],
            "quantization_recommendations": [{"layer": "all", "quantization_type": "dynamic", "dtype": "qint8"}],
        }
    )


class Script:
    """Answers by purpose: each purpose has its own queue of replies."""

    def __init__(self, shape: list[Any], analysis: list[Any], iteration: list[Any]) -> None:
        self.queues = {INPUT_SHAPE_SYSTEM: shape, ANALYSIS_SYSTEM: analysis, ITERATION_SYSTEM: iteration}

    def __call__(self, body: dict[str, Any]) -> Any:
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        for key, queue in self.queues.items():
            if system == key:
                return queue.pop(0) if queue else 500
        return 500


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _run(model_dir: Path, run_dir: Path, server: FakeOpenAI, iterations: int, *extra: str) -> dict[str, Any]:
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
        "fake-model",
        "--llm-timeout",
        "2",
        "--iterations",
        str(iterations),
        "--eval-samples",
        "40",
        "--no-progress",
        *extra,
    ]
    assert main(argv) == 0
    return json.loads((run_dir / "report.json").read_text())


def test_llm_plans_every_step(model_dir: Path, tmp_path: Path) -> None:
    script = Script(
        shape=['{"channels": 3, "height": 16, "width": 16}'],
        analysis=[f"Here is my plan:\n```json\n{_plan(0.25, 0.25)}\n```"],
        iteration=[_plan(0.5, 0.4)],
    )
    with FakeOpenAI(script) as server:
        # heads of 8 dimensions: narrowed only with --head-round-to 0
        report = _run(model_dir, tmp_path / "run", server, 1, "--max-accuracy-drop", "100", "--head-round-to", "0")
    assert report["model"]["input_shape"]["source"] == "llm"
    assert report["plan"]["source"] == "llm"
    assert [r["source"] for r in report["rounds"]] == ["llm", "llm"]
    assert report["rounds"][1]["plan"]["pruning_recommendations"][0]["pruning_ratio"] == 0.5
    exchanges = (tmp_path / "run" / "llm" / "exchanges.jsonl").read_text().splitlines()
    purposes = [json.loads(line)["purpose"] for line in exchanges]
    assert purposes == ["input_shape", "analysis", "iteration"]
    first = json.loads(exchanges[1])
    assert first["prompt"] and first["raw_response"] and first["parsed"] and first["token_usage"]
    # the LLM sees the run's recovery and the measured sensitivity of every unit (heads, head width and fc1)
    units = report["profile"]["sensitivity"]["units"]
    assert len(units) >= 3 and {u["pruning_type"] for u in units} == {"block", "head", "head_dim", "structured"}
    for exchange in map(json.loads, exchanges[1:]):
        prompt = exchange["prompt"][1]["content"]
        assert "recovery 'reconstruct' after every prune" in prompt and "Sensitivity, measured" in prompt
        assert sum(": agree " in line for line in prompt.splitlines()) == len(units)


def test_garbage_and_failures_never_stop_the_run(model_dir: Path, tmp_path: Path) -> None:
    script = Script(
        shape=['{"channels": 3, "height": 999999, "width": 1}'],  # implausible: the config shape is used
        analysis=["I cannot help with that.", _plan(0.25, 0.95), _plan(0.25, 0.25, layer="^classifier$")],
        iteration=[
            _plan(0.25, 0.25, layer=r"no\.such\.layer"),
            _plan(0.25, 0.3),  # repaired on the second attempt
            500,  # HTTP error: the rules planner takes over for this round
            Delay(5, _plan(0.5, 0.5)),  # timeout
        ],
    )
    with FakeOpenAI(script) as server:
        report = _run(model_dir, tmp_path / "run", server, 3, "--max-accuracy-drop", "1.0")
    assert report["model"]["input_shape"]["source"] != "llm"
    assert any("input shape" in note for note in report["notes"])
    assert report["plan"]["source"] == "rules-fallback"
    rejected = report["plan"]["planner_state"]["rejected"]
    assert len(rejected) == 3 and any("0.95" in " ".join(r["reasons"]) for r in rejected)
    assert any("classifier" in " ".join(r["reasons"]) for r in rejected)
    assert [r["source"] for r in report["rounds"]] == [
        "rules-fallback",
        "llm-repaired",
        "rules-fallback",
        "rules-fallback",
    ]
    # the best model is one of the evaluated rounds within the budget, or the original when none is
    pruned, rounds = report["pruned"], report["rounds"]
    within = [r for r in rounds if r["within_budget"]]
    assert (pruned["round"] is None) == (not within)
    assert pruned["round"] is None or pruned["round"] in {r["round"] for r in within}
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Planner decisions" in markdown and "rejected:" in markdown


def test_an_llm_that_never_plans_still_completes_the_run(model_dir: Path, tmp_path: Path) -> None:
    """Every answer is prose: each plan is the rules planner's, the run completes and the report says why;
    the small --llm-context-tokens shortens every prompt, which the notes say once."""
    with FakeOpenAI(lambda body: "I would prune the attention heads first.") as server:
        report = _run(model_dir, tmp_path / "run", server, 1, "--llm-max-attempts", "2", "--llm-context-tokens", "2000")
        prompts = [r["messages"] for r in server.chat_requests]
    assert report["plan"]["source"] == "rules-fallback"
    assert [r["source"] for r in report["rounds"]] == ["rules-fallback", "rules-fallback"]
    assert report["pruned"]["artifact"] and report["baseline"]["accuracy"] is not None
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Planner decisions" in markdown and "fallback because: no valid plan after 2 attempts" in markdown
    assert sum("shortened to fit --llm-context-tokens 2,000" in n for n in report["notes"]) == 1
    assert len(prompts) == 1 + 2 + 2  # input shape, then two attempts for the analysis and for the round
    assert all(sum(len(m["content"]) for m in messages) < 2000 * 3.5 for messages in prompts[1:])


def test_unreachable_endpoint_stops_at_once(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        "digits",
        "--run-dir",
        str(tmp_path / "run"),
        "--planner",
        "llm",
        "--llm-base-url",
        "http://127.0.0.1:9/v1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error:") and "127.0.0.1:9" in err
    assert not (tmp_path / "run").exists()


def test_compare_llms_writes_the_table(model_dir: Path, tmp_path: Path) -> None:
    def answer(body: dict[str, Any]) -> Any:
        system = next(m["content"] for m in body["messages"] if m["role"] == "system")
        if system == INPUT_SHAPE_SYSTEM:
            return '{"channels": 3, "height": 16, "width": 16}'
        return _plan(0.25, 0.25) if body["model"] == "small" else _plan(0.5, 0.5)

    with FakeOpenAI(answer) as server:
        argv = [
            "compare-llms",
            "--model",
            str(model_dir),
            "--dataset",
            "digits",
            "--out",
            str(tmp_path / "cmp"),
            "--llm",
            "small",
            "--llm",
            "large",
            "--llm-base-url",
            server.base_url,
            "--iterations",
            "1",
            "--eval-samples",
            "40",
            "--max-accuracy-drop",
            "100",
            "--no-progress",
        ]
        assert main(argv) == 0
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    rows = {row["llm"]: row for row in result["rows"]}
    assert set(rows) == {"small", "large"}
    assert rows["large"]["pruned_params"] < rows["small"]["pruned_params"] < rows["small"]["original_params"]
    assert "| small |" in (tmp_path / "cmp" / "compare.md").read_text()
