"""Artifacts carry their recipe hash: one is reused only for the same recipe, else rebuilt and noted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from langgraph.types import Command

from graph import Context
from graph.bench import _cached_run_dir
from graph.runner import checkpointed_graph, resume_run, start_run
from tests.helpers import save_tiny, tiny_vit
from tools.artifacts.hashes import prune_recipe_hash, quantize_recipe_hash, recipe_hash, stored_recipe_hash
from tools.artifacts.io import load_module
from tools.compression.distill import DistillConfig
from tools.compression.recipes import PruningConfig, RecoveryConfig
from tools.deploy.config import QuantizationConfig
from tools.deploy.export_form import plain_export
from tools.schemas import InputShape, OptimizationPlan, PruningRecommendation, QuantizationRecommendation
from tools.stages import ops
from tools.store.files import atomic_write_json, read_json

FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"
HEADS = r"^vit\.layers\.\d+\.attention$"
SHAPE = InputShape(channels=3, height=16, width=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


@pytest.fixture(scope="module")
def original(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "original"
    ops.acquire(str(model_dir), out)
    return out


def _plan(ratio: float, why: str = "test", layer: str = FC1) -> OptimizationPlan:
    rec = PruningRecommendation(layer=layer, pruning_type="structured", pruning_ratio=ratio, justification=why)
    return OptimizationPlan(pruning_recommendations=[rec])


# --- the hash -------------------------------------------------------------------------------------------------


def test_recipe_hash_is_canonical_json() -> None:
    recipe = {"plan": [{"layer": FC1, "ratio": 0.5}], "recovery": {"method": "bn", "ridge": 0.01}, "seed": 0}
    reordered = {"seed": 0, "recovery": {"ridge": 0.01, "method": "bn"}, "plan": [{"ratio": 0.5, "layer": FC1}]}
    assert recipe_hash(recipe) == recipe_hash(reordered) == recipe_hash(json.loads(json.dumps(reordered)))
    assert len(recipe_hash(recipe)) == 64 and recipe_hash({"shape": (3, 16, 16)}) == recipe_hash({"shape": [3, 16, 16]})
    assert recipe_hash(recipe) != recipe_hash({**recipe, "seed": 1})
    assert recipe_hash(recipe) != recipe_hash({**recipe, "plan": [{"layer": FC1, "ratio": 0.4}]})


def test_prune_recipe_hash_follows_what_changes_the_weights(original: Path) -> None:
    config, recovery = PruningConfig(), RecoveryConfig(method="reconstruct")
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))

    def key(plan: OptimizationPlan | None = None, **changes: Any) -> str:
        args: dict[str, Any] = {"config": config, "recovery": recovery, "calibration": (images, None), **changes}
        return prune_recipe_hash(original, plan or _plan(0.5), SHAPE, **args)

    base = key()
    # what does not change the model does not change the hash
    assert key(_plan(0.5, why="another justification")) == base
    assert key(config=PruningConfig(max_ratio=0.5)) == base  # the planner's bound, not how the plan is applied
    assert key(finetune=DistillConfig(steps=0)) == base  # no fine-tuning either way
    # what does, does
    changed = [
        key(_plan(0.4)),
        key(_plan(0.5, layer=HEADS)),
        key(recovery=RecoveryConfig(method="bn")),
        key(recovery=RecoveryConfig(method="reconstruct", ridge=0.1)),
        key(config=PruningConfig(importance="l1")),
        key(config=PruningConfig(seed=1)),
        key(calibration=(images + 1, None)),
        key(calibration=None),
        key(finetune=DistillConfig(steps=5)),
    ]
    assert len({base, *changed}) == len(changed) + 1, "each change gives its own hash"


# --- reuse in tools.stages.ops ---------------------------------------------------------------------------------------


def test_prune_reuses_only_an_artifact_of_the_same_recipe(original: Path, tmp_path: Path) -> None:
    out = tmp_path / "pruned"
    first = ops.prune(original, _plan(0.5), SHAPE, out)
    weights = out / "model.safetensors"
    built = weights.stat().st_mtime_ns
    assert first["rebuilt"] is None
    assert stored_recipe_hash(out) == prune_recipe_hash(
        original, _plan(0.5), SHAPE, PruningConfig(), RecoveryConfig(method="none")
    )

    again = ops.prune(original, _plan(0.5, why="reworded"), SHAPE, out)
    assert again["rebuilt"] is None and weights.stat().st_mtime_ns == built, "same recipe: reused"
    assert again["params_after"] == first["params_after"]

    changed = ops.prune(original, _plan(0.25), SHAPE, out)
    assert changed["rebuilt"] and "another recipe" in changed["rebuilt"]
    assert changed["params_after"] > first["params_after"], "the artifact is the new plan's"
    meta = read_json(out / "artifact.json")
    assert meta["recipe"]["plan"] == _plan(0.25).model_dump()
    assert sum(t.numel() for t in load_module(out).parameters()) == changed["params_after"]

    # an artifact written before recipes were hashed is never trusted
    atomic_write_json(out / "artifact.json", {**meta, "recipe_hash": None})
    legacy = ops.prune(original, _plan(0.25), SHAPE, out)
    assert legacy["rebuilt"] and "no recipe hash" in legacy["rebuilt"]
    assert stored_recipe_hash(out) is not None


def test_quantize_rebuilds_when_its_source_was_rebuilt(original: Path, tmp_path: Path) -> None:
    pruned, quantized = tmp_path / "pruned", tmp_path / "quantized"
    recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="all")]
    config = QuantizationConfig(backend="torch-ao-dynamic")
    ops.prune(original, _plan(0.5), SHAPE, pruned)
    assert ops.quantize(pruned, original, recs, quantized, config)["rebuilt"] is None
    mtime = (quantized / "artifact.json").stat().st_mtime_ns
    reworded = [r.model_copy(update={"justification": "reworded"}) for r in recs]
    assert ops.quantize(pruned, original, reworded, quantized, config)["rebuilt"] is None
    assert (quantized / "artifact.json").stat().st_mtime_ns == mtime, "same source and recipe: reused"

    ops.prune(original, _plan(0.25), SHAPE, pruned)  # the pruned model changes under the same path
    again = ops.quantize(pruned, original, recs, quantized, config)
    assert again["rebuilt"] and "another recipe" in again["rebuilt"]
    structure = read_json(quantized / "artifact.json")["structure"]
    assert structure == read_json(pruned / "artifact.json")["structure"], "quantized from the new pruned model"
    other = ops.quantize(pruned, original, [recs[0].model_copy(update={"layer": FC1})], quantized, config)
    assert other["rebuilt"], "other layers: rebuilt"


def test_an_export_built_in_another_form_is_rebuilt(original: Path, tmp_path: Path) -> None:
    # a run resumed from a version that exported models as they are must not reuse those exports
    out = tmp_path / "onnx"
    recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="all")]
    config = QuantizationConfig(backend="onnxruntime-fp32")
    with plain_export():
        assert ops.quantize(original, original, recs, out, config)["rebuilt"] is None
        assert ops.quantize(original, original, recs, out, config)["rebuilt"] is None, "same form: reused"
    again = ops.quantize(original, original, recs, out, config)
    assert again["rebuilt"] and "another recipe" in again["rebuilt"]


def test_an_int8_build_with_other_settings_is_rebuilt(original: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run resumed from a version whose int8 settings differed (NNCF's fast bias correction for CNNs) must not
    reuse its int8 builds: the settings are part of the recipe; a float backend's recipe has none."""
    import tools.deploy.cpu as cpu

    recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="all")]
    before = quantize_recipe_hash(original, recs, "openvino-int8", SHAPE, int8_target="vnni")
    float_before = quantize_recipe_hash(original, recs, "openvino", SHAPE)
    real = cpu.int8_settings
    monkeypatch.setattr(
        cpu, "int8_settings", lambda *a, **k: real(*a, **k).model_copy(update={"fast_bias_correction_cnn": True})
    )
    assert quantize_recipe_hash(original, recs, "openvino-int8", SHAPE, int8_target="vnni") != before
    assert quantize_recipe_hash(original, recs, "openvino", SHAPE) == float_before


def test_what_builds_nothing_is_not_in_the_recipe(original: Path) -> None:
    """The original's int8 built for the int8 profile (its plan's "every layer, dynamic") is the deployed runtime's
    int8 of the original later (the analysis plan's "every layer, static", another justification): one build. A
    float backend's build does not depend on the recommendations at all; an int8 one on their layers and dtypes."""
    early = [QuantizationRecommendation(layer="all", quantization_type="dynamic", dtype="qint8", justification="a")]
    later = [QuantizationRecommendation(layer="all", quantization_type="static", dtype="qint8", justification="b")]
    for backend in ("openvino-int8", "onnxruntime-static", "openvino", "onnxruntime-fp32", "openvino-bf16"):
        assert quantize_recipe_hash(original, early, backend, SHAPE) == quantize_recipe_hash(
            original, later, backend, SHAPE
        ), backend
    fc1_float = [*later, QuantizationRecommendation(layer=FC1, dtype="float32")]
    images = torch.randn(4, *SHAPE.as_tuple())
    assert quantize_recipe_hash(original, fc1_float, "openvino", SHAPE, images) == quantize_recipe_hash(
        original, later, "openvino", SHAPE
    )
    assert quantize_recipe_hash(original, fc1_float, "onnxruntime-static", SHAPE) != quantize_recipe_hash(
        original, later, "onnxruntime-static", SHAPE
    )


# --- a resumed run whose plan changed -------------------------------------------------------------------------


def test_resume_with_an_edited_plan_rebuilds_the_round_and_notes_it(model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ctx = Context(
        run_dir=str(run_dir),
        iterations=0,
        eval_samples=30,
        latency_repeats=2,
        progress=False,
        approve_plan=True,
        max_accuracy_drop=100.0,
    )
    paused = start_run(str(model_dir), dataset="digits", ctx=ctx)
    assert paused.pending is not None and paused.pending["stage"] == "analysis"
    done = resume_run(run_dir, answer={"action": "approve"})
    assert done.report is not None and done.report["rounds"][0]["source"] == "rules"
    artifact = run_dir / "rounds" / "round-00" / "model"
    planned_params = done.report["rounds"][0]["metrics"]["params"]
    planned_hash = stored_recipe_hash(artifact)

    # back to the pause before round 0 (a fork of that checkpoint, as LangGraph Studio makes), resumed with an edit
    edited = {
        "pruning_recommendations": [
            {"layer": FC1, "pruning_type": "structured", "pruning_ratio": 0.25, "justification": "mine"}
        ]
    }
    saved = read_json(run_dir / "settings.json")
    with checkpointed_graph(run_dir) as graph:
        config = {"configurable": {"thread_id": saved["thread_id"]}}
        before_round = next(s for s in graph.get_state_history(config) if s.next == ("review_plan",))
        fork = graph.update_state(before_round.config, None, as_node="__copy__")
        graph.invoke(Command(resume={"action": "edit", "plan": edited}), fork, context=ctx, durability="sync")
    report = json.loads((run_dir / "report.json").read_text())
    round0 = report["rounds"][0]
    assert round0["source"] == "human" and round0["plan"]["pruning_recommendations"][0]["pruning_ratio"] == 0.25
    assert stored_recipe_hash(artifact) != planned_hash, "the round's model was rebuilt"
    assert (
        read_json(artifact / "artifact.json")["recipe"]["plan"] == OptimizationPlan.model_validate(edited).model_dump()
    )
    assert round0["metrics"]["params"] != planned_params, "the round's metrics are the edited plan's model"
    assert round0["prune_report"]["rebuilt"]
    notes = report["notes"]
    assert any(n.startswith("round 0: ") and "rebuilt the pruned model" in n for n in notes), notes
    assert any(n.startswith("deployment: ") and n.endswith(": rebuilt") for n in notes), notes


# --- bench ----------------------------------------------------------------------------------------------------


def test_bench_reuses_a_run_only_with_the_same_settings(tmp_path: Path) -> None:
    plain = tmp_path / "runs" / "model"
    inputs = {"model": "m", "dataset": "digits", "dataset_split": None, "model_options": None}
    ctx = Context(eval_samples=300, progress=False)
    assert _cached_run_dir(plain, inputs, ctx) == plain, "nothing there yet"
    plain.mkdir(parents=True)
    stored = {"model": "m", "dataset": "digits", "dataset_split": None}
    atomic_write_json(
        plain / "settings.json",
        {"thread_id": "t", "input": stored, "context": replace(ctx, run_dir=str(plain), progress=True).to_dict()},
    )
    assert _cached_run_dir(plain, inputs, ctx) == plain, "same settings (run dir and progress bars aside): reused"
    other = _cached_run_dir(plain, inputs, replace(ctx, eval_samples=1000))
    assert other != plain and other.parent == plain.parent and other.name.startswith("model-")
    assert _cached_run_dir(plain, {**inputs, "dataset": "other"}, ctx) != plain
