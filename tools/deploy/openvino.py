"""OpenVINO as a deployment runtime: FP32 IR export, NNCF post-training int8, and a CPU model wrapper.

* :func:`convert_openvino` — a torch classifier (HF models included: only the logits are kept) as an
  ``openvino.Model`` with a dynamic batch axis and the example's fixed channels/height/width;
* :func:`export_openvino` — the same, saved as ``model.xml`` + ``model.bin`` with float32 weights;
* :func:`quantize_openvino` — NNCF's post-training int8 quantization of such a model, calibrated on
  preprocessed images (every Conv/MatMul NNCF selects gets int8 weights and activations);
* :func:`save_openvino` — an ``openvino.Model`` written as IR (``.xml`` + ``.bin``, files replaced whole);
* :class:`OpenVinoModel` — the IR compiled for the CPU, used like a classifier: ``model(pixel_values) -> logits``.

``openvino`` and ``nncf`` are imported inside the functions that need them.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tools.models.base import LogitsOnly
from tools.text import first_line

logger = logging.getLogger(__name__)

XML_FILENAME = "model.xml"
BIN_FILENAME = "model.bin"
MAX_SUBSET = 300
"""NNCF's default number of calibration samples; fewer when the calibration set is smaller."""


class OpenVinoError(RuntimeError):
    """An export, quantization or compilation that cannot be carried out (one line, actionable)."""


@contextmanager
def _conversion_quiet() -> Iterator[None]:
    """Tracing warns about every Python-level shape check in HF models; they are expected here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def convert_openvino(model: nn.Module, example_input: torch.Tensor) -> Any:
    """``model`` (FP32, eval mode, on the CPU) as an ``openvino.Model``: input ``[?, C, H, W]``, output logits.

    The batch axis is dynamic (:class:`OpenVinoModel` compiles a static shape per batch size it sees);
    channels, height and width are those of ``example_input``. The model is left in the mode and on the
    device it was in.
    """
    import openvino as ov

    if example_input.ndim != 4:
        raise OpenVinoError(f"expected an example input N x C x H x W, got shape {tuple(example_input.shape)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    wrapper = LogitsOnly(model).cpu().eval()
    example = example_input[:1].detach().cpu().float()
    _, channels, height, width = (int(d) for d in example.shape)
    try:
        with _conversion_quiet(), torch.no_grad():
            converted = ov.convert_model(
                wrapper, example_input=(example,), input=[ov.PartialShape([-1, channels, height, width])]
            )
    except Exception as exc:
        raise OpenVinoError(f"OpenVINO conversion of {type(model).__name__} failed: {first_line(exc)}") from exc
    finally:
        model.to(device)
        model.train(was_training)
    if len(converted.inputs) != 1:
        raise OpenVinoError(f"the converted {type(model).__name__} has {len(converted.inputs)} inputs: expected one")
    return converted


def save_openvino(ov_model: Any, xml_path: Path) -> Path:
    """Write ``ov_model`` as IR at ``xml_path`` (+ the ``.bin`` beside it), float weights kept in float32.

    Both files are written in a temporary directory beside the target and moved into place, the
    ``.bin`` first: an ``.xml`` that exists has its weights.
    """
    import openvino as ov

    xml_path = Path(xml_path)
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    bin_path = xml_path.with_suffix(".bin")
    with tempfile.TemporaryDirectory(prefix=".ov-save-", dir=xml_path.parent) as work:
        tmp_xml = Path(work) / xml_path.name
        try:
            ov.save_model(ov_model, str(tmp_xml), compress_to_fp16=False)
        except Exception as exc:
            raise OpenVinoError(f"saving the OpenVINO model to {xml_path} failed: {first_line(exc)}") from exc
        os.replace(tmp_xml.with_suffix(".bin"), bin_path)
        os.replace(tmp_xml, xml_path)
    logger.info(
        "saved OpenVINO IR %s (%.2f MB with its .bin)",
        xml_path,
        (xml_path.stat().st_size + bin_path.stat().st_size) / 1e6,
    )
    return xml_path


def export_openvino(float_model: nn.Module, example_input: torch.Tensor, out_path: Path) -> Path:
    """Convert ``float_model`` (:func:`convert_openvino`) and save it as FP32 IR at ``out_path`` (``.xml``)."""
    return save_openvino(convert_openvino(float_model, example_input), Path(out_path))


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


_CORE: Any = None


def _core() -> Any:
    global _CORE
    if _CORE is None:
        import openvino as ov

        _CORE = ov.Core()
    return _CORE


class OpenVinoModel:
    """An OpenVINO IR compiled for the CPU, used like a classifier: ``model(pixel_values) -> logits`` (torch).

    ``threads`` (``INFERENCE_NUM_THREADS``) defaults to ``torch.get_num_threads()`` so OpenVINO and torch
    compete on equal terms; ``PERFORMANCE_HINT`` LATENCY (one stream). ``precision`` is the
    ``INFERENCE_PRECISION_HINT`` (default ``f32``: float parts run in float32 even on CPUs where
    OpenVINO would pick bf16 by itself; None leaves the CPU plugin's choice). Threads are not pinned
    to cores (``ENABLE_CPU_PINNING`` off): on a shared machine a pinned thread cannot move away from a
    busy core.

    The IR has a dynamic batch axis; a static-shape copy is compiled for each batch size seen (static
    shapes run faster: Swin-tiny on CIFAR 2.4 ms vs 3.7 ms at batch 1), and the ``max_compiled``
    most recent ones are kept with their infer request, reused call after call. Batch 1 is compiled
    on construction. Not an ``nn.Module``: the input is converted to a float32 CPU array here.
    """

    max_compiled = 4

    def __init__(self, path: Path | str, *, threads: int | None = None, precision: str | None = "f32") -> None:
        import openvino as ov

        self.path = Path(path)
        if not self.path.is_file() or not self.path.with_suffix(".bin").is_file():
            raise OpenVinoError(f"{self.path} (and its .bin) does not exist: export the model first")
        self.threads = int(threads) if threads and threads > 0 else torch.get_num_threads()
        self.precision = precision
        try:
            self.model = _core().read_model(str(self.path))
        except Exception as exc:
            raise OpenVinoError(f"cannot read {self.path} with OpenVINO: {first_line(exc)}") from exc
        if len(self.model.inputs) != 1:
            raise OpenVinoError(f"{self.path} has {len(self.model.inputs)} inputs: expected one (pixel_values)")
        self._requests: OrderedDict[int, Any] = OrderedDict()
        self._dynamic: Any = None
        self._tensor = ov.Tensor
        self._request(1)

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "INFERENCE_NUM_THREADS": self.threads,
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,
        }
        if self.precision:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        return config

    def _compile(self, model: Any) -> Any:
        try:
            return _core().compile_model(model, "CPU", self.config).create_infer_request()
        except Exception as exc:
            raise OpenVinoError(f"OpenVINO cannot compile {self.path} for the CPU: {first_line(exc)}") from exc

    def _request(self, batch: int) -> Any:
        """The infer request of a static-shape copy for ``batch`` (the dynamic model where reshaping fails)."""
        request = self._requests.get(batch)
        if request is not None:
            self._requests.move_to_end(batch)
            return request
        static = self.model.clone()
        shape = list(self.model.inputs[0].get_partial_shape())
        try:
            static.reshape({0: [batch, *(int(d.get_length()) for d in shape[1:])]})
        except Exception as exc:
            logger.warning(
                "%s does not reshape to batch %d (%s): running it with a dynamic batch", self.path, batch, exc
            )
            if self._dynamic is None:
                self._dynamic = self._compile(self.model)
            return self._dynamic
        request = self._compile(static)
        self._requests[batch] = request
        while len(self._requests) > self.max_compiled:
            self._requests.popitem(last=False)
        return request

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # The input is shared with OpenVINO, not copied (on a tiny model the copies and the dict ``infer``
        # builds cost a third of the call); the output buffer is the request's, reused: copied out.
        array = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        request = self._request(int(array.shape[0]))
        request.set_input_tensor(self._tensor(array, shared_memory=True))
        request.infer()
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    def __repr__(self) -> str:
        return f"OpenVinoModel({str(self.path)!r}, threads={self.threads})"


__all__: list[str] = [
    "BIN_FILENAME",
    "XML_FILENAME",
    "OpenVinoError",
    "OpenVinoModel",
    "calibration_items",
    "convert_openvino",
    "count_fake_quantize",
    "deploy_openvino",
    "export_openvino",
    "int8_weight_layers",
    "quantize_openvino",
    "save_openvino",
]
