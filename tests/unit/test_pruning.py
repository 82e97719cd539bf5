"""tools.compression on tiny models with random weights: structured channel pruning and head pruning."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    DeiTConfig,
    DeiTForImageClassification,
    ResNetConfig,
    ResNetForImageClassification,
    SwinConfig,
    SwinForImageClassification,
    ViTConfig,
    ViTForImageClassification,
)

from tools.compression.importance import IMPORTANCE, get_importance
from tools.compression.pruning import apply_pruning, count_params, prunable_layers
from tools.compression.recipes import PruningConfig
from tools.compression.reports import PruneReport
from tools.schemas import PruningRecommendation

NUM_LABELS = 10


def rec(layer: str, ratio: float, kind: str = "structured") -> PruningRecommendation:
    return PruningRecommendation(layer=layer, pruning_type=kind, pruning_ratio=ratio)  # type: ignore[arg-type]


def vit() -> nn.Module:
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=NUM_LABELS,
    )
    return ViTForImageClassification(cfg).eval()


def deit() -> nn.Module:
    torch.manual_seed(0)
    cfg = DeiTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=NUM_LABELS,
    )
    return DeiTForImageClassification(cfg).eval()


def swin() -> nn.Module:
    torch.manual_seed(0)
    cfg = SwinConfig(
        image_size=32,
        patch_size=2,
        embed_dim=24,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=NUM_LABELS,
    )
    return SwinForImageClassification(cfg).eval()


def resnet(layer_type: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = ResNetConfig(
        depths=[1, 1],
        hidden_sizes=[16, 32],
        embedding_size=16,
        layer_type=layer_type,
        num_labels=NUM_LABELS,
    )
    return ResNetForImageClassification(cfg).eval()


class ResidualCNN(nn.Module):
    """stem -> [conv-bn-relu-conv-bn + identity] -> pool -> fc."""

    def __init__(self, width: int = 16, hidden: int = 30) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(width)
        self.conv1 = nn.Conv2d(width, hidden, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.conv2 = nn.Conv2d(hidden, width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, NUM_LABELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.fc(x.mean(dim=(2, 3)))


class HardcodedReshapeCNN(nn.Module):
    """conv2's channel count is baked into a reshape the dependency graph cannot adjust."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, NUM_LABELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(torch.relu(self.conv1(x)))
        return self.fc(x.reshape(x.shape[0], 16, -1).mean(-1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32)


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def check_runs(model: nn.Module, x: torch.Tensor, report: PruneReport) -> None:
    assert logits(model, x).shape == (x.shape[0], NUM_LABELS)
    assert report.params_after == count_params(model)


# ---------------------------------------------------------------------------------------------- API


def test_importance_registry_and_unknown_name() -> None:
    assert {"l1", "l2", "random"} <= set(IMPORTANCE)
    for name in IMPORTANCE:
        assert get_importance(name) is not None
    with pytest.raises(ValueError, match=r"unknown importance 'nope'; valid names: .*l1.*l2.*random"):
        get_importance("nope")
    with pytest.raises(ValueError, match="valid names"):
        apply_pruning(ResidualCNN(), [], torch.randn(1, 3, 8, 8), PruningConfig(importance="nope"))


def test_invalid_regex_is_a_value_error(x: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="invalid layer regex"):
        apply_pruning(ResidualCNN(), [rec("conv(", 0.5)], x)


def test_count_params_counts_shared_once() -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, lin)
    assert count_params(model) == 20


def test_prunable_layers_cnn(x: torch.Tensor) -> None:
    layers = prunable_layers(ResidualCNN(), x)
    assert layers.structured == ["stem", "conv1", "conv2"]
    assert "fc" in layers.blocked and "classifier" in layers.blocked["fc"]
    assert layers.heads == {}


def test_prunable_layers_vit(x: torch.Tensor) -> None:
    layers = prunable_layers(vit(), x)
    assert layers.structured == ["vit.layers.0.mlp.fc1", "vit.layers.1.mlp.fc1"]
    assert layers.heads == {"vit.layers.0.attention": 4, "vit.layers.1.attention": 4}
    assert "head" in layers.blocked["vit.layers.0.attention.q_proj"]
    assert "LayerNorm" in layers.blocked["vit.layers.0.mlp.fc2"]
    assert "classifier" in layers.blocked["classifier"]


def test_prunable_layers_resnet_classifier_is_blocked(x: torch.Tensor) -> None:
    layers = prunable_layers(resnet("bottleneck"), x)
    assert "classifier.1" in layers.blocked
    assert "resnet.encoder.stages.1.layers.0.layer.1.convolution" in layers.structured
    assert "resnet.embedder.embedder.convolution" in layers.structured


# ---------------------------------------------------------------------------------------- structured


def test_structured_cnn_residual(x: torch.Tensor) -> None:
    model = ResidualCNN()
    report = apply_pruning(model, [rec("conv1", 0.5), rec("stem", 0.25)], x)
    check_runs(model, x, report)
    assert report.params_after < report.params_before
    assert model.conv1.out_channels == 15 and model.bn1.num_features == 15 and model.conv2.in_channels == 15
    # stem's group is the residual stream: conv2's outputs, both BNs and fc's inputs follow.
    assert model.stem.out_channels == 12
    assert model.conv2.out_channels == 12 and model.bn2.num_features == 12 and model.fc.in_features == 12
    assert model.stem.in_channels == 3
    assert model.fc.out_features == NUM_LABELS
    assert [(a.pattern, a.modules, a.before, a.after) for a in report.applied] == [
        ("conv1", ["conv1"], 30, 15),
        ("stem", ["stem"], 16, 12),
    ]


def test_coupled_group_is_pruned_once(x: torch.Tensor) -> None:
    model = ResidualCNN()
    report = apply_pruning(model, [rec("stem|conv2", 0.5)], x)
    check_runs(model, x, report)
    assert model.stem.out_channels == 8  # not 4: conv2 shares stem's group
    assert report.applied[0].modules == ["stem"]
    assert any(s.target == "conv2" and "already pruned" in s.reason for s in report.skipped)


@pytest.mark.parametrize("layer_type", ["basic", "bottleneck"])
def test_structured_resnet_convs(layer_type: str, x: torch.Tensor) -> None:
    model = resnet(layer_type)
    before = logits(model, x).shape
    report = apply_pruning(model, [rec(r"encoder\.stages\.\d+\.layers\.\d+\.layer\.\d+\.convolution", 0.5)], x)
    check_runs(model, x, report)
    assert logits(model, x).shape == before
    assert report.params_after < report.params_before
    (applied,) = report.applied
    assert applied.after < applied.before
    first = model.resnet.encoder.stages[1].layers[0].layer[0]
    assert first.convolution.out_channels == (16 if layer_type == "basic" else 4)  # 32 -> 16, 8 -> 4
    assert first.normalization.num_features == first.convolution.out_channels
    assert model.classifier[1].out_features == NUM_LABELS


def test_classifier_never_loses_outputs(x: torch.Tensor) -> None:
    for model in (resnet("bottleneck"), ResidualCNN(), vit()):
        report = apply_pruning(model, [rec(".*", 0.9)], x)
        check_runs(model, x, report)
        head = model.fc if isinstance(model, ResidualCNN) else model.classifier
        head = head[1] if isinstance(head, nn.Sequential) else head
        assert head.out_features == NUM_LABELS
        assert any("classifier" in s.reason for s in report.skipped)


def test_keep_at_least_one_channel(x: torch.Tensor) -> None:
    model = ResidualCNN()
    report = apply_pruning(model, [rec("conv1", 0.99)], x)
    check_runs(model, x, report)
    assert model.conv1.out_channels == 1


def test_round_to(x: torch.Tensor) -> None:
    model = ResidualCNN(hidden=64)
    report = apply_pruning(model, [rec("conv1", 0.3)], x, PruningConfig(round_to=8))
    check_runs(model, x, report)
    assert model.conv1.out_channels == 48  # 64 - 19 = 45, rounded to a multiple of 8
    small = ResidualCNN(hidden=64)
    report = apply_pruning(small, [rec("conv1", 0.99)], x, PruningConfig(round_to=8))
    assert small.conv1.out_channels == 8  # at least round_to channels are kept
    two_blocks = ResidualCNN(hidden=16)  # 16 channels: 16 - 5 = 11 rounds to one block of 8 (12 runs as 16)
    report = apply_pruning(two_blocks, [rec("conv1", 0.3)], x, PruningConfig(round_to=8))
    check_runs(two_blocks, x, report)
    assert two_blocks.conv1.out_channels == 8
    narrow = ResidualCNN(hidden=12)  # narrower than two blocks: steps of an eighth (1), so 0.3 is not everything
    report = apply_pruning(narrow, [rec("conv1", 0.3)], x, PruningConfig(round_to=8))
    check_runs(narrow, x, report)
    assert narrow.conv1.out_channels == 8  # 12 - 4


def test_regex_matching_nothing(x: torch.Tensor) -> None:
    model = ResidualCNN()
    n = count_params(model)
    report = apply_pruning(model, [rec("does_not_exist", 0.5), rec("nothing", 0.5, "head")], x)
    assert report.applied == []
    assert [s.target for s in report.skipped] == ["does_not_exist", "nothing"]
    assert report.params_after == report.params_before == n == count_params(model)


def test_zero_ratio_prunes_nothing(x: torch.Tensor) -> None:
    model = ResidualCNN()
    report = apply_pruning(model, [rec("conv1", 0.0)], x)
    assert report.applied == [] and model.conv1.out_channels == 30
    assert "removes no channel" in report.skipped[0].reason


def _kept_rows(model: ResidualCNN, original: torch.Tensor) -> set[int]:
    w = model.conv1.weight.detach()
    return {int((original - row).abs().flatten(1).sum(1).argmin()) for row in w}


def test_l1_vs_random_choose_differently(x: torch.Tensor) -> None:
    base = ResidualCNN()
    with torch.no_grad():
        scale = torch.arange(1, 31, dtype=torch.float32).view(-1, 1, 1, 1) / 30
        base.conv1.weight.mul_(scale)  # channel i has an L1 norm growing with i
    original = base.conv1.weight.detach().clone()
    kept: dict[str, set[int]] = {}
    for importance in ("l1", "random"):
        model = ResidualCNN()
        model.load_state_dict(base.state_dict())
        apply_pruning(model, [rec("conv1", 0.5)], x, PruningConfig(importance=importance, seed=1))
        kept[importance] = _kept_rows(model, original)
    assert len(kept["l1"]) == 15
    assert kept["l1"] != kept["random"]
    assert len(kept["l1"] & set(range(15, 30))) >= 12  # mostly the large channels

    again = ResidualCNN()
    again.load_state_dict(base.state_dict())
    apply_pruning(again, [rec("conv1", 0.5)], x, PruningConfig(importance="random", seed=1))
    assert _kept_rows(again, original) == kept["random"]  # seeded


def test_frozen_parameters_stay_frozen(x: torch.Tensor) -> None:
    model = ResidualCNN().requires_grad_(False)
    report = apply_pruning(model, [rec("conv1", 0.5)], x)
    check_runs(model, x, report)
    assert model.conv1.out_channels == 15
    assert not any(p.requires_grad for p in model.parameters())


def test_broken_forward_is_rolled_back_per_module(x: torch.Tensor) -> None:
    model = HardcodedReshapeCNN()
    report = apply_pruning(model, [rec("conv", 0.5)], x)
    check_runs(model, x, report)
    assert model.conv1.out_channels == 4
    assert model.conv2.out_channels == 16 and model.fc.in_features == 16
    assert report.applied[0].modules == ["conv1"]
    (skip,) = [s for s in report.skipped if s.target == "conv2"]
    assert "forward" in skip.reason


def test_structured_vit_mlp_and_dict_inputs(x: torch.Tensor) -> None:
    model = vit()
    report = apply_pruning(model, [rec(r"mlp\.fc\d", 0.25)], {"pixel_values": x})
    check_runs(model, x, report)
    assert [a.modules for a in report.applied] == [["vit.layers.0.mlp.fc1", "vit.layers.1.mlp.fc1"]]
    assert model.vit.layers[0].mlp.fc1.out_features == 96 and model.vit.layers[0].mlp.fc2.in_features == 96
    assert model.vit.layers[0].mlp.fc2.out_features == 64
    assert {s.target for s in report.skipped} == {"vit.layers.0.mlp.fc2", "vit.layers.1.mlp.fc2"}


def test_swin_embedding_channels_skipped_mlp_pruned(x: torch.Tensor) -> None:
    model = swin()
    report = apply_pruning(
        model,
        [rec(r"patch_embeddings|downsample\.reduction", 0.5), rec(r"mlp\.fc1", 0.5)],
        x,
    )
    check_runs(model, x, report)
    skipped = {s.target: s.reason for s in report.skipped}
    assert "LayerNorm" in skipped["swin.embeddings.patch_embeddings.projection"]
    assert "LayerNorm" in skipped["swin.encoder.layers.0.downsample.reduction"]
    assert model.swin.embeddings.patch_embeddings.projection.out_channels == 24
    assert [a.pattern for a in report.applied] == [r"mlp\.fc1"]
    assert model.swin.encoder.layers[0].blocks[0].mlp.fc1.out_features == 48
    assert model.swin.encoder.layers[1].blocks[0].mlp.fc1.out_features == 96


# ---------------------------------------------------------------------------------------------- heads


@pytest.mark.parametrize("factory,prefix", [(vit, "vit"), (deit, "deit")])
def test_head_pruning_vit_deit(factory: type, prefix: str, x: torch.Tensor) -> None:
    model = factory()
    report = apply_pruning(model, [rec("attention", 0.5, "head")], x)
    check_runs(model, x, report)
    assert report.params_after < report.params_before
    (applied,) = report.applied
    assert applied.modules == [f"{prefix}.layers.0.attention", f"{prefix}.layers.1.attention"]
    assert (applied.before, applied.after) == (8, 4)
    for layer in getattr(model, prefix).layers:
        att = layer.attention
        assert att.num_attention_heads == 2
        assert att.q_proj.out_features == att.k_proj.out_features == att.v_proj.out_features == 32
        assert att.o_proj.in_features == 32 and att.o_proj.out_features == 64
    assert prunable_layers(model, x).heads == {
        f"{prefix}.layers.0.attention": 2,
        f"{prefix}.layers.1.attention": 2,
    }


def test_head_pruning_swin_slices_bias_table(x: torch.Tensor) -> None:
    model = swin()
    report = apply_pruning(model, [rec("attention", 0.5, "head")], x)
    check_runs(model, x, report)
    (applied,) = report.applied
    assert (applied.before, applied.after) == (6, 3)
    for stage, heads in zip(model.swin.encoder.layers, (1, 2), strict=True):
        att = stage.blocks[0].attention
        assert att.num_attention_heads == heads
        assert att.q_proj.out_features == heads * att.head_dim == att.o_proj.in_features
        assert att.relative_position_bias.relative_position_bias_table.shape[1] == heads


def test_head_regex_on_projection_and_single_layer(x: torch.Tensor) -> None:
    model = vit()
    report = apply_pruning(model, [rec(r"layers\.1\.attention\.q_proj", 0.25, "head")], x)
    check_runs(model, x, report)
    assert report.applied[0].modules == ["vit.layers.1.attention"]
    assert model.vit.layers[0].attention.num_attention_heads == 4
    assert model.vit.layers[1].attention.num_attention_heads == 3


def test_head_pruning_keeps_one_head_and_ranks_by_norm(x: torch.Tensor) -> None:
    model = vit()
    att = model.vit.layers[0].attention
    with torch.no_grad():
        for proj in (att.q_proj, att.k_proj, att.v_proj):
            proj.weight[16:32] *= 10  # head 1 is by far the largest
    kept_rows = att.q_proj.weight[16:32].detach().clone()
    report = apply_pruning(model, [rec(r"layers\.0\.attention", 0.9, "head")], x, PruningConfig(importance="l2"))
    check_runs(model, x, report)
    assert att.num_attention_heads == 1
    assert torch.equal(att.q_proj.weight, kept_rows)


def test_heads_then_structured_in_one_call(x: torch.Tensor) -> None:
    model = swin()
    report = apply_pruning(model, [rec("attention", 0.5, "head"), rec(r"fc1", 0.5), rec("classifier", 0.5)], x)
    check_runs(model, x, report)
    assert [a.pruning_type for a in report.applied] == ["head", "structured"]
    assert report.skipped[-1].target == "classifier"
