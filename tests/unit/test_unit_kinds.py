"""Unit kinds on the CNN patterns users bring: mobile blocks (expand 1x1 -> depthwise -> project 1x1, with and
without squeeze-and-excitation), residual stages with a projection or a parameter-free padding shortcut, grouped
convolutions. Each is found as a unit, pruned with its coupled layers, repaired at its consumer, and saved/reloaded."""

from __future__ import annotations

import copy
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tools.artifacts.structure import apply_structure, describe_structure
from tools.compression.pruning import apply_pruning, prunable_layers
from tools.compression.recipes import PruningConfig
from tools.compression.recovery import RecoveryConfig, recover_
from tools.compression.sensitivity import measure_sensitivity
from tools.compression.shortcuts import ChannelSelect, channel_segments, find_channel_shortcuts
from tools.compression.units import UNIT_KINDS, prunable_units
from tools.schemas import PruningRecommendation
from tools.zoo.cifar_resnet import resnet20


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, max(4, channels // 4), 1)
        self.expand = nn.Conv2d(max(4, channels // 4), channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sigmoid(self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return x * scale


class MobileBlock(nn.Module):
    def __init__(self, channels: int, expand: int, se: bool) -> None:
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()
        )
        self.se = SqueezeExcite(hidden) if se else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.depthwise(self.expand(x))))


class TinyMobileNet(nn.Module):
    def __init__(self, se: bool) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(MobileBlock(16, 4, se), MobileBlock(16, 4, se))
        self.grouped = nn.Conv2d(16, 32, 3, padding=1, groups=4)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.grouped(self.blocks(self.stem(x)))).mean((2, 3)))


class LambdaLayer(nn.Module):
    """The padding shortcut as the widely copied CIFAR ResNet code writes it: a lambda."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)  # type: ignore[operator]


def _images(n: int = 32, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Models are built before :func:`_trained_like` runs: seed their random initialisation, whatever ran before."""
    torch.manual_seed(0)


def _trained_like(model: nn.Module) -> nn.Module:
    """Random weights with BatchNorm statistics of real inputs, so the outputs depend on every channel."""
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(_images(16))
    return model.eval()


@pytest.mark.parametrize("se", [False, True], ids=["mobile", "mobile-se"])
def test_mobile_blocks_are_units_pruned_with_their_depthwise_channels_and_repaired_at_the_project(se: bool) -> None:
    model = _trained_like(TinyMobileNet(se))
    images = _images()
    layers = prunable_layers(model, images[:1])
    units = {u.modules[0]: u for u in prunable_units(layers.model_dump())}
    block = units["blocks.0.expand.0"]
    assert (
        block.kind == "mobile_block"
        and UNIT_KINDS[block.pruning_type].removes_of(block) == "expanded (depthwise) channels"
    )
    assert "blocks.0.depthwise.0" in block.members
    assert ("blocks.0.se.expand" in block.members) == se  # the excitation's outputs gate the depthwise channels
    assert "grouped" in layers.grouped_convs
    pruned = copy.deepcopy(model)
    rec = PruningRecommendation(layer="^blocks\\.0\\.expand\\.0$", pruning_type="structured", pruning_ratio=0.5)
    report = apply_pruning(pruned, [rec], images[:1])
    assert pruned.blocks[0].depthwise[0].out_channels == pruned.blocks[0].depthwise[0].groups == 32
    consumers = report.consumers()
    assert "blocks.0.project.0" in consumers
    before = (pruned(images) - model(images)).pow(2).mean()
    recovery = recover_(pruned, model, images, consumers, RecoveryConfig())
    assert "blocks.0.project.0" in recovery.reconstructed
    assert recovery.skipped.get("blocks.0.depthwise.0", "grouped convolution") == "grouped convolution"
    with torch.no_grad():
        assert (pruned(images) - model(images)).pow(2).mean() < before


def test_mobile_block_sensitivity_measures_each_unit() -> None:
    model = _trained_like(TinyMobileNet(se=True))
    images = _images()
    units = [u for u in prunable_units(prunable_layers(model, images[:1]).model_dump()) if u.kind == "mobile_block"]
    profile = measure_sensitivity(model, images, units, ratios=(0.5,))
    assert not profile.skipped and {u.kind for u in profile.units} == {"mobile_block"}
    for unit in profile.units:
        point = unit.points[0]
        assert point.params_saved > 0 and 0 <= point.agreement <= 1 and point.kl >= 0


def _pad_lambda(planes: int) -> LambdaLayer:
    return LambdaLayer(lambda x: F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, planes // 4, planes // 4), "constant", 0))


@pytest.mark.parametrize("style", ["module", "lambda"])
def test_padding_shortcuts_become_prunable_residual_stages(style: str) -> None:
    model = resnet20()
    if style == "lambda":
        model.layer2[0].shortcut = _pad_lambda(32)
        model.layer3[0].shortcut = _pad_lambda(64)
    model = _trained_like(model)
    images = _images()
    assert set(find_channel_shortcuts(model, images[:1])) == {"layer2.0.shortcut", "layer3.0.shortcut"}
    layers = prunable_layers(model, images[:1])
    stages = [u for u in prunable_units(layers.model_dump()) if u.kind == "residual_stage"]
    assert [u.modules[0] for u in stages] == ["conv1", "layer2.0.conv2", "layer3.0.conv2"]
    assert "layer3.0.shortcut" in stages[2].members and not layers.blocked.keys() - {"linear"}
    assert type(model.layer2[0].shortcut).__name__ != "SelectionConv", "the analysed model is left as it was"

    pruned = copy.deepcopy(model)
    recs = [
        PruningRecommendation(layer="^conv1$", pruning_type="structured", pruning_ratio=0.25),
        PruningRecommendation(layer="^layer3\\.0\\.conv2$", pruning_type="structured", pruning_ratio=0.5),
    ]
    report = apply_pruning(pruned, recs, images[:1])
    assert report.params_after < 0.7 * report.params_before and not report.skipped
    assert isinstance(pruned.layer2[0].shortcut, ChannelSelect) and not list(pruned.layer2[0].shortcut.parameters())
    assert pruned.layer2[0].shortcut.in_channels == 12 and pruned.layer3[0].shortcut.out_channels == 32
    assert "layer3.0.shortcut" not in report.consumers()  # an exact selection needs no refit
    recover_(pruned, model, images, report.consumers(), RecoveryConfig())

    rebuilt = resnet20()
    if style == "lambda":
        rebuilt.layer2[0].shortcut = _pad_lambda(32)
        rebuilt.layer3[0].shortcut = _pad_lambda(64)
    apply_structure(rebuilt, describe_structure(pruned, model))
    rebuilt.load_state_dict(pruned.state_dict())
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(images), pruned(images))


def test_an_unpruned_stage_keeps_the_shortcut_exact() -> None:
    model = _trained_like(resnet20())
    pruned = copy.deepcopy(model)
    rec = PruningRecommendation(layer="^layer1\\.0\\.conv1$", pruning_type="structured", pruning_ratio=0.5)
    apply_pruning(pruned, [rec], _images(1))
    reference = copy.deepcopy(model)
    reference.layer1[0].conv1 = pruned.layer1[0].conv1
    reference.layer1[0].bn1 = pruned.layer1[0].bn1
    reference.layer1[0].conv2 = pruned.layer1[0].conv2
    with torch.no_grad():
        assert torch.allclose(pruned(_images()), reference(_images()), atol=1e-5)


def test_a_pruned_padding_shortcut_exports_to_onnx_and_runs_the_same(tmp_path: Path) -> None:
    from tools.deploy.onnxruntime.export import export_onnx
    from tools.deploy.onnxruntime.session import OrtModel

    model = _trained_like(resnet20())
    rec = PruningRecommendation(layer="^layer2\\.0\\.conv2$", pruning_type="structured", pruning_ratio=0.5)
    apply_pruning(model, [rec], _images(1))
    assert isinstance(model.layer3[0].shortcut, ChannelSelect) and model.layer3[0].shortcut.in_channels == 16
    path = export_onnx(model, _images(1), tmp_path / "model.onnx")
    deployed = OrtModel(path, threads=1)
    x = _images(4)
    with torch.no_grad():
        assert torch.allclose(deployed(x), model(x), atol=1e-4)
    # slices and pads, as the original's shortcut exports: no index computed and gathered per call
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "Pad" in ops and not ops & {"Gather", "Where", "Shape"}


def test_a_channel_select_computes_any_index_as_a_gather_of_the_same_channels() -> None:
    x = torch.randn(2, 6, 8, 8)
    for index in ([-1, -1, 0, 1, 2, -1], [0, -1, 1], [1, 0], [-1, -1], [3, -1, 0, -1, 2, -1, 1, -1, 5]):
        wanted = torch.tensor(index)
        expected = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, 0, 1)).index_select(1, torch.where(wanted < 0, 6, wanted))
        select = ChannelSelect(6, len(index), 2)
        select.load_state_dict({"index": wanted})  # as a saved model loads: the runs follow the loaded index
        assert torch.equal(select(x), expected), index
    assert channel_segments([-1, -1, 0, 1, 2, -1]) == [(0, 3, 2, 1)]
    assert channel_segments([3, -1, 0, -1, 2, -1, 1, -1, 5]) is None  # more runs than MAX_SEGMENTS: one gather


def test_ratios_are_what_rounding_leaves_in_whole_channel_blocks_and_only_narrow_layers_keep_fine_steps() -> None:
    from agents.planning.allocation import next_reachable
    from tools.compression.channels import channel_step
    from tools.compression.recipes import PruningConfig
    from tools.compression.units import reachable_ratio, unit_step
    from tools.schemas import SensitivityUnit

    # a CPU kernel computes channels in blocks of 8: 28 of 32 channels runs as 32, so counts stay whole blocks
    assert (channel_step(16, 8), channel_step(32, 8), channel_step(36, 8), channel_step(512, 8)) == (8, 8, 8, 8)
    assert (channel_step(12, 8), channel_step(8, 8), channel_step(4, 8)) == (1, 1, 1)  # narrower than two blocks
    assert channel_step(64, 0) == 0
    config = PruningConfig(round_to=8, head_round_to=8)
    unit16 = SensitivityUnit(pattern="^a$", pruning_type="structured", kind="channels", modules=["a"], size=16)
    unit16.step = unit_step(unit16, config)
    assert unit16.step == 8
    assert [reachable_ratio(unit16, r) for r in (0.1, 0.3, 0.9)] == [0.0, 0.5, 0.5]
    narrow = SensitivityUnit(pattern="^b$", pruning_type="structured", kind="channels", modules=["b"], size=12)
    narrow.step = unit_step(narrow, config)
    assert narrow.step == 1
    assert [reachable_ratio(narrow, r) for r in (0.02, 0.1, 0.3, 0.9)] == [0.0, 0.0833, 0.3333, 0.9167]
    assert next_reachable(narrow, 0.0, 0.1) == 0.0833 and next_reachable(narrow, 0.3333, -0.1) == 0.25
    heads = SensitivityUnit(pattern="^h$", pruning_type="head", kind="heads", modules=["h"], size=3)
    heads.step = unit_step(heads, config)
    assert [reachable_ratio(heads, r) for r in (0.1, 0.3, 0.9)] == [0.0, 0.3333, 0.6667]  # whole heads, one kept
    width = SensitivityUnit(pattern="^w$", pruning_type="head_dim", kind="head_width", modules=["w"], size=16)
    width.step = unit_step(width, config)
    assert [reachable_ratio(width, r) for r in (0.2, 0.3)] == [0.0, 0.5]  # widths stay multiples of 8


def test_the_sensitivity_profile_measures_reachable_ratios_once() -> None:
    from tools.compression.recipes import PruningConfig

    torch.manual_seed(0)
    model = resnet20().eval()
    images = torch.randn(8, 3, 32, 32)
    units = [
        u for u in prunable_units(prunable_layers(model, images[:1]).model_dump()) if u.modules == ["layer1.0.conv1"]
    ]
    profile = measure_sensitivity(model, images, units, ratios=(0.1, 0.2, 0.3, 0.9), pruning=PruningConfig(round_to=4))
    (unit,) = profile.units
    assert unit.size == 16 and unit.step == 4
    assert [p.ratio for p in unit.points] == [0.25, 0.75]  # 0.1 removes nothing; 0.2 and 0.3 the same 4 channels


class GroupedStage(nn.Module):
    """A 1x1 convolution feeding a grouped 3x3 one (RegNet's and ResNeXt's pattern), or a GroupNorm (BiT's)."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(3, 16, 1, bias=False)
        self.norm = nn.GroupNorm(4, 16) if norm else nn.Identity()
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.grouped(F.relu(self.norm(self.reduce(x)))).mean((2, 3)))


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_channels_feeding_a_grouped_convolution_go_at_the_same_positions_of_every_group(ratio: float) -> None:
    """Torch-Pruning slices every group of a grouped convolution by the first group's kept positions: channels chosen
    by one ranking over all groups mis-wired RegNet's grouped convolutions, silently (a sweep over unseen
    architectures). The pruned model must compute what the original does with the removed channels at zero."""
    original = GroupedStage().eval()
    with torch.no_grad():  # a ranking that differs from group to group
        original.reduce.weight.mul_(torch.linspace(0.2, 2.0, 16).roll(3)[:, None, None, None])
    pruned = copy.deepcopy(original)
    config = PruningConfig(importance="l2", round_to=0)
    report = apply_pruning(
        pruned,
        [PruningRecommendation(layer="reduce", pruning_type="structured", pruning_ratio=ratio)],
        _images(2),
        config,
    )
    assert report.applied and pruned.reduce.out_channels == 16 - round(16 * ratio)
    kept = [next(i for i in range(16) if torch.equal(row, original.reduce.weight[i])) for row in pruned.reduce.weight]
    per_group = [sorted(k % 4 for k in kept if k // 4 == g) for g in range(4)]
    assert all(positions == per_group[0] for positions in per_group)
    zeroed = copy.deepcopy(original)
    with torch.no_grad():
        zeroed.reduce.weight[[i for i in range(16) if i not in kept]] = 0.0
        torch.testing.assert_close(pruned(_images(4)), zeroed(_images(4)))


def test_a_groupnorm_keeps_equal_groups() -> None:
    """BiT normalises with GroupNorm(32): every 8-channel step broke it, and nothing was pruned."""
    model = GroupedStage(norm=True).eval()
    config = PruningConfig(importance="l2", round_to=0)
    report = apply_pruning(
        model, [PruningRecommendation(layer="reduce", pruning_type="structured", pruning_ratio=0.5)], _images(2), config
    )
    assert report.applied and model.norm.num_channels == 8 and model.norm.num_groups == 4
    assert model(_images(2)).shape == (2, 10)


def test_a_unit_nothing_could_prune_says_why() -> None:
    """The sensitivity profile said only "nothing was pruned at any ratio" and dropped pruning's reason."""
    model = GroupedStage(norm=True).eval()
    model.norm = nn.GroupNorm(16, 16)  # one channel per group: no count below 16 keeps the groups equal
    units = [u for u in prunable_units(prunable_layers(model, _images(1)).model_dump()) if u.modules == ["reduce"]]
    result = measure_sensitivity(model, _images(16), units, ratios=(0.25, 0.5))
    assert "removes no channel of 16" in result.skipped["^reduce$"]
