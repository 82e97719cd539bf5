"""benchmarks/block_removal.py: which blocks can be replaced by the identity, and the copy that replaces them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tools.zoo.cifar_resnet import resnet20

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def block_removal() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import their shared helpers as top-level modules
    try:
        return importlib.import_module("block_removal")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_same_shape_blocks_are_the_identity_shortcut_blocks(block_removal: ModuleType) -> None:
    model = resnet20().eval()
    blocks = block_removal.same_shape_blocks(model, torch.randn(1, 3, 32, 32))
    # the first blocks of stages 2 and 3 halve the resolution and widen the channels: not removable
    assert blocks == ["layer1.0", "layer1.1", "layer1.2", "layer2.1", "layer2.2", "layer3.1", "layer3.2"]


def test_without_replaces_only_the_named_blocks_in_a_copy(block_removal: ModuleType) -> None:
    torch.manual_seed(0)
    model = resnet20().eval()
    x = torch.randn(2, 3, 32, 32)
    cut = block_removal.without(model, ["layer2.2", "layer1.0"])
    skipped = block_removal.SkippedBlock
    assert isinstance(cut.layer2[2], skipped) and isinstance(cut.layer1[0], skipped)
    assert not isinstance(model.layer2[2], skipped)  # the original is untouched
    with torch.no_grad():
        hidden = torch.relu(model.bn1(model.conv1(x)))
        assert torch.equal(cut.layer1(hidden), model.layer1[2](model.layer1[1](hidden)))
        assert cut(x).shape == model(x).shape
        assert not torch.allclose(cut(x), model(x))


def test_least_damaging_skips_blocks_nested_in_one_taken(block_removal: ModuleType) -> None:
    order = ["stage.0.block.1", "stage.0", "stage.1.block.0", "stage.0.block.0", "stage.1"]
    assert block_removal.least_damaging(order, 2) == ["stage.0.block.1", "stage.1.block.0"]
    assert block_removal.least_damaging(order, 3) == ["stage.0.block.1", "stage.1.block.0", "stage.0.block.0"]
    assert block_removal.least_damaging(order, 9) == ["stage.0.block.1", "stage.1.block.0", "stage.0.block.0"]
