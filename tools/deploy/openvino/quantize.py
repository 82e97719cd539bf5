"""OpenVINO int8: NNCF post-training quantization of a converted model, and which layers it made int8.

* :func:`quantize_openvino` -- NNCF's post-training int8 quantization of an ``openvino.Model``, calibrated on
  preprocessed images (every Conv/MatMul NNCF selects gets int8 weights and activations);
* :func:`int8_weight_layers` -- the modules whose weights are int8 in such a model;
* :func:`deploy_openvino` -- convert, quantize when asked, save as IR: what the ``openvino`` backends deploy.

``nncf`` is imported inside the functions that need it.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tools.deploy.openvino.convert import OpenVinoError, convert_openvino, save_openvino
from tools.text import first_line

logger = logging.getLogger(__name__)

MAX_SUBSET = 300
"""NNCF's default number of calibration samples; fewer when the calibration set is smaller."""


def calibration_items(calibration: torch.Tensor) -> list[np.ndarray]:
    """One ``1 x C x H x W`` float32 array per calibration image (NNCF collects statistics per item)."""
    if calibration.ndim != 4 or calibration.shape[0] == 0:
        raise OpenVinoError(
            f"calibration must be a non-empty batch N x C x H x W, got shape {tuple(calibration.shape)}"
        )
    array = calibration.detach().to("cpu", torch.float32).contiguous().numpy()
    return [np.ascontiguousarray(array[i : i + 1]) for i in range(array.shape[0])]


@contextmanager
def _nncf_quiet() -> Iterator[None]:
    """NNCF logs each algorithm's progress at INFO and draws progress bars (rich, on stdout) that no option
    turns off: keep its warnings and errors, drop the bars."""
    nncf_logger = logging.getLogger("nncf")  # nncf.common.logging.logger.NNCF_LOGGER_NAME
    level = nncf_logger.level
    nncf_logger.setLevel(logging.WARNING)
    try:
        with redirect_stdout(io.StringIO()):
            yield
    finally:
        nncf_logger.setLevel(level)


def quantize_openvino(
    ov_model: Any, calibration: torch.Tensor, *, transformer: bool, subset_size: int | None = None
) -> Any:
    """NNCF post-training int8 quantization of ``ov_model`` calibrated on ``calibration`` (N x C x H x W).

    Attention models use NNCF's transformer model type (SmoothQuant, attention-aware patterns) and the
    mixed preset (symmetric weights, asymmetric activations); others the performance preset (symmetric
    both). ``subset_size``: calibration images used, at most :data:`MAX_SUBSET` (default: all, up to it).
    Every Conv/MatMul/... that NNCF's patterns select is quantized.
    """
    import nncf

    items = calibration_items(calibration)
    subset = min(MAX_SUBSET, len(items), subset_size or len(items))
    preset = nncf.QuantizationPreset.MIXED if transformer else nncf.QuantizationPreset.PERFORMANCE
    try:
        with _nncf_quiet(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            quantized = nncf.quantize(
                ov_model,
                nncf.Dataset(items),
                model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                preset=preset,
                subset_size=subset,
            )
    except Exception as exc:
        raise OpenVinoError(f"NNCF int8 quantization failed: {first_line(exc)}") from exc
    logger.info("NNCF int8 quantization (%s preset) calibrated on %d images", preset.value, subset)
    return quantized


def count_fake_quantize(ov_model: Any) -> int:
    """How many FakeQuantize nodes (int8 activation insertion points) an ``openvino.Model`` holds."""
    return sum(1 for op in ov_model.get_ops() if op.get_type_name() == "FakeQuantize")


_WEIGHTED_OPS = frozenset({"MatMul", "Convolution", "GroupConvolution"})
_DECOMPRESSION_OPS = frozenset({"Convert", "Multiply", "Subtract", "Reshape", "Transpose", "FakeQuantize"})
_SCOPE = "__module.model."
"""How the PyTorch frontend names the nodes of ``LogitsOnly(model)``: ``__module.model.<module path>/aten::...``."""


def _constant_type(node: Any, depth: int = 6) -> str | None:
    """The element type (``f32``, ``i8``...) of the constant a weight input is, seen through its
    decompression (Convert, Multiply...); None for a computed input (attention's activation MatMuls)."""
    kind = node.get_type_name()
    if kind == "Constant":
        return str(node.get_output_element_type(0).get_type_name())
    if kind not in _DECOMPRESSION_OPS or depth == 0 or node.get_input_size() == 0:
        return None
    return _constant_type(node.input_value(0).get_node(), depth - 1)


def _weight_shape(op: Any) -> tuple[int, ...] | None:
    """The weight's shape as torch stores it (Linear ``(out, in)``, Conv ``(out, in/groups, kh, kw)``)."""
    shape = op.input_value(1).get_partial_shape()
    if not shape.is_static:
        return None
    dims = [int(d.get_length()) for d in shape]
    if op.get_type_name() == "GroupConvolution" and len(dims) >= 3:
        return (dims[0] * dims[1], *dims[2:])
    if op.get_type_name() == "MatMul" and not op.get_attributes().get("transpose_b", False):
        return tuple(reversed(dims))
    return tuple(dims)


def _torch_weighted_layers(model: nn.Module, example_input: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """(name, weight shape) of the Linear/Conv modules of ``model`` in the order a forward pass runs them."""
    seen: list[tuple[str, tuple[int, ...]]] = []
    names: dict[nn.Module, str] = {
        m: n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d)
    }

    def record(module: nn.Module, *_: Any) -> None:
        weight = module.weight
        if names[module] not in {n for n, _ in seen} and isinstance(weight, torch.Tensor):
            seen.append((names[module], tuple(int(d) for d in weight.shape)))

    handles = [m.register_forward_hook(record) for m in names]
    try:
        with torch.inference_mode():
            model(example_input[:1].to(next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def int8_weight_layers(
    ov_model: Any, model: nn.Module | None = None, example_input: torch.Tensor | None = None
) -> tuple[list[str], int]:
    """Module names of the MatMul/Convolution nodes with int8 weights, and how many such nodes have none.

    A node is named by its scope (``__module.model.<module path>``); conversion renames the convolutions
    BatchNorm is folded into, and those are matched to ``model``'s modules (when given, with an
    ``example_input``) by weight shape, in execution order. The second figure counts int8 nodes that
    neither way names.
    """
    named: dict[int, str] = {}
    unnamed: dict[tuple[int, ...] | None, list[int]] = {}
    ops = [
        op
        for op in ov_model.get_ordered_ops()
        if op.get_type_name() in _WEIGHTED_OPS and op.get_input_size() > 1
        if _constant_type(op.input_value(1).get_node()) is not None
    ]
    for i, op in enumerate(ops):
        scope = op.get_friendly_name().split("/", 1)[0]
        if scope.startswith(_SCOPE):
            named[i] = scope[len(_SCOPE) :]
        else:
            unnamed.setdefault(_weight_shape(op), []).append(i)
    if model is not None and example_input is not None and unnamed:
        layers: dict[tuple[int, ...], list[str]] = {}
        for name, shape in _torch_weighted_layers(model, example_input):
            if name not in named.values():
                layers.setdefault(shape, []).append(name)
        for weight_shape, indices in unnamed.items():
            candidates = layers.get(weight_shape, []) if weight_shape is not None else []
            if len(candidates) == len(indices):
                named.update(zip(indices, candidates, strict=True))
    int8 = [i for i, op in enumerate(ops) if _constant_type(op.input_value(1).get_node()) in ("i8", "u8")]
    return sorted({named[i] for i in int8 if i in named}), sum(1 for i in int8 if i not in named)


def deploy_openvino(
    float_model: nn.Module,
    xml_path: Path,
    *,
    example_input: torch.Tensor,
    calibration: torch.Tensor | None = None,
    int8: bool,
) -> tuple[list[str], int]:
    """Convert ``float_model``, quantize it to int8 with NNCF when ``int8`` (calibrated on ``calibration``;
    the transformer preset for attention models), and save it as IR at ``xml_path``. Returns
    :func:`int8_weight_layers` of the saved model: the modules whose weights are int8, and how many int8
    nodes could not be named (none and 0 for FP32)."""
    from tools.compression.heads import has_attention

    converted = convert_openvino(float_model, example_input)
    if int8:
        if calibration is None:
            raise OpenVinoError("NNCF int8 quantization needs calibration images (N x C x H x W)")
        converted = quantize_openvino(converted, calibration, transformer=has_attention(float_model))
    save_openvino(converted, xml_path)
    if not int8:
        return [], 0
    was_training = float_model.training
    try:
        return int8_weight_layers(converted, float_model.eval(), example_input)
    finally:
        float_model.train(was_training)


__all__: list[str] = [
    "MAX_SUBSET",
    "calibration_items",
    "count_fake_quantize",
    "deploy_openvino",
    "int8_weight_layers",
    "quantize_openvino",
]
