"""The fused-attention ONNX Runtime deployment: one Attention node per ViT attention, int8 QAttention, same outputs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch

from tests.helpers import save_tiny, tiny_vit
from tests.unit.test_pruning import ResidualCNN
from tools.artifacts.io import load_compressed, save_original
from tools.deploy.base import Build, QuantizationError
from tools.deploy.config import QuantizationConfig
from tools.deploy.onnxruntime.fusion import AttentionFusionError, PackedAttention, fuse_attention
from tools.models.sources import acquire_model
from tools.schemas import InputShape, OptimizationPlan, PruningRecommendation, QuantizationRecommendation
from tools.stages import ops

SHAPE = InputShape(channels=3, height=16, width=16)
ALL = [QuantizationRecommendation(layer="all", dtype="qint8")]


def _x(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_fused_copy_computes_the_same_logits_and_leaves_the_original_alone() -> None:
    model = tiny_vit().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused, count = fuse_attention(model, _x(1))
    assert count == 2 and sum(isinstance(m, PackedAttention) for m in fused.modules()) == 2
    with torch.inference_mode():
        assert torch.allclose(fused(_x()).logits, model(_x()).logits, atol=1e-5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("family", ["Dinov2WithRegisters", "ViTMSN", "IJepa"])
def test_other_vit_style_attention_classes_fuse_to_the_same_logits(family: str) -> None:
    import transformers

    torch.manual_seed(0)
    sizes = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = getattr(transformers, f"{family}Config")(**sizes, num_labels=3)
    model = getattr(transformers, f"{family}ForImageClassification")(config).eval()
    fused, count = fuse_attention(model, _x(1))
    assert count == 2
    with torch.inference_mode():
        assert torch.allclose(fused(_x()).logits, model(_x()).logits, atol=1e-5)


def test_a_traced_all_attend_mask_is_ignored_and_an_eager_mask_refused() -> None:
    """transformers 5.17 builds an all-attend mask for an image while the model is traced for export (found on a
    machine with it: the fused ONNX Runtime candidate failed); it changes nothing, so the trace ignores it."""
    fused, _ = fuse_attention(tiny_vit().eval(), _x(1))
    attention = next(m for m in fused.modules() if isinstance(m, PackedAttention))
    hidden = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(2))
    everyone = torch.ones(2, 1, 17, 17, dtype=torch.bool)

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = attention

        def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.attention(h, mask)[0]

    with torch.no_grad():
        plain = attention(hidden)[0]
        traced = torch.jit.trace(Masked(), (hidden, everyone), check_trace=False)
        assert torch.allclose(traced(hidden, everyone), plain, atol=1e-6)
        with pytest.raises(AttentionFusionError, match="takes no attention mask"):
            attention(hidden, everyone)


def test_a_model_without_vit_attention_is_refused() -> None:
    with pytest.raises(AttentionFusionError, match="no attention module that can be fused"):
        fuse_attention(ResidualCNN().eval(), torch.randn(1, 3, 16, 16))


def test_pruned_heads_deploy_as_qattention_and_reproduce_the_int8_outputs(tmp_path: Path) -> None:
    original = save_original(acquire_model(str(save_tiny(tiny_vit(), tmp_path / "src", 16))), tmp_path / "original")
    plan = OptimizationPlan(
        pruning_recommendations=[PruningRecommendation(layer=r"attention$", pruning_type="head", pruning_ratio=0.5)]
    )
    ops.prune(original, plan, SHAPE, tmp_path / "pruned")
    config = QuantizationConfig(backend="onnxruntime-fused")
    report = ops.quantize(tmp_path / "pruned", original, ALL, tmp_path / "fused", config, shape=SHAPE)
    assert any("2 attention module(s)" in note for note in report["notes"])
    # every selected Linear is int8, the q/k/v ones inside the fused attention
    assert any(name.endswith("q_proj") for name in report["layers"])
    graph = onnx.load(str(tmp_path / "fused" / "model.onnx")).graph
    ops_count = Counter(node.op_type for node in graph.node)
    assert ops_count["QAttention"] == 2 and ops_count["Attention"] == 0 and ops_count["Softmax"] == 0
    # close to the float pruned model (int8 error only), and the reloaded artifact reproduces itself
    float_model, deployed = load_compressed(tmp_path / "pruned"), load_compressed(tmp_path / "fused")
    plain = tmp_path / "plain"
    ops.quantize(tmp_path / "pruned", original, ALL, plain, QuantizationConfig(backend="onnxruntime"), shape=SHAPE)
    with torch.inference_mode():
        reference, fused_out, plain_out = float_model(_x()).logits, deployed(_x()), load_compressed(plain)(_x())
    assert torch.equal(deployed(_x()), fused_out)
    assert (fused_out - reference).abs().max() <= 2 * (plain_out - reference).abs().max() + 0.05


def test_the_fused_backend_on_a_cnn_is_a_clear_error(tmp_path: Path) -> None:
    from tools.deploy.registry import get_backend, plan_quantization

    cnn = ResidualCNN(width=8, hidden=16).eval()
    backend = get_backend("onnxruntime-fused")
    report = plan_quantization(cnn, ALL, backend=backend.name)
    with pytest.raises(QuantizationError, match="no attention module that can be fused"):
        backend.save(Build(cnn, report, tmp_path, example_input=torch.randn(1, 3, 16, 16)))


def test_fixed_batch_sessions_give_the_dynamic_sessions_outputs(tmp_path: Path) -> None:
    from tools.deploy.onnxruntime.export import export_onnx
    from tools.deploy.onnxruntime.session import OrtModel

    path = export_onnx(tiny_vit().eval(), _x(1), tmp_path / "model.onnx")
    dynamic, fixed = OrtModel(path, threads=1), OrtModel(path, threads=1, fixed_batch=True)
    assert dynamic.batch_dim == fixed.batch_dim == "batch"
    for batch in (1, 4, 1, 3, 2):
        assert torch.allclose(fixed(_x(batch)), dynamic(_x(batch)), atol=1e-5)  # folded shapes: float rounding
    # one session per batch size, the least recently used dropped beyond max_sessions
    assert list(fixed._sessions) == [4, 1, 3, 2][-OrtModel.max_sessions :]


def test_swin_attention_with_shifted_windows_fuses_into_multiheadattention(tmp_path: Path) -> None:
    from transformers import SwinConfig, SwinForImageClassification

    from tools.deploy.onnxruntime.export import export_onnx
    from tools.deploy.onnxruntime.session import OrtModel

    torch.manual_seed(0)
    config = SwinConfig(image_size=16, patch_size=2, embed_dim=16, depths=[2, 1], num_heads=[2, 4], window_size=4)
    swin = SwinForImageClassification(config).eval()  # depth 2: the second block shifts its windows (masked)
    fused, count = fuse_attention(swin, _x(1))
    assert count == 3
    path = export_onnx(fused, _x(1), tmp_path / "swin.onnx")
    ops_count = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    assert ops_count["MultiHeadAttention"] == 3 and ops_count["Softmax"] == 0
    with torch.inference_mode():
        reference = swin(_x()).logits
    for fixed in (False, True):
        assert torch.allclose(OrtModel(path, threads=1, fixed_batch=fixed)(_x()), reference, atol=1e-4)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_torch_nn_attention_packs_to_what_multihead_attention_returns(batch_first: bool) -> None:
    """``nn.MultiheadAttention`` as the pipeline splits it fuses too, called as ``nn.MultiheadAttention`` is; a mask or
    cross-attention, which the fused node does not compute, is refused."""
    from tools.compression.mha import SplitMultiheadAttention
    from tools.deploy.onnxruntime.fusion import PackedMultiheadAttention

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    packed = PackedMultiheadAttention(SplitMultiheadAttention.from_mha(mha))
    batched, unbatched = torch.randn(5, 2, 32), torch.randn(5, 32)
    with torch.no_grad():
        for x in (batched, unbatched):
            out, weights = packed(x, x, x)
            assert weights is None and torch.allclose(out, mha(x, x, x, need_weights=False)[0], atol=1e-6)
        with pytest.raises(AttentionFusionError, match="takes no attention mask"):
            packed(batched, batched, batched, attn_mask=torch.zeros(5, 5))
        with pytest.raises(AttentionFusionError, match="self-attention only"):
            packed(batched, batched.clone(), batched)


@pytest.mark.parametrize("build", ["encoder_vit", "torchvision_vit"])
def test_a_torch_nn_vit_as_given_deploys_with_one_qattention_per_layer(tmp_path: Path, build: str) -> None:
    """The original as a user gives it (its ``nn.MultiheadAttention`` not split: the original's deployment table is
    built from it) fuses in a copy; the model itself is left as it was."""
    import tests.helpers_mha
    from tools.deploy.registry import get_backend, plan_quantization

    model = getattr(tests.helpers_mha, build)()
    fused, count = fuse_attention(model, _x(1))
    with torch.inference_mode():
        assert count == 2 and torch.allclose(fused(_x()), model(_x()), atol=1e-5)
    assert sum(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules()) == 2
    backend = get_backend("onnxruntime-fused")
    report = backend.save(
        Build(model, plan_quantization(model, ALL, backend=backend.name), tmp_path, example_input=_x(1))
    )
    nodes = Counter(node.op_type for node in onnx.load(str(tmp_path / "model.onnx")).graph.node)
    assert nodes["QAttention"] == 2 and nodes["Softmax"] == 0
    # the plan named the attention's out_proj (its in-projection is no layer): both int8, by the split names
    assert sum(name.endswith(("q_proj", "o_proj")) for name in report.layers) == 4
    assert not any("out_proj" in name for name in report.layers) and not any("left in" in n for n in report.notes)


def test_cross_attention_of_other_widths_is_not_fused() -> None:
    """An ``nn.MultiheadAttention`` whose keys and values have their own width (``kdim``, ``vdim``) cannot pack one
    input's Q/K/V: the model has nothing to fuse, a clear refusal rather than a failed concatenation."""

    class Cross(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = torch.nn.MultiheadAttention(16, 4, kdim=8, vdim=8, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keys = x.flatten(1)[:, :40].reshape(-1, 5, 8)
            return self.attention(torch.zeros(x.shape[0], 3, 16), keys, keys)[0].mean(1)

    with pytest.raises(AttentionFusionError, match="no attention module that can be fused"):
        fuse_attention(Cross().eval(), _x(1))
