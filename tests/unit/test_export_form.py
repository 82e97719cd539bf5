"""Export-time rewrites: Swin's shifted windows exported as gathers, same outputs, fewer runtime operations."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch

from tools.deploy.export_form import GatheredSwinLayer, export_form, plain_export
from tools.deploy.onnxruntime.export import export_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.models.base import LogitsOnly


def _swin(image: int = 16, window: int = 4) -> torch.nn.Module:
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    # 8x8 tokens, windows of 4: the second block of the first stage shifts (rolled, masked); the second stage (4x4
    # tokens, one window) is the identity permutation
    config = SwinConfig(
        image_size=image, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=window
    )
    return SwinForImageClassification(config).eval()


def _x(batch: int = 4, image: int = 16) -> torch.Tensor:
    return torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(1))


def _ops(path: Path) -> Counter[str]:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def test_swin_layers_become_gathers_with_the_same_logits_and_the_model_is_left_alone() -> None:
    swin = _swin()
    before = {k: v.clone() for k, v in swin.state_dict().items()}
    rewritten = export_form(swin, _x(1))
    layers = [m for m in rewritten.modules() if isinstance(m, GatheredSwinLayer)]
    assert len(layers) == 4
    assert [layer.identity for layer in layers] == [False, False, True, True]
    assert [layer.masked for layer in layers] == [False, True, False, False]
    with torch.inference_mode():
        assert torch.allclose(rewritten(_x()).logits, swin(_x()).logits, atol=1e-5)  # any batch, not only the example
    assert not any(isinstance(m, GatheredSwinLayer) for m in swin.modules())
    # every module keeps its path (int8 layer selection and the reports go by module names)
    assert rewritten.state_dict().keys() == swin.state_dict().keys()
    assert {n for n, _ in rewritten.named_modules()} == {n for n, _ in swin.named_modules()}
    assert all(torch.equal(v, swin.state_dict()[k]) for k, v in before.items())


def test_the_onnx_export_has_no_roll_and_fewer_nodes_and_runs_the_same(tmp_path: Path) -> None:
    swin = _swin()
    rewritten = export_onnx(swin, _x(1), tmp_path / "rewritten.onnx")
    with plain_export():
        plain = export_onnx(swin, _x(1), tmp_path / "plain.onnx")
    rewritten_ops, plain_ops = _ops(rewritten), _ops(plain)
    # the rolls (Slice + Concat), the zero padding, the window partitions (Reshape + Transpose) and the shape
    # arithmetic around them go: about half the nodes
    assert sum(rewritten_ops.values()) < 0.6 * sum(plain_ops.values())
    assert rewritten_ops["Pad"] == 0 < plain_ops["Pad"] and rewritten_ops["Transpose"] < plain_ops["Transpose"]
    with torch.inference_mode():
        reference = swin(_x()).logits
    for path in (rewritten, plain):
        assert torch.allclose(OrtModel(path, threads=1)(_x()), reference, atol=1e-4)


def test_openvino_conversion_takes_the_rewritten_form() -> None:
    pytest.importorskip("openvino")
    from tools.deploy.openvino.convert import convert_openvino

    swin = _swin()
    rewritten = Counter(op.get_type_name() for op in convert_openvino(swin, _x(1)).get_ops())
    with plain_export():
        plain = Counter(op.get_type_name() for op in convert_openvino(swin, _x(1)).get_ops())
    assert plain["Roll"] == 2 and rewritten["Roll"] == 0
    assert sum(rewritten.values()) < sum(plain.values())


def test_padded_windows_and_models_without_swin_are_exported_as_they_are() -> None:
    padded = _swin(image=20)  # 10x10 tokens: windows of 4 need padding, which the rewrite leaves to the layer
    assert export_form(padded, _x(1, 20)) is padded
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    cnn(_x(1))
    assert export_form(cnn, _x(1)) is cnn


def test_a_rewrite_that_changes_the_logits_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    swin = _swin()

    def wrong(self: GatheredSwinLayer, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> object:
        return hidden_states * 2, None

    monkeypatch.setattr(GatheredSwinLayer, "forward", wrong)
    assert export_form(swin, _x(1)) is swin
    wrapped = LogitsOnly(swin)
    assert export_form(wrapped, _x(1)) is wrapped


def test_plain_export_turns_the_rewrites_off_for_its_block_only() -> None:
    swin = _swin()
    with plain_export():
        assert export_form(swin, _x(1)) is swin
    assert export_form(swin, _x(1)) is not swin


def test_openvino_int8_of_the_rewritten_swin_names_its_block_layers(tmp_path: Path) -> None:
    """The rewritten layers keep their modules' paths, so the int8 IR's layers map back to the model's modules."""
    pytest.importorskip("nncf")
    from tools.deploy.openvino.quantize import deploy_openvino

    swin = _swin()
    int8, _ = deploy_openvino(swin, tmp_path / "model.xml", example_input=_x(1), calibration=_x(16), int8=True)
    inside = [name for name in int8 if ".blocks." in name]
    assert "swin.encoder.layers.0.blocks.1.mlp.fc1" in inside and len(inside) >= 8


class WholeMapPool(torch.nn.Module):
    """Hugging Face EfficientNet's pooler: an AvgPool2d with a kernel of the channel count and ``ceil_mode``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, stride=4, padding=1)
        self.pool = torch.nn.AvgPool2d(16, ceil_mode=True)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.conv(x)).flatten(1))


def test_a_pooling_window_over_the_whole_map_converts_to_openvino_as_a_global_average(tmp_path: Path) -> None:
    """OpenVINO refused every HF EfficientNet: a pooling kernel larger than its input (a sweep over unseen
    architectures). The rewrite computes the same; the conversion error now says why where it still fails."""
    from tools.deploy.openvino.convert import convert_openvino, save_openvino
    from tools.deploy.openvino.model import OpenVinoModel

    torch.manual_seed(0)
    model, x = WholeMapPool().eval(), torch.randn(2, 3, 32, 32)
    rewritten = export_form(model, x)
    assert isinstance(rewritten.pool, torch.nn.AdaptiveAvgPool2d) and isinstance(model.pool, torch.nn.AvgPool2d)
    xml = save_openvino(convert_openvino(model, x[:1]), tmp_path / "model.xml")
    with torch.no_grad():
        torch.testing.assert_close(OpenVinoModel(xml)(x), model(x), atol=1e-4, rtol=1e-4)
    with plain_export(), pytest.raises(Exception, match="avg_pool2d"):  # the cause, not "Check .false. failed at"
        convert_openvino(model, x[:1])


class SmallInputVgg(torch.nn.Module):
    """torchvision's VGG and AlexNet below 224 px: features down to a 2x2 map, then ``AdaptiveAvgPool2d((7, 7))``."""

    def __init__(self, out: int | tuple[int, int] = 7) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(16))
        self.avgpool = torch.nn.AdaptiveAvgPool2d(out)
        self.classifier = torch.nn.LazyLinear(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


@pytest.mark.parametrize("out", [7, (3, 5)])
def test_adaptive_pooling_that_does_not_divide_its_input_exports_to_onnx(tmp_path: Path, out: object) -> None:
    """The ONNX exporter refuses an adaptive pooling whose output size does not divide the input's (VGG and AlexNet
    below 224 px had no ONNX Runtime candidate); as two constant matrix products it exports, with the same logits."""
    torch.manual_seed(0)
    model, x = SmallInputVgg(out), torch.randn(3, 3, 32, 32)  # type: ignore[arg-type]
    with torch.no_grad():
        reference = model(x)
    rewritten = export_form(model, x)
    assert rewritten is not model and not isinstance(rewritten.avgpool, torch.nn.AdaptiveAvgPool2d)
    path = export_onnx(model, x[:1], tmp_path / "model.onnx")
    assert "MatMul" in _ops(path)
    torch.testing.assert_close(OrtModel(path, threads=1)(x), reference, atol=1e-5, rtol=1e-5)
    with plain_export(), pytest.raises(Exception, match="not factor of input size"):
        export_onnx(model, x[:1], tmp_path / "plain.onnx")


def test_adaptive_pooling_that_divides_its_input_is_exported_as_it_is() -> None:
    torch.manual_seed(0)
    model, x = SmallInputVgg(1), torch.randn(1, 3, 32, 32)
    model(x)  # the lazy classifier's shape
    assert export_form(model, x) is model
