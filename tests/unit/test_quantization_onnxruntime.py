"""The onnxruntime quantization backend: ONNX Runtime quantizes the (pruned) model and deploys it as model.onnx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from langgraph.checkpoint.memory import InMemorySaver

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from graph import Context, build_graph
from graph.options import build_parser, context_from
from tests.helpers import save_tiny, tiny_vit
from tools.artifacts.io import deployed_file, is_complete, load_compressed, load_module, load_original, save_original
from tools.deploy.base import QuantizationError
from tools.deploy.config import QuantizationConfig
from tools.deploy.onnxruntime.graph import weighted_nodes
from tools.deploy.onnxruntime.session import OrtModel, onnx_baseline
from tools.deploy.registry import get_backend, quantize, resolve_backend_name
from tools.models.sources import acquire_model
from tools.schemas import InputShape, OptimizationPlan, PruningRecommendation, QuantizationRecommendation
from tools.stages import ops

SHAPE = InputShape(channels=3, height=16, width=16, source="test")
ALL = [QuantizationRecommendation(layer="all", dtype="qint8")]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run dir with the tiny ViT's original, a pruned copy, and both quantized by ONNX Runtime."""
    root = tmp_path_factory.mktemp("ort")
    original = save_original(acquire_model(str(save_tiny(tiny_vit(), root / "src", 16))), root / "original")
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(layer=r"attention$", pruning_type="head", pruning_ratio=0.5),
            PruningRecommendation(layer=r"mlp\.fc1$", pruning_type="structured", pruning_ratio=0.5),
        ]
    )
    ops.prune(original, plan, SHAPE, root / "pruned")
    for name, source in (("q-original", original), ("q-pruned", root / "pruned")):
        ops.quantize(source, original, ALL, root / name, QuantizationConfig(backend="onnxruntime"), shape=SHAPE)
    return {"root": root, "original": original, "pruned": root / "pruned"}


def _x(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def _logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.mark.parametrize("name", ["q-original", "q-pruned"])
def test_artifact_is_an_onnx_file_that_reloads_and_reproduces_its_outputs(run: dict[str, Path], name: str) -> None:
    out = run["root"] / name
    assert is_complete(out)
    assert sorted(p.name for p in out.iterdir()) == ["artifact.json", "model.onnx"]
    assert deployed_file(out) == out / "model.onnx"
    meta = json.loads((out / "artifact.json").read_text())
    assert meta["kind"] == "quantized" and meta["quantization"]["backend"] == "onnxruntime"
    source = run["original"] if name == "q-original" else run["pruned"]
    assert meta["recipe"]["source"] == str(source)
    float_model = load_module(source)
    assert sorted(meta["quantization"]["layers"]) == sorted(
        n for n, m in float_model.named_modules() if type(m) is torch.nn.Linear
    )
    assert not weighted_nodes(out / "model.onnx"), "every MatMul/Gemm weight is int8"
    model = load_compressed(out)
    assert isinstance(model, OrtModel) and not isinstance(model, torch.nn.Module)
    assert model.threads == torch.get_num_threads()
    x = _x()
    first = _logits(model, x)
    assert torch.equal(_logits(load_compressed(out), x), first)
    assert torch.allclose(first, _logits(float_model, x), atol=0.1)
    with pytest.raises(TypeError, match="not a torch module"):
        load_module(out)


def test_all_layers_match_onnx_runtimes_own_quantization_of_the_original(run: dict[str, Path]) -> None:
    model = load_original(run["original"]).model
    baseline = onnx_baseline(model, _x(1), run["root"] / "baseline", threads=1)
    x = _x()
    assert torch.equal(_logits(load_compressed(run["root"] / "q-original"), x), _logits(baseline.quantized_model(), x))


def test_evaluate_counts_the_float_source_and_the_onnx_file(run: dict[str, Path]) -> None:
    original, out = run["original"], run["root"] / "q-pruned"
    label_match = ops.match_dataset_labels(original, "digits", None, 40, 0)
    spec = ops.EvalSpec(dataset="digits", label_match=label_match, samples=40, batch_size=20, progress=False)
    metrics = ops.evaluate(out, original, SHAPE, spec)
    pruned = ops.evaluate(run["pruned"], original, SHAPE, spec)
    assert metrics.memory_mb == round((out / "model.onnx").stat().st_size / 1e6, 4)
    # (no size comparison: on a model this small, the graph's node names outweigh its weights)
    assert metrics.params == pruned.params and metrics.macs == pruned.macs
    assert metrics.accuracy is not None and metrics.samples == 40
    assert metrics.latency_s > 0 and metrics.throughput_ips > 0
    times = ops.compare_latency({"q": out, "p": run["pruned"]}, SHAPE, repeats=2)
    assert set(times) == {"q", "p"}


def test_regex_selection_and_float16(run: dict[str, Path]) -> None:
    recs = [
        QuantizationRecommendation(layer=r"mlp\.fc\d$", dtype="qint8"),
        QuantizationRecommendation(layer=r"classifier", dtype="float16"),
    ]
    out = run["root"] / "q-mlp"
    report = ops.quantize(
        run["original"], run["original"], recs, out, QuantizationConfig(backend="onnxruntime"), shape=SHAPE
    )
    assert sorted(report["layers"]) == [f"vit.layers.{i}.mlp.fc{j}" for i in (0, 1) for j in (1, 2)]
    assert any("float16" in note and "classifier" in note for note in report["notes"])
    still_float = weighted_nodes(out / "model.onnx")
    assert any("q_proj" in node for node in still_float) and any("classifier" in node for node in still_float)
    assert not any("fc1" in node or "fc2" in node for node in still_float)
    x = _x()
    assert torch.allclose(_logits(load_compressed(out), x), _logits(load_original(run["original"]).model, x), atol=0.1)


def test_in_memory_quantize_is_for_torch_backends_and_auto_picks_onnxruntime() -> None:
    with pytest.raises(QuantizationError, match="not in memory"):
        quantize(tiny_vit(), ALL, backend="onnxruntime")
    assert resolve_backend_name("auto") == "onnxruntime"
    assert get_backend("auto").name == "onnxruntime"
    assert get_backend("torch-ao-dynamic").deployed_file == "model.safetensors"


def test_auto_falls_back_to_the_default_backend_when_onnxruntime_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` to one quantize call: where ONNX Runtime's build fails, the default backend's is made instead, and
    its report says why; a backend named outright fails as it is."""
    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "src", 32)), original)
    shape = InputShape(channels=3, height=32, width=32)

    def fails(self: Any, build: Any) -> None:
        raise QuantizationError("export refused")

    monkeypatch.setattr(type(get_backend("onnxruntime")), "save", fails)
    report = ops.quantize(original, original, ALL, tmp_path / "q", QuantizationConfig(backend="auto"), shape=shape)
    assert report["backend"] == "torch-ao-dynamic"
    assert "onnxruntime failed (export refused); used torch-ao-dynamic" in report["notes"][-1]
    with pytest.raises(QuantizationError, match="export refused"):
        ops.quantize(original, original, ALL, tmp_path / "q2", QuantizationConfig(backend="onnxruntime"), shape=shape)


def test_cli_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROFILING_AGENT_QUANT_BACKEND", raising=False)  # the tests' default is not the product's
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--quant-backend", "onnxruntime"])
    assert context_from(args, "r").quant_backend == "onnxruntime"
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--deploy", "torch"])
    assert context_from(args, "r").quant_backend == "torch"
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r"])
    assert context_from(args, "r").quant_backend == "auto"  # the measured choice
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--quant-backend", "nope"])


def test_full_run_with_the_onnxruntime_backend(run: dict[str, Path], tmp_path: Path) -> None:
    ctx = Context(
        run_dir=str(tmp_path / "run"),
        iterations=1,
        eval_samples=40,
        batch_size=20,
        latency_repeats=3,
        progress=False,
        quant_backend="onnxruntime",
        max_accuracy_drop=100.0,
    )
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    model = str(run["root"] / "src")
    graph.invoke({"model": model, "dataset": "digits"}, config, context=ctx, durability="sync")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for key in ("quantized", "quantized_original"):
        entry = report[key]
        assert (Path(entry["artifact"]) / "model.onnx").is_file(), key
        assert entry["backend"] == "onnxruntime"
        assert entry["memory_mb"] == round((Path(entry["artifact"]) / "model.onnx").stat().st_size / 1e6, 4)
        assert entry["latency_s"] > 0 and entry["latency_measured"] == "interleaved"
        assert entry["params"] == report["pruned" if key == "quantized" else "baseline"]["params"]
    inventory = {a["path"] for a in report["artifacts"]}
    assert "models/quantized/model.onnx" in inventory


def test_the_quantizers_root_warnings_with_nothing_to_act_on_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """ONNX Runtime's static quantizer logged "Axis 1 is out-of-range for weight ..." about a hundred times on
    PoolFormer and BiT (a sweep over unseen architectures); other warnings still show."""
    import logging

    from tools.deploy.onnxruntime.quantize import _root_info_muted

    with caplog.at_level(logging.INFO), _root_info_muted():
        logging.warning("Axis 1 is out-of-range for weight 'norm/Constant_1_output_0' with rank 1")
        logging.warning("Please consider to run pre-processing before quantization.")
        logging.info("Quantization parameters for tensor x")
        logging.warning("something a user should read")
    assert [r.getMessage() for r in caplog.records] == ["something a user should read"]
