"""Full-graph runs on a tiny model: every node, the pruning loop, selection, quantization, report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from graph import Context, build_graph
from graph.builder import NODES
from tests.helpers import save_tiny, tiny_vit

REPORT_KEYS = {"model", "dataset", "baseline", "pruned", "quantized", "quantized_original", "rounds", "plan"}
METRIC_KEYS = {"accuracy", "params", "macs", "latency_s", "memory_mb", "artifact"}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _run(model: str, run_dir: Path, **settings: Any) -> dict[str, Any]:
    ctx = Context(run_dir=str(run_dir), eval_samples=40, batch_size=20, latency_repeats=3, progress=False, **settings)
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    out = graph.invoke({"model": model, "dataset": "digits"}, config, context=ctx, durability="sync")
    assert out["report_path"] == str(run_dir / "report.json")
    return json.loads((run_dir / "report.json").read_text())


def test_node_ids_are_the_papers_agents() -> None:
    graph = build_graph().compile()
    names = set(graph.get_graph().nodes)
    for node in (
        "acquire_model",
        "resolve_input_shape",
        "profile_model",
        "analyze_profile",
        "prune_model",
        "evaluate_model",
        "iterate_pruning",
        "quantize_model",
    ):
        assert node in names
    assert set(NODES) <= names


def test_full_run_prunes_iterates_and_quantizes(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _run(
        str(tiny_model_dir), tmp_path / "run", iterations=2, max_accuracy_drop=100.0, quant_backend="torch-ao-dynamic"
    )
    assert set(report) >= REPORT_KEYS
    for key in ("baseline", "pruned", "quantized", "quantized_original"):
        assert set(report[key]) >= METRIC_KEYS, key
        assert Path(report[key]["artifact"]).is_dir()
    assert len(report["rounds"]) == 3
    assert {r["source"] for r in report["rounds"]} == {"rules"}
    assert report["pruned"]["params"] < report["baseline"]["params"]
    assert report["quantized"]["memory_mb"] < 0.5 * report["baseline"]["memory_mb"]
    assert 0.0 <= report["baseline"]["accuracy"] <= 1.0
    assert report["plan"]["pruning_recommendations"] and report["plan"]["quantization_recommendations"]
    plans = [json.dumps(r["plan"]["pruning_recommendations"], sort_keys=True) for r in report["rounds"]]
    assert len(set(plans)) == len(plans), "each round writes a new plan"
    assert (tmp_path / "run" / "report.md").read_text().startswith("# ProfilingAgent report")
    assert (tmp_path / "run" / "profile" / "profile.json").is_file()
    assert (tmp_path / "run" / "profile" / "trace.json").is_file()


def test_auto_deployment_measures_every_runtime_and_never_deploys_a_slower_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    report = _run(str(tiny_model_dir), tmp_path / "run", iterations=1, max_accuracy_drop=100.0, quant_backend="auto")
    deployment = report["deployment"]
    candidates = {c["backend"]: c for c in deployment["candidates"]}
    assert {"torch", "torch-ao-dynamic", "onnxruntime"} <= set(candidates)
    assert all(c["error"] is None for c in candidates.values()), candidates
    chosen = candidates[deployment["chosen"]]
    assert report["quantized"]["backend"] == deployment["chosen"]
    assert report["quantized"]["runtime"] == chosen["runtime"] and report["quantized"]["precision"]
    ran = [c for c in candidates.values() if c["within_budget"]]
    assert chosen["latency_s"] == min(c["latency_s"] for c in ran) or deployment["chosen"] == "torch"
    if deployment["chosen"] != "torch":
        assert chosen["latency_s"] < deployment["original_latency_s"]
    assert "## Deployment: runtimes measured side by side" in (tmp_path / "run" / "report.md").read_text()
    assert 'id="deployment"' in (tmp_path / "run" / "report.html").read_text()
    # the deployed artifact reloads and runs on its own runtime
    from tools.predict import original_of

    assert original_of(Path(report["quantized"]["artifact"])) == Path(report["baseline"]["artifact"]).resolve()
    import numpy as np
    from PIL import Image

    from graph.cli import main
    from tools.predict import predict

    image = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(0).random((16, 16)) * 255).astype(np.uint8)).save(image)
    for artifact in {report["quantized"]["artifact"], report["quantized_original"]["artifact"]}:
        (result,) = predict(Path(artifact), [image], top_k=3)
        assert len(result.top) == 3 and 0 < sum(p for _, p in result.top) <= 1.0 + 1e-6
        assert main(["predict", "--artifact", artifact, str(image), "--top-k", "2"]) == 0


def test_switches_skip_stages(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _run(str(tiny_model_dir), tmp_path / "run", prune=False)
    assert report["rounds"] == [] and report["pruned"] is None
    assert report["quantized"]["artifact"] == report["quantized_original"]["artifact"]
    report = _run(str(tiny_model_dir), tmp_path / "run2", iterate=False, quantize=False)
    assert len(report["rounds"]) == 1
    assert report["quantized"] is None


def test_budget_is_never_exceeded(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _run(str(tiny_model_dir), tmp_path / "run", iterations=1, max_accuracy_drop=0.0)
    pruned = report["pruned"]
    if pruned["within_budget"]:
        assert pruned["accuracy"] >= report["baseline"]["accuracy"]
    else:
        assert pruned["params"] == report["baseline"]["params"]
        assert any("budget" in note for note in report["notes"])
