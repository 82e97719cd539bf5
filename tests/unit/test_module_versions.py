"""Module versions through every load: a safetensors file keeps none, and a module that refuses a state without
one (torchvision's MNASNet) must still load from the user's weights, from the run's original and from a pruned
artifact; a torch checkpoint's own versions are kept."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.helpers_torch import VersionedNet
from tools.artifacts.io import load_compressed
from tools.models.factory import build_factory_model, load_factory_original
from tools.models.specs import FactorySpec
from tools.schemas import InputShape, OptimizationPlan, PruningRecommendation
from tools.stages import ops

FACTORY = "tests.helpers_torch:versioned_net"
OPTIONS = {"labels": "a,b,c", "image_size": "8", "channels": 3}


def _weights(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    state = {k: v.clone() for k, v in VersionedNet().state_dict().items()}
    path = tmp_path / "weights.safetensors"
    save_file(state, str(path))
    return path, state


def test_safetensors_weights_load_into_a_module_that_wants_its_version(tmp_path: Path) -> None:
    path, state = _weights(tmp_path)
    loaded = build_factory_model(FactorySpec.from_options(FACTORY, weights=path, **OPTIONS))  # type: ignore[arg-type]
    assert torch.equal(loaded.model.state_dict()["mid.weight"], state["mid.weight"])
    assert loaded.model.block.versions_seen == [2]  # the model's own version, as the file keeps none


def test_a_torch_checkpoints_own_versions_are_kept(tmp_path: Path) -> None:
    model = VersionedNet()
    state = model.state_dict()
    state._metadata["block"]["version"] = 1  # type: ignore[attr-defined]  # saved by an older release
    torch.save(state, tmp_path / "old.pt")
    loaded = build_factory_model(FactorySpec.from_options(FACTORY, weights=tmp_path / "old.pt", **OPTIONS))  # type: ignore[arg-type]
    assert loaded.model.block.versions_seen == [1]


def test_a_wrapped_checkpoints_versions_follow_its_keys(tmp_path: Path) -> None:
    state = torch.nn.DataParallel(VersionedNet()).state_dict()  # keys and versions under "module."
    state._metadata["module.block"]["version"] = 1  # type: ignore[attr-defined]
    torch.save(state, tmp_path / "wrapped.pt")
    loaded = build_factory_model(FactorySpec.from_options(FACTORY, weights=tmp_path / "wrapped.pt", **OPTIONS))  # type: ignore[arg-type]
    assert loaded.model.block.versions_seen == [1]


def test_the_runs_original_and_a_pruned_artifact_load_again(tmp_path: Path) -> None:
    path, state = _weights(tmp_path)
    original = tmp_path / "original"
    options = FactorySpec.from_options(FACTORY, weights=path, **OPTIONS).model_dump(mode="json", exclude={"factory"})  # type: ignore[arg-type]
    ops.acquire(FACTORY, original, factory_options=options)
    again = load_factory_original(original)
    assert torch.equal(again.model.state_dict()["mid.weight"], state["mid.weight"])

    rec = PruningRecommendation(layer="^mid$", pruning_type="structured", pruning_ratio=0.5, justification="test")
    shape = InputShape(channels=3, height=8, width=8)
    pruned = tmp_path / "pruned"
    ops.prune(original, OptimizationPlan(pruning_recommendations=[rec]), shape, pruned)
    model = load_compressed(pruned)
    assert isinstance(model, torch.nn.Module)
    assert model(torch.randn(1, 3, 8, 8)).shape == (1, 3)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in VersionedNet().parameters())
