from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import save_tiny, tiny_resnet, tiny_vit
from tools.artifacts.io import is_complete, load_compressed, load_original, save_compressed, save_original
from tools.compression.pruning import apply_pruning
from tools.deploy.registry import quantize
from tools.models.sources import acquire_model
from tools.schemas import PruningRecommendation, QuantizationRecommendation
from tools.store.files import atomic_write_json


@pytest.fixture()
def vit_original(tmp_path: Path) -> Path:
    src = save_tiny(tiny_vit(), tmp_path / "src", 16)
    return save_original(acquire_model(str(src)), tmp_path / "run" / "original")


def test_atomic_json_leaves_no_temporary_files(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_original_is_saved_once_and_reloads(vit_original: Path) -> None:
    assert is_complete(vit_original)
    before = (vit_original / "model.safetensors").stat().st_mtime
    save_original(load_original(vit_original), vit_original)
    assert (vit_original / "model.safetensors").stat().st_mtime == before


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_pruned_vit_reloads_with_identical_outputs(vit_original: Path, tmp_path: Path) -> None:
    model = load_original(vit_original).model
    recs = [
        PruningRecommendation(layer=r"attention$", pruning_type="head", pruning_ratio=0.5),
        PruningRecommendation(layer=r"mlp\.fc1$", pruning_type="structured", pruning_ratio=0.5),
    ]
    report = apply_pruning(model, recs, _x())
    assert report.params_after < report.params_before
    out = save_compressed(model, tmp_path / "pruned", base_dir=vit_original, kind="pruned", recipe={})
    meta = json.loads((out / "artifact.json").read_text())
    assert meta["structure"], "the pruned structure is described next to the weights"
    reloaded = load_compressed(out)
    with torch.inference_mode():
        assert torch.equal(reloaded(_x()).logits, model(_x()).logits)


def test_pruned_then_quantized_reloads_as_deployed(vit_original: Path, tmp_path: Path) -> None:
    model = load_original(vit_original).model
    apply_pruning(
        model,
        [PruningRecommendation(layer=r"mlp\.fc1$", pruning_type="structured", pruning_ratio=0.25)],
        _x(),
    )
    qmodel, report = quantize(model, [QuantizationRecommendation(layer="all")])
    out = save_compressed(
        qmodel,
        tmp_path / "q",
        base_dir=vit_original,
        kind="quantized",
        recipe={},
        quant_report=report,
        float_model=model,
    )
    reloaded = load_compressed(out)
    with torch.inference_mode():
        assert torch.equal(reloaded(_x()).logits, qmodel(_x()).logits)
    float_size = sum(p.numel() * 4 for p in model.parameters())
    assert (out / "model.safetensors").stat().st_size < 0.5 * float_size
    # latency is measured where the artifact runs: int8 kernels on the CPU whatever --device says; float models on
    # the run's device (and a CUDA device that is not there is a clear error, not a silent CPU figure)
    from tools.models.base import ModelLoadError
    from tools.stages.ops import latency_device

    assert latency_device(out, "cuda") == "cpu"
    assert latency_device(vit_original, "cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            latency_device(vit_original, "cuda")


def test_pruned_resnet_reloads(tmp_path: Path) -> None:
    src = save_tiny(tiny_resnet(), tmp_path / "src", 32)
    original = save_original(acquire_model(str(src)), tmp_path / "original")
    model = load_original(original).model
    x = torch.randn(1, 3, 32, 32)
    report = apply_pruning(
        model, [PruningRecommendation(layer=r"convolution$", pruning_type="structured", pruning_ratio=0.5)], x
    )
    assert report.applied
    out = save_compressed(model, tmp_path / "pruned", base_dir=original, kind="pruned", recipe={})
    with torch.inference_mode():
        assert torch.equal(load_compressed(out)(x).logits, model(x).logits)


def test_incomplete_artifact_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a complete model artifact"):
        load_compressed(tmp_path)
