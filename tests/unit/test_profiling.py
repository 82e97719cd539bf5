"""Unit tests of tools.profiling on tiny in-memory models (random weights, CPU)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tools.profiling.dynamic import module_latencies, operator_profile
from tools.profiling.modules import layer_names
from tools.profiling.profile import group_layers, profile_model
from tools.profiling.static import static_profile
from tools.schemas import LayerProfile, ModelProfile

IMAGE = 32


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.act = nn.ReLU()  # called twice per forward
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).flatten(1)
        return self.fc2(self.act(self.fc1(self.act(x))))


def _tiny_vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=IMAGE,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    config.num_labels = 10
    return ViTForImageClassification(config).eval()


def _tiny_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16)
    config.num_labels = 10
    return ResNetForImageClassification(config).eval()


def _tiny_swin() -> nn.Module:
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    config.num_labels = 10
    return SwinForImageClassification(config).eval()


BUILDERS = {"cnn": lambda: TinyCNN().eval(), "vit": _tiny_vit, "resnet": _tiny_resnet}


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {name: build() for name, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(1, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def vit_profile(models: dict[str, nn.Module], x: torch.Tensor, tmp_path_factory: pytest.TempPathFactory) -> Any:
    trace = tmp_path_factory.mktemp("trace") / "sub" / "trace.json"
    return profile_model(models["vit"], x, family="vit", warmup=1, iters=2, trace_path=trace), trace


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def _state(model: nn.Module) -> dict[str, tuple[Any, ...]]:
    """Attributes, hooks and mode of every module, to compare before/after profiling."""
    hook_attrs = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_backward_hooks")
    return {
        name: (
            sorted(m.__dict__),
            tuple(len(getattr(m, a)) for a in hook_attrs),
            m.training,
        )
        for name, m in model.named_modules()
    }


def _assert_clean(model: nn.Module) -> None:
    for name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, name
        leftovers = [k for k in module.__dict__ if "flops" in k or "batch_counter" in k or k.startswith("__")]
        assert not leftovers, (name, leftovers)


# ---------------------------------------------------------------------------------------- static


@pytest.mark.parametrize("name", list(BUILDERS))
def test_static_totals(models: dict[str, nn.Module], name: str) -> None:
    model = models[name]
    macs, params, per_layer = static_profile(model, (3, IMAGE, IMAGE))
    assert params == sum(p.numel() for p in model.parameters())
    assert sum(p for _, p in per_layer.values()) == params
    assert macs > 0
    layer_macs = sum(m for m, _ in per_layer.values())
    assert 0.9 * macs <= layer_macs <= macs
    assert set(layer_names(model)) <= set(per_layer)
    _assert_clean(model)


def test_static_cnn_analytical(models: dict[str, nn.Module]) -> None:
    _, _, per_layer = static_profile(models["cnn"], (3, IMAGE, IMAGE))
    # Conv2d(3, 8, 3, padding=1) on 32x32: k*k*cin*cout per output position, plus the bias
    assert per_layer["features.0"] == (3 * 3 * 3 * 8 * IMAGE * IMAGE + 8 * IMAGE * IMAGE, 3 * 3 * 3 * 8 + 8)
    # Conv2d(8, 16, 3, padding=1) after a 2x2 max pool
    half = IMAGE // 2
    assert per_layer["features.4"][0] == 3 * 3 * 8 * 16 * half * half + 16 * half * half
    assert per_layer["fc1"] == (16 * 32 + 32, 16 * 32 + 32)
    assert per_layer["fc2"] == (32 * 10 + 10, 32 * 10 + 10)
    assert per_layer["act"][0] == 32 + 16  # a shared ReLU counts both calls


def test_static_vit_analytical(models: dict[str, nn.Module]) -> None:
    macs, _, per_layer = static_profile(models["vit"], (3, IMAGE, IMAGE))
    tokens = (IMAGE // 8) ** 2 + 1
    assert per_layer["vit.layers.0.mlp.fc1"] == (tokens * (64 * 128 + 128), 64 * 128 + 128)
    patches = (IMAGE // 8) ** 2
    assert per_layer["vit.embeddings.patch_embeddings.projection"][0] == patches * (8 * 8 * 3 * 64 + 64)
    # attention matmuls (SDPA, missed by ptflops) are charged to the attention module
    assert per_layer["vit.layers.0.attention"] == (2 * tokens * tokens * 64, 0)
    # cls token and position embeddings belong to the embeddings module
    assert per_layer["vit.embeddings"][1] == 64 + tokens * 64
    assert macs >= sum(m for m, _ in per_layer.values())


def test_static_resnet_analytical(models: dict[str, nn.Module]) -> None:
    _, _, per_layer = static_profile(models["resnet"], (3, IMAGE, IMAGE))
    # embedder: Conv2d(3, 16, 7, stride 2, padding 3, bias=False) -> 16x16
    conv = "resnet.embedder.embedder.convolution"
    assert per_layer[conv] == (7 * 7 * 3 * 16 * (IMAGE // 2) ** 2, 7 * 7 * 3 * 16)
    assert per_layer["classifier.1"] == (32 * 10 + 10, 32 * 10 + 10)


def test_static_unknown_and_quantized_modules_degrade() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale[None, :, None, None]

    model = nn.Sequential(Custom(), nn.Flatten(), nn.Linear(3 * 8 * 8, 4)).eval()
    macs, params, per_layer = static_profile(model, (3, 8, 8))
    assert per_layer["0"] == (0, 3)
    assert params == 3 + 3 * 64 * 4 + 4
    assert macs >= 3 * 64 * 4

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qmodel = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    qmacs, qparams, qlayers = static_profile(qmodel, (3, 8, 8))
    assert qmacs == macs and qparams == params
    assert qlayers["2"] == per_layer["2"]
    assert "2._packed_params" not in qlayers
    _assert_clean(qmodel)


class _SamePaddingConv(nn.Conv2d):
    """TensorFlow-style 'same' padding through a child module, as efficientnet_pytorch's and timm's convolutions do."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__(cin, cout, k, stride=stride, groups=groups, bias=False)
        self.static_padding = nn.ZeroPad2d((k - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.static_padding(x))


def test_static_counts_conv_subclasses_that_pad_through_a_child() -> None:
    # a subclass with a child is a layer, not a container: counting only its ZeroPad2d made an ImageNet
    # EfficientNet-Lite0 (405 M MACs) a 21 M-MAC model, and the sensitivity profile 4x too long
    model = nn.Sequential(_SamePaddingConv(3, 8, 3), _SamePaddingConv(8, 8, 3, groups=8), nn.Flatten()).eval()
    macs, _, per_layer = static_profile(model, (3, 8, 8))
    assert per_layer["0"][0] == 3 * 3 * 3 * 8 * 64 and per_layer["1"][0] == 3 * 3 * 8 * 64
    assert macs == per_layer["0"][0] + per_layer["1"][0]
    assert "0.static_padding" not in per_layer and "0" in layer_names(model)


# ---------------------------------------------------------------------------------------- dynamic


def test_module_latencies(models: dict[str, nn.Module], x: torch.Tensor) -> None:
    model = models["cnn"]
    lat = module_latencies(model, x, warmup=0, iters=2)
    assert set(lat) == set(layer_names(model))
    assert all(v >= 0 for v in lat.values()) and lat["features.0"] > 0
    _assert_clean(model)


def test_operator_profile(models: dict[str, nn.Module], x: torch.Tensor, tmp_path: Path) -> None:
    trace = tmp_path / "ops.json"
    ops, peak = operator_profile(models["cnn"], x, iters=2, trace_path=trace, top_k=10)
    assert 0 < len(ops) <= 10
    times = [o.self_cpu_time_s for o in ops]
    assert times == sorted(times, reverse=True)
    assert any(o.name == "aten::conv2d" or o.name.startswith("aten::") for o in ops)
    assert any(o.input_shapes for o in ops)
    assert peak > 0
    assert "traceEvents" in json.loads(trace.read_text())
    assert not list(tmp_path.glob(".tmp-*"))


# ---------------------------------------------------------------------------------------- grouping


def test_group_layers_patterns_select_exactly_their_members(vit_profile: Any) -> None:
    profile, _ = vit_profile
    names = [layer.name for layer in profile.layers]
    covered: list[str] = []
    for group in profile.groups:
        members = [n for n in names if re.search(group.pattern, n)]
        assert len(members) == group.count, group.pattern
        assert {layer.type for layer in profile.layers if layer.name in members} == {group.type}
        covered += members
    assert sorted(covered) == sorted(names)  # every layer in exactly one group
    fc1 = next(g for g in profile.groups if g.pattern == r"^vit\.layers\.\d+\.mlp\.fc1$")
    assert fc1.count == 2 and fc1.type == "Linear"
    assert fc1.params == 2 * (64 * 128 + 128)
    shares = [g.latency_share for g in profile.groups]
    assert shares == sorted(shares, reverse=True)


def test_group_layers_mixed_types_and_shares() -> None:
    layers = [
        LayerProfile(name="features.0", type="Conv2d", params=10, macs=100, latency_s=0.3, latency_share=0.3),
        LayerProfile(name="features.1", type="ReLU", latency_s=0.1, latency_share=0.1),
        LayerProfile(name="features.2", type="Conv2d", params=30, macs=300, latency_s=0.5, latency_share=0.5),
        LayerProfile(name="blocks.0.fc", type="Linear", params=5, macs=5, params_share=0.25),
        LayerProfile(name="blocks.1.fc", type="Linear", params=5, macs=5, params_share=0.25),
        LayerProfile(name="head", type="Linear", params=2, macs=2),
    ]
    groups = {g.pattern: g for g in group_layers(layers)}
    names = [layer.name for layer in layers]
    for pattern, group in groups.items():
        assert len([n for n in names if re.search(pattern, n)]) == group.count
    conv = next(g for g in groups.values() if g.type == "Conv2d")
    assert conv.count == 2 and conv.params == 40 and conv.macs == 400
    assert conv.latency_share == pytest.approx(0.8)
    assert not re.search(conv.pattern, "features.1")
    fc = groups[r"^blocks\.\d+\.fc$"]
    assert fc.count == 2 and fc.params_share == pytest.approx(0.5)
    assert groups[r"^head$"].count == 1
    assert next(iter(groups.values())) is conv  # sorted by latency share


# ---------------------------------------------------------------------------------------- profile


def test_profile_model_vit(vit_profile: Any, models: dict[str, nn.Module]) -> None:
    profile, trace = vit_profile
    model = models["vit"]
    assert profile.model_class == "ViTForImageClassification"
    assert profile.family == "vit" and profile.device == "cpu"
    assert profile.input_shape == [3, IMAGE, IMAGE]
    assert profile.total_params == sum(p.numel() for p in model.parameters())
    assert profile.total_macs > 0 and profile.latency_s > 0 and profile.peak_memory_mb > 0
    assert sum(layer.params_share for layer in profile.layers) == pytest.approx(1.0, abs=1e-9)
    assert 0.9 <= sum(layer.macs_share for layer in profile.layers) <= 1.0 + 1e-9
    assert sum(g.params_share for g in profile.groups) == pytest.approx(1.0, abs=1e-9)
    assert any(layer.latency_s > 0 for layer in profile.layers)
    fc1 = next(layer for layer in profile.layers if layer.name == "vit.layers.0.mlp.fc1")
    assert fc1.output_shape == [1, (IMAGE // 8) ** 2 + 1, 128]
    assert profile.operators and profile.trace_path == str(trace)
    assert "traceEvents" in json.loads(trace.read_text())
    assert ModelProfile.model_validate_json(profile.model_dump_json()) == profile


@pytest.mark.parametrize("name", list(BUILDERS))
def test_profile_model_leaves_model_unchanged(models: dict[str, nn.Module], x: torch.Tensor, name: str) -> None:
    model = models[name]
    model.train()  # the training flag must survive
    model.eval()
    before_out = _logits(model, x)
    model.train()
    before = _state(model)
    profile = profile_model(model, x, warmup=0, iters=1)
    assert _state(model) == before
    model.eval()
    assert torch.equal(_logits(model, x), before_out)
    _assert_clean(model)
    assert profile.total_params == sum(p.numel() for p in model.parameters())
    assert ModelProfile.model_validate_json(profile.model_dump_json()) == profile


def test_profile_model_swin_and_quantized(x: torch.Tensor) -> None:
    torch.manual_seed(0)
    swin = _tiny_swin()
    profile = profile_model(swin, x, warmup=0, iters=1)
    attention = [layer for layer in profile.layers if layer.type == "SwinAttention"]
    assert len(attention) == 2 and all(layer.macs > 0 for layer in attention)
    # stage 0: 8x8 patches in four 4x4 windows, hidden 16: Q@K^T and A@V over 16 tokens per window
    windows, tokens, hidden = 4, 16, 16
    assert attention[0].macs == 2 * windows * tokens * tokens * hidden
    assert profile.total_params == sum(p.numel() for p in swin.parameters())

    vit = _tiny_vit()
    float_profile = profile_model(vit, x, warmup=0, iters=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qvit = torch.ao.quantization.quantize_dynamic(vit, {nn.Linear}, dtype=torch.qint8)
    qprofile = profile_model(qvit, x, warmup=0, iters=1)
    assert qprofile.total_macs == float_profile.total_macs
    assert qprofile.total_params == float_profile.total_params
    assert [layer.name for layer in qprofile.layers] == [layer.name for layer in float_profile.layers]
    _assert_clean(qvit)


def test_depthwise_convolutions_count_their_macs_and_send_a_slow_evaluation_to_the_openvino_twin() -> None:
    # EfficientNet-Lite0 (405 M MACs, 9 % in depthwise convolutions) was judged quick enough for PyTorch on 375
    # images (7.6 s estimated) and evaluated there at 7 images a second, 32-51 s a round; its OpenVINO twin ran 57
    from tools.evaluation.twin import float_runtime_for

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 4, 1)
    ).eval()
    profile = profile_model(model, torch.randn(1, 3, 8, 8), iters=1)
    depthwise = next(layer for layer in profile.layers if layer.name == "1")
    assert profile.grouped_conv_macs == depthwise.macs > 0
    assert profile.grouped_conv_macs < profile.total_macs
    pytest.importorskip("openvino")
    assert float_runtime_for(405_000_000, 375) == "torch"
    assert float_runtime_for(405_000_000, 375, grouped_conv_macs=34_500_000) == "openvino"
    assert float_runtime_for(405_000_000, 375, device="cuda", grouped_conv_macs=34_500_000) == "torch"
