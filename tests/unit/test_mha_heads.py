"""``torch.nn.MultiheadAttention`` heads as prunable units (``tools.compression.mha``): the split attention computes
what ``nn.MultiheadAttention`` computes, its heads and head widths are units, pruning removes them in both layouts
users write (an ``nn.TransformerEncoder`` ViT, torchvision-style blocks), recovery refits ``o_proj`` against a split
original, and the pruned model saves, reloads, predicts and runs in ONNX Runtime and OpenVINO."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn

from tests.helpers_mha import CLASSES, HEADS, SIZE, encoder_vit, torchvision_vit
from tools.artifacts.io import load_compressed, load_module, save_compressed, save_original, save_quantized
from tools.compression.mha import SplitMultiheadAttention, split_attention_
from tools.compression.pruning import apply_pruning, prunable_layers
from tools.compression.recipes import PruningConfig
from tools.compression.recovery import RecoveryConfig, recover_
from tools.compression.units import prunable_units, unit_pattern
from tools.schemas import PruningRecommendation, QuantizationRecommendation

BUILDS: dict[str, Callable[[], nn.Module]] = {"encoder": encoder_vit, "torchvision": torchvision_vit}
#: Each layout's attention modules and MLP hidden layers.
ATTENTION = {"encoder": "encoder.layers.{}.self_attn", "torchvision": "encoder.layers.{}.self_attention"}
MLP = {"encoder": r"linear1$", "torchvision": r"mlp\.0$"}
EXACT = PruningConfig(round_to=0, head_round_to=0)


def images(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def attention(name: str) -> list[str]:
    return [ATTENTION[name].format(i) for i in range(2)]


def plan(name: str) -> list[PruningRecommendation]:
    """Half the heads of the first attention, half the width of the second one's heads, half the MLP channels."""
    first, second = attention(name)
    return [
        PruningRecommendation(layer=unit_pattern(first), pruning_type="head", pruning_ratio=0.5),
        PruningRecommendation(layer=unit_pattern(f"{second}.q_proj"), pruning_type="head_dim", pruning_ratio=0.5),
        PruningRecommendation(layer=MLP[name], pruning_type="structured", pruning_ratio=0.5),
    ]


# --------------------------------------------------------------------------------------------- the module


def _close(got: tuple[Any, Any], expected: tuple[Any, Any], case: Any) -> None:
    assert got[0].shape == expected[0].shape, case
    assert torch.allclose(got[0], expected[0], atol=1e-6), case
    assert (got[1] is None) == (expected[1] is None), case
    if expected[1] is not None:
        assert got[1].shape == expected[1].shape and torch.allclose(got[1], expected[1], atol=1e-6), case


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
@pytest.mark.parametrize("kdim", [None, 12], ids=["self", "cross-kdim"])
def test_split_attention_returns_what_multihead_attention_returns(batch_first: bool, kdim: int | None) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, HEADS, batch_first=batch_first, kdim=kdim, vdim=kdim).eval()
    split = SplitMultiheadAttention.from_mha(mha)
    assert (split.num_heads, split.head_dim, split.inner_dim, split.batch_first) == (HEADS, 4, 16, batch_first)
    batch, target, source = 3, 5, 7

    def seq(length: int, width: int) -> torch.Tensor:
        return torch.randn(batch, length, width) if batch_first else torch.randn(length, batch, width)

    q, k = seq(target, 16), seq(source, kdim or 16)
    v = torch.randn_like(k)
    blocked = torch.rand(target, source) > 0.7
    blocked[:, 0] = False  # every query attends to something
    padding = torch.zeros(batch, source, dtype=torch.bool)
    padding[0, -2:] = True
    per_head = torch.randn(batch * HEADS, target, source)
    cases: list[dict[str, Any]] = [
        {},
        {"need_weights": False},
        {"attn_mask": blocked},
        {"attn_mask": blocked.float() * -2.0},
        {"key_padding_mask": padding},
        {"attn_mask": blocked, "key_padding_mask": padding, "need_weights": False},
        {"attn_mask": per_head, "average_attn_weights": False},
    ]
    for case in cases:
        _close(split(q, k, v, **case), mha(q, k, v, **case), case)
        with torch.no_grad():
            _close(split(q, k, v, **case), mha(q, k, v, **case), case)
    if kdim is None:  # self-attention: unbatched inputs, and the causal hint with its mask
        x = torch.randn(target, 16)
        for case in ({}, {"average_attn_weights": False}, {"need_weights": False}):
            _close(split(x, x, x, **case), mha(x, x, x, **case), case)
        causal = nn.Transformer.generate_square_subsequent_mask(target)
        x = seq(target, 16)
        with torch.no_grad():
            case = {"attn_mask": causal, "is_causal": True, "need_weights": False}
            _close(split(x, x, x, **case), mha(x, x, x, **case), case)


class _Classifier(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn, self.head = attn, nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


def test_what_the_split_attention_refuses_it_says() -> None:
    with pytest.raises(ValueError, match="add_bias_kv"):
        SplitMultiheadAttention.from_mha(nn.MultiheadAttention(16, 4, add_bias_kv=True))
    model = nn.Sequential(nn.MultiheadAttention(16, 4, add_zero_attn=True))
    assert split_attention_(model) == [] and isinstance(model[0], nn.MultiheadAttention), "left as it is"
    split = SplitMultiheadAttention.from_mha(nn.MultiheadAttention(16, 4, batch_first=True)).eval()
    x = torch.randn(2, 5, 16)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        split(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="not 4-D"):
        split(x, x, x, attn_mask=torch.zeros(1, 2, 5, 5))
    model = _Classifier(split)  # its attention pruned to 2 heads: a mask per original head no longer fits
    apply_pruning(model, [PruningRecommendation(layer="attn", pruning_type="head", pruning_ratio=0.5)], x)
    assert split.num_heads == 2
    with pytest.raises(ValueError, match=r"8 masks, but this attention has 2 heads x batch 2 \(were heads pruned"):
        split(x, x, x, attn_mask=torch.zeros(2 * 4, 5, 5))
    assert split(x, x, x, attn_mask=torch.zeros(2 * 2, 5, 5))[0].shape == x.shape


@pytest.mark.parametrize("name", BUILDS)
def test_converting_a_model_is_exact_and_its_layers_call_the_split_attention(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = BUILDS[name](), images(4)
    expected = logits(model, x)  # eval, no grad: PyTorch's fused fast path where it applies
    assert split_attention_(model) == attention(name)
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    calls: list[bool] = []
    forward = SplitMultiheadAttention.forward

    def counted(self: SplitMultiheadAttention, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.batch_first)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(SplitMultiheadAttention, "forward", counted)
    assert torch.allclose(logits(model, x), expected, atol=1e-5)
    assert calls == [True, True], "the layers' fast path declined: each attention ran through its own forward"
    model.train()  # and it trains (dropout on the attention weights where the layer has it)
    model(x).square().mean().backward()
    first = model.get_submodule(attention(name)[0])
    assert isinstance(first, SplitMultiheadAttention) and first.q_proj.weight.grad is not None


# --------------------------------------------------------------------------------------------- units and pruning


@pytest.mark.parametrize("name", BUILDS)
def test_heads_and_head_widths_of_multihead_attention_are_units(name: str) -> None:
    model = BUILDS[name]()
    prunable = prunable_layers(model, images(1))
    names = attention(name)
    assert prunable.heads == dict.fromkeys(names, HEADS)
    assert prunable.head_dims == {f"{n}.q_proj": 8 for n in names}
    assert f"{names[0]}.q_proj" in prunable.blocked, "q/k/v are head units, not channels"
    units = {(u.kind, u.modules[0]) for u in prunable_units(prunable.model_dump())}
    assert {("heads", n) for n in names} | {("head_width", n) for n in names} <= units
    assert sum(kind == "channels" for kind, _ in units) == 2, "the MLP hidden channels, as before"
    assert sum(isinstance(m, nn.MultiheadAttention) for m in model.modules()) == 2, "the model is left as it is"


@pytest.mark.parametrize("name", BUILDS)
def test_pruning_removes_heads_narrows_heads_and_the_model_runs(name: str) -> None:
    model, x = BUILDS[name](), images(4)
    first, second = attention(name)
    report = apply_pruning(model, plan(name), x[:1], EXACT)
    done = [(a.pruning_type, a.modules, a.before, a.after, a.consumers) for a in report.applied]
    assert done[0] == ("head", [first], 4, 2, [f"{first}.o_proj"])
    assert done[1] == ("head_dim", [second], 8, 4, [f"{second}.o_proj"])
    assert done[2][0] == "structured" and len(done) == 3 and not report.skipped
    heads, narrow = model.get_submodule(first), model.get_submodule(second)
    assert isinstance(heads, SplitMultiheadAttention) and isinstance(narrow, SplitMultiheadAttention)
    assert (heads.num_heads, heads.head_dim, heads.q_proj.out_features, heads.o_proj.in_features) == (2, 8, 16, 16)
    assert (narrow.num_heads, narrow.head_dim, narrow.inner_dim) == (4, 4, 16)
    assert narrow.scaling == pytest.approx(8**-0.5), "narrowed heads keep their softmax scale"
    assert report.params_after < report.params_before - 3 * 16 * 32
    out = logits(model, x)
    assert out.shape == (4, CLASSES) and bool(out.isfinite().all())


def test_only_the_attention_a_head_pattern_selects_is_split() -> None:
    model = encoder_vit()
    first, second = attention("encoder")
    rec = PruningRecommendation(layer=r"layers\.0\.", pruning_type="head", pruning_ratio=0.5)
    apply_pruning(model, [rec], images(1))
    assert isinstance(model.get_submodule(first), SplitMultiheadAttention)
    assert type(model.get_submodule(second)) is nn.MultiheadAttention, "no pattern selected it: PyTorch's own class"


def test_recovery_refits_the_output_projection_against_a_split_original() -> None:
    original, calibration = encoder_vit(), images(48, seed=2)
    split_attention_(original)  # what the pipeline does to the original it prunes copies of
    pruned = copy.deepcopy(original)
    rec = PruningRecommendation(layer=r"self_attn$", pruning_type="head", pruning_ratio=0.5)
    report = apply_pruning(pruned, [rec], calibration[:1], calibration=calibration)
    consumers = report.consumers()
    assert consumers == [f"{n}.o_proj" for n in attention("encoder")]
    recovered = recover_(pruned, original, calibration, consumers, RecoveryConfig(method="reconstruct"))
    assert sorted(recovered.reconstructed) == consumers and not recovered.skipped


def test_the_sensitivity_profile_probes_the_heads_of_a_split_original() -> None:
    from tools.compression.sensitivity import measure_sensitivity
    from tools.profiling.profile import profile_model

    original, calibration = encoder_vit(), images(32, seed=3)
    split_attention_(original)  # profiled, listed and probed split, as the pipeline is to do it
    layers = profile_model(original, calibration[:1], family="test", warmup=0, iters=1).layers
    units = prunable_units(prunable_layers(original, calibration[:1]).model_dump(), layers)
    profile = measure_sensitivity(original, calibration, units, layers=layers, ratios=(0.5,), pruning=EXACT)
    assert not profile.skipped
    probed = {(u.kind, u.modules[0]): u for u in profile.units}
    for name in attention("encoder"):
        for kind in ("heads", "head_width"):
            unit = probed[(kind, name)]
            assert unit.params == 4 * (32 * 32 + 32), "the unit's q/k/v/o layers, from the split profile"
            assert unit.points[0].params_saved == 3 * (16 * 32 + 16) + 32 * 16, "half of q/k/v rows, of o columns"


# --------------------------------------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per layout: the factory original, and a copy pruned by :func:`plan` saved as a pruned artifact."""
    from tools.models.factory import build_factory_model
    from tools.models.specs import FactorySpec

    root = tmp_path_factory.mktemp("mha")
    out: dict[str, dict[str, Any]] = {}
    for name in BUILDS:
        spec = FactorySpec.from_options(f"tests.helpers_mha:{name}_vit", image_size=SIZE, mean=0.5, std=0.5)
        original = save_original(build_factory_model(spec), root / name / "original")
        model = load_module(original)
        apply_pruning(model, plan(name), images(1), EXACT)
        pruned = save_compressed(model, root / name / "pruned", base_dir=original, kind="pruned", recipe={})
        out[name] = {"root": root / name, "original": original, "pruned": pruned, "model": model}
    return out


@pytest.mark.parametrize("name", BUILDS)
def test_pruned_model_reloads_and_predicts_with_the_same_logits(saved: dict[str, dict[str, Any]], name: str) -> None:
    from tools.stages import ops
    from tools.stages.predict import predict

    run = saved[name]
    structure = json.loads((run["pruned"] / "artifact.json").read_text())["structure"]
    first, second = attention(name)
    assert structure[first]["replace"]["type"] == "SplitMultiheadAttention"
    assert (structure[first]["replace"]["num_heads"], structure[second]["replace"]["head_dim"]) == (2, 4)
    again = load_compressed(run["pruned"])
    assert isinstance(again, nn.Module) and isinstance(again.get_submodule(first), SplitMultiheadAttention)
    x = images(5)
    assert torch.equal(logits(again, x), logits(run["model"], x))
    picture = run["root"] / "picture.png"
    Image.new("RGB", (20, 20), (10, 200, 30)).save(picture)
    shape = ops.resolve_input_shape(run["original"])
    probs = torch.softmax(logits(again, ops.preprocess_of(run["original"], shape)([Image.open(picture)])), -1)[0]
    top = predict(run["pruned"], [picture], top_k=1)[0].top[0]
    assert top == (f"class_{int(probs.argmax())}", round(float(probs.max()), 4))


@pytest.mark.parametrize("backend", ["onnxruntime-fp32", "onnxruntime", "onnxruntime-fused", "openvino"])
@pytest.mark.parametrize("name", BUILDS)
def test_pruned_model_runs_in_onnx_runtime_and_openvino(
    saved: dict[str, dict[str, Any]], name: str, backend: str
) -> None:
    pytest.importorskip("openvino" if backend == "openvino" else "onnxruntime")
    from tools.deploy.registry import plan_quantization

    run = saved[name]
    model = load_module(run["pruned"])
    report = plan_quantization(model, [QuantizationRecommendation(layer="all", dtype="qint8")], backend=backend)
    out = save_quantized(
        model,
        run["root"] / backend,
        base_dir=run["original"],
        recipe={"source": str(run["pruned"])},
        report=report,
        example_input=images(1),
    )
    deployed = load_compressed(out)
    assert not isinstance(deployed, nn.Module)
    x = images(3, seed=5)
    got, expected = logits(deployed, x), logits(model, x)
    assert got.shape == (3, CLASSES)
    if backend.startswith("onnxruntime-fused"):  # each (pruned) attention one int8 QAttention node, as Hugging Face's
        import onnx

        nodes = [node.op_type for node in onnx.load(str(out / "model.onnx")).graph.node]
        assert nodes.count("QAttention") == 2 and "Softmax" not in nodes
    if backend.startswith("onnxruntime") and backend != "onnxruntime-fp32":  # dynamic int8 of the split projections
        layers = json.loads((out / "artifact.json").read_text())["quantization"]["layers"]
        assert {f"{a}.{p}" for a in attention(name) for p in ("q_proj", "o_proj")} <= set(layers)
        assert torch.allclose(got, expected, atol=0.1)
    else:
        assert torch.allclose(got, expected, atol=1e-4)
