"""ONNX Runtime's int8 quantization of an exported graph: dynamic (weights) or static (QDQ, calibrated).

* :func:`quantize_onnx` -- ``onnxruntime.quantization.quantize_dynamic`` of the ``MatMul``/``Gemm`` weights to
  int8 (activations quantized per call, as ``torch.ao`` dynamic quantization does);
* :func:`static_quantize_onnx` -- static int8 (QDQ), activations calibrated on images
  (:class:`CalibrationReader`), with a preset for convolutional and for attention graphs (:func:`static_preset`).

Files are written whole (:func:`tools.deploy.onnxruntime.export.atomic_target`).
"""

from __future__ import annotations

import io
import logging
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from tools.deploy.onnxruntime.export import INPUT_NAME, OnnxRuntimeError, atomic_target, preprocess_onnx
from tools.deploy.onnxruntime.graph import (
    CONTRIB_OP_TYPES,
    QUANTIZED_OP_TYPES,
    STATIC_OP_TYPES,
    constant_weight_nodes,
    input_name_of,
)
from tools.text import first_line

logger = logging.getLogger(__name__)

CalibrationMethodName = Literal["minmax", "percentile"]
StaticPreset = Literal["auto", "cnn", "transformer"]
DEFAULT_CALIBRATION: CalibrationMethodName = "minmax"
CALIBRATION_BATCH = 32
_ATTENTION_OPS = frozenset({"Softmax", "LayerNormalization"})


def quantize_onnx(
    fp32_path: Path,
    out_path: Path,
    *,
    per_channel: bool = True,
    reduce_range: bool = False,
    preprocess: bool = True,
    op_types: Sequence[str] = QUANTIZED_OP_TYPES,
    nodes_to_quantize: Sequence[str] | None = None,
) -> Path:
    """Dynamic int8 quantization of the ``op_types`` weights of ``fp32_path`` (ONNX Runtime), to ``out_path``.

    Weights are signed int8 (symmetric; per output channel when ``per_channel``; 7-bit with ``reduce_range``, which
    CPUs without VNNI need: :mod:`tools.deploy.cpu`), activations are quantized to uint8 on each call; only MatMuls
    with a constant weight are quantized (ORT's default for dynamic mode). ``preprocess`` runs
    :func:`preprocess_onnx` on a temporary copy first. ``nodes_to_quantize`` (node names of the graph that is
    quantized: the preprocessed one when ``preprocess``) restricts quantization to those nodes; None or empty:
    every eligible node.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    contrib = any(op in CONTRIB_OP_TYPES for op in op_types)
    fp32_path, out_path = Path(fp32_path), Path(out_path)
    if not fp32_path.is_file():
        raise OnnxRuntimeError(f"{fp32_path} does not exist: export the FP32 model first (export_onnx)")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ort-quant-", dir=out_path.parent) as work:
        source = preprocess_onnx(fp32_path, Path(work) / "preprocessed.onnx") if preprocess else fp32_path
        try:
            with atomic_target(out_path) as tmp, _root_info_muted():
                quantize_dynamic(
                    source,
                    tmp,
                    op_types_to_quantize=list(op_types),
                    per_channel=per_channel,
                    reduce_range=reduce_range,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=list(nodes_to_quantize) if nodes_to_quantize else None,
                    # contrib ops (a fused Attention) have no ONNX shape inference: their outputs are float
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT} if contrib else {},
                )
        except Exception as exc:
            raise OnnxRuntimeError(
                f"ONNX Runtime dynamic quantization of {fp32_path} failed: {first_line(exc)}"
            ) from exc
    logger.info("quantized %s to %s (%.2f MB)", fp32_path, out_path, out_path.stat().st_size / 1e6)
    return out_path


#: Warnings ONNX Runtime's quantizer logs on the root logger that say nothing a user can act on: its advice to
#: preprocess (preprocess_onnx ran, or said why it could not), and one line per normalisation constant whose rank
#: has no channel axis (about a hundred on PoolFormer and BiT: a sweep over unseen architectures).
_NOISE = re.compile(r"^(Please consider to run pre-|Axis -?\d+ is out-of-range for weight)")


class _DropRootInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and not _NOISE.match(str(record.msg))


@contextmanager
def _root_info_muted() -> Iterator[None]:
    """Drop the per-tensor INFO lines ``quantize_dynamic`` logs through ``logging.info`` (the root logger),
    and its warnings that say nothing to act on (:data:`_NOISE`).

    A filter on the root logger sees only records logged on it directly, not those propagated from
    named loggers, so the application's own logging is untouched.
    """
    root = logging.getLogger()
    muted = _DropRootInfo()
    root.addFilter(muted)
    try:
        yield
    finally:
        root.removeFilter(muted)


class CalibrationReader:
    """Calibration images for ONNX Runtime's calibrators: ``{input_name: float32 batch}``, one batch a call.

    Any class with ``get_next`` is an ``onnxruntime.quantization.CalibrationDataReader`` (its
    ``__subclasshook__``), so this one needs no onnxruntime import to be defined; the calibrators
    call only ``get_next`` (and ``rewind`` starts over).
    """

    def __init__(
        self, images: torch.Tensor | np.ndarray, input_name: str = INPUT_NAME, *, batch_size: int = CALIBRATION_BATCH
    ) -> None:
        if isinstance(images, torch.Tensor):
            images = images.detach().to("cpu", torch.float32).numpy()
        array = np.ascontiguousarray(images, dtype=np.float32)
        if array.ndim != 4 or len(array) == 0:
            raise OnnxRuntimeError(f"calibration images must be a non-empty N x C x H x W batch, not {array.shape}")
        self.input_name = input_name
        self.batches = [array[i : i + batch_size] for i in range(0, len(array), max(1, batch_size))]
        self.images = len(array)
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self.batches):
            return None
        self._next += 1
        return {self.input_name: self.batches[self._next - 1]}

    def rewind(self) -> None:
        self._next = 0


def static_preset(path: Path) -> Literal["cnn", "transformer"]:
    """``transformer`` for a graph with attention (Softmax) or LayerNormalization, else ``cnn``."""
    import onnx

    graph = onnx.load(str(path)).graph
    return "transformer" if any(node.op_type in _ATTENTION_OPS for node in graph.node) else "cnn"


_RANGES_DIR: Path | None = None


def _shared_ranges(graph: Path, calibration: Any, how: str) -> Path:
    """Where the activation ranges of ``graph`` calibrated on ``calibration`` are kept for this process: the int8
    profile's static builds and the original's static deployment calibrate the same graph on the same images (17 s
    each for a 260-px EfficientNet-Lite2 on one thread). The name is a digest of the graph, the images and ``how``
    (method and preset: which tensors are calibrated), so different models or images never share."""
    import atexit
    import hashlib
    import shutil

    global _RANGES_DIR
    if _RANGES_DIR is None:
        _RANGES_DIR = Path(tempfile.mkdtemp(prefix="profiling-agent-ranges-"))
        atexit.register(shutil.rmtree, _RANGES_DIR, True)
    digest = hashlib.sha256(Path(graph).read_bytes())
    array = calibration.detach().cpu().contiguous().numpy() if hasattr(calibration, "detach") else calibration
    digest.update(repr((getattr(array, "shape", None), how)).encode())
    digest.update(memoryview(array).tobytes() if hasattr(array, "tobytes") else repr(array).encode())
    return _RANGES_DIR / f"{digest.hexdigest()[:24]}.json"


def static_quantize_onnx(
    fp32_path: Path,
    out_path: Path,
    calibration: torch.Tensor | np.ndarray,
    *,
    method: CalibrationMethodName = DEFAULT_CALIBRATION,
    preset: StaticPreset = "auto",
    per_channel: bool = True,
    reduce_range: bool = False,
    percentile: float = 99.999,
    preprocess: bool = True,
    nodes_to_exclude: Sequence[str] = (),
    calibration_cache: Path | None = None,
) -> Path:
    """Static int8 (QDQ) quantization of ``fp32_path`` by ONNX Runtime, calibrated on ``calibration``.

    Weights int8 (symmetric, per output channel when ``per_channel``; 7-bit with ``reduce_range``, as CPUs without
    VNNI need, :mod:`tools.deploy.cpu`), activations uint8 with ranges from the calibration images (``method``:
    ``minmax`` or ``percentile`` at ``percentile``). ``preset``:

    * ``cnn`` — every operator ONNX Runtime quantizes (Conv, Gemm, Add, pooling...): int8 flows from
      convolution to convolution (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm);
    * ``transformer`` — only Conv/MatMul/Gemm with a constant weight, and MatMul/Gemm outputs left in
      float (they run as MatMulIntegerToFloat): quantized Softmax, residual Adds and attention MatMuls
      cost more in Q/DQ conversions than they save on small token counts;
    * ``auto`` — :func:`static_preset` of the graph.

    ``preprocess`` runs :func:`preprocess_onnx` first (node names are then the preprocessed graph's: see
    :func:`preprocessed_static_source`). ``nodes_to_exclude``: weighted nodes left in float (mixed precision).
    ``calibration_cache``: a JSON file of the activation ranges, written by the first call and read by the next
    ones instead of calibrating again (same graph, calibration images and method). The batch axis stays dynamic.
    """
    fp32_path, out_path = Path(fp32_path), Path(out_path)
    calibrate_method = _calibration_method(fp32_path, method)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ort-static-", dir=out_path.parent) as work:
        source = preprocess_onnx(fp32_path, Path(work) / "preprocessed.onnx") if preprocess else fp32_path
        chosen = static_preset(source) if preset == "auto" else preset
        selection = _preset_selection(source, chosen, nodes_to_exclude, percentile if method == "percentile" else None)
        reader = CalibrationReader(calibration, input_name_of(source))
        if calibration_cache is None:  # the same graph calibrated on the same images before: its ranges again
            calibration_cache = _shared_ranges(source, calibration, f"{method} {percentile} {chosen}")
        _quantize_static(
            source,
            out_path,
            reader,
            fp32_path,
            preset=chosen,
            method=method,
            per_channel=per_channel,
            reduce_range=reduce_range,
            calibrate_method=calibrate_method,
            calibration_cache_path=str(calibration_cache),
            **selection,
        )
    return out_path


def _calibration_method(fp32_path: Path, method: str) -> Any:
    """ONNX Runtime's calibration method named ``method`` (``OnnxRuntimeError`` for an unknown one, or when
    ``fp32_path`` does not exist)."""
    from onnxruntime.quantization import CalibrationMethod

    if not fp32_path.is_file():
        raise OnnxRuntimeError(f"{fp32_path} does not exist: export the FP32 model first (export_onnx)")
    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}
    if method not in methods:
        raise OnnxRuntimeError(f"unknown calibration method {method!r}: choose one of {', '.join(methods)}")
    return methods[method]


def _preset_selection(
    source: Path, preset: str, nodes_to_exclude: Sequence[str], percentile: float | None
) -> dict[str, Any]:
    """``quantize_static``'s arguments for what ``preset`` quantizes in ``source``: ``transformer`` only the nodes with
    a constant weight, their MatMul/Gemm outputs left in float; ``cnn`` every operator ONNX Runtime quantizes (None:
    no restriction). ``percentile``: the percentile calibration's (None: another method)."""
    options: dict[str, object] = {"CalibPercentile": percentile} if percentile is not None else {}
    op_types: list[str] | None = None
    nodes: list[str] | None = None
    if preset == "transformer":
        op_types = list(STATIC_OP_TYPES)
        nodes = [node for node in constant_weight_nodes(source) if node not in set(nodes_to_exclude)]
        options["OpTypesToExcludeOutputQuantization"] = ["MatMul", "Gemm"]
    return {
        "op_types_to_quantize": op_types,
        "nodes_to_quantize": nodes,
        "nodes_to_exclude": list(nodes_to_exclude) or None,
        "extra_options": options,
    }


def _quantize_static(
    source: Path, out_path: Path, reader: CalibrationReader, fp32_path: Path, preset: str, method: str, **arguments: Any
) -> None:
    """``quantize_static`` of ``source`` to ``out_path`` as QDQ (uint8 activations, int8 weights) with ``arguments``,
    its log lines and progress muted, and logged with its ``preset`` and calibration ``method``; an ``OnnxRuntimeError``
    naming ``fp32_path`` should it fail."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    qdq = {"quant_format": QuantFormat.QDQ, "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}
    try:
        with atomic_target(out_path) as tmp, _root_info_muted(), _quiet_stdout():
            quantize_static(source, tmp, reader, **qdq, **arguments)
    except Exception as exc:
        raise OnnxRuntimeError(f"ONNX Runtime static quantization of {fp32_path} failed: {first_line(exc)}") from exc
    logger.info(
        "static int8 (%s preset, %s on %d images) of %s to %s (%.2f MB)",
        preset,
        method,
        reader.images,
        fp32_path,
        out_path,
        out_path.stat().st_size / 1e6,
    )


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """ONNX Runtime's histogram calibrators print their progress to stdout: send it to the debug log."""
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        yield
    if buffer.getvalue().strip():
        logger.debug("onnxruntime calibration: %s", " | ".join(buffer.getvalue().split("\n")).strip(" |"))


__all__: list[str] = [
    "CALIBRATION_BATCH",
    "DEFAULT_CALIBRATION",
    "CalibrationMethodName",
    "CalibrationReader",
    "StaticPreset",
    "quantize_onnx",
    "static_preset",
    "static_quantize_onnx",
]
