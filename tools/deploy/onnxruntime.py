"""ONNX Runtime: export a classifier to ONNX, quantize it (dynamic or static int8), run it like a model.

The paper compares its compressed models with ONNX Runtime's post-training dynamic quantization.
This module does that baseline end to end:

* :func:`export_onnx` — FP32 export through the TorchScript exporter (``dynamo=False``: with torch
  2.13 the dynamo exporter's graph makes ``quantize_dynamic`` fail in shape inference), input
  ``pixel_values``, output ``logits``, dynamic batch axis;
* :func:`quantize_onnx` — ``onnxruntime.quantization.quantize_dynamic`` of the ``MatMul``/``Gemm``
  weights to int8 (activations quantized per call, as ``torch.ao`` dynamic quantization does);
* :class:`OrtModel` — an ``InferenceSession`` behind ``model(pixel_values) -> logits`` (a torch
  tensor), so that :func:`tools.evaluation.accuracy.evaluate_accuracy`, :func:`~tools.evaluation.cost.measure_latency`
  and :func:`~tools.evaluation.cost.compare_latencies` take it like any model;
* :func:`onnx_baseline` — export + quantize into a directory, idempotent (complete files are reused);
* :func:`export_fp32_onnx` — the FP32 deployment: the export, optimized offline by ONNX Runtime;
* :func:`static_quantize_onnx` — static int8 (QDQ), activations calibrated on images
  (:class:`CalibrationReader`), with a preset for convolutional and for attention graphs.

Every file is written under a temporary name and moved into place, so a file that exists is complete.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import chdir, contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.deploy.onnx_graph import (
    CONTRIB_OP_TYPES,
    QUANTIZED_OP_TYPES,
    STATIC_OP_TYPES,
    constant_weight_nodes,
    input_name_of,
    linear_nodes,
    quantized_op_counts,
    weighted_nodes,
)
from tools.models.base import LogitsOnly
from tools.text import first_line

logger = logging.getLogger(__name__)

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
DEFAULT_OPSET = 17
FP32_FILENAME = "model.onnx"
QUANTIZED_FILENAME = "model.int8.onnx"


class OnnxRuntimeError(RuntimeError):
    """An export, quantization or session that cannot be carried out (one line, actionable)."""


@contextmanager
def _atomic_target(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it when the block succeeds (removed otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # created by the writer
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def export_onnx(model: nn.Module, example_input: torch.Tensor, path: Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Export ``model`` (FP32, eval mode, on CPU) to ONNX at ``path``; batch axis dynamic.

    The model is left in the mode and on the device it was in. Models over 2 GB (protobuf's limit)
    are not supported by this single-file export.
    """
    path = Path(path)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    wrapper = LogitsOnly(model).cpu().eval()
    example = example_input.detach().cpu().float()
    try:
        with _atomic_target(path) as tmp, warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            torch.onnx.export(
                wrapper,
                (example,),
                str(tmp),
                dynamo=False,
                export_params=True,
                opset_version=opset,
                do_constant_folding=True,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            )
    except Exception as exc:
        raise OnnxRuntimeError(f"ONNX export of {type(model).__name__} failed: {first_line(exc)}") from exc
    finally:
        model.to(device)
        model.train(was_training)
    logger.info("exported %s to %s (%.2f MB)", type(model).__name__, path, path.stat().st_size / 1e6)
    return path


def preprocess_onnx(fp32_path: Path, out_path: Path) -> Path:
    """ORT's ``quant_pre_process`` (shape inference, graph optimization) of ``fp32_path`` into ``out_path``.

    Symbolic shape inference fails on some graphs (Swin's): then preprocessing runs without it, and
    should that fail too, ``fp32_path`` itself is returned (the model is quantized as exported).
    Preprocessing renames some nodes (a ``Gemm`` becomes ``<name>_MatMul`` + ``<name>_Add``): select
    nodes in the file this returns. Runs in a temporary working directory, where a failed symbolic
    shape inference leaves its debug dump (``sym_shape_infer_temp.onnx`` and ``*.data``).
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32_path, out_path = Path(fp32_path).resolve(), Path(out_path).resolve()
    if not fp32_path.is_file():
        raise OnnxRuntimeError(f"{fp32_path} does not exist: export the FP32 model first (export_onnx)")
    problem = ""
    with tempfile.TemporaryDirectory(prefix=".ort-preprocess-", dir=out_path.parent) as work, chdir(work):
        for skip_symbolic in (False, True):
            try:
                with _atomic_target(out_path) as tmp:
                    quant_pre_process(str(fp32_path), str(tmp), skip_symbolic_shape=skip_symbolic)
                return out_path
            except Exception as exc:
                problem = problem or first_line(exc)
    logger.warning("quant_pre_process failed (%s); quantizing the model as exported", problem)
    return fp32_path


def quantize_onnx(
    fp32_path: Path,
    out_path: Path,
    *,
    per_channel: bool = True,
    preprocess: bool = True,
    op_types: Sequence[str] = QUANTIZED_OP_TYPES,
    nodes_to_quantize: Sequence[str] | None = None,
) -> Path:
    """Dynamic int8 quantization of the ``op_types`` weights of ``fp32_path`` (ONNX Runtime), to ``out_path``.

    Weights are signed int8 (symmetric; per output channel when ``per_channel``), activations are
    quantized to uint8 on each call; only MatMuls with a constant weight are quantized (ORT's
    default for dynamic mode). ``preprocess`` runs :func:`preprocess_onnx` on a temporary copy first.
    ``nodes_to_quantize`` (node names of the graph that is quantized: the preprocessed one when
    ``preprocess``) restricts quantization to those nodes; None or empty: every eligible node.
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
            with _atomic_target(out_path) as tmp, _root_info_muted():
                quantize_dynamic(
                    source,
                    tmp,
                    op_types_to_quantize=list(op_types),
                    per_channel=per_channel,
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


class _DropRootInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # also its advice to preprocess: preprocess_onnx ran, or said why it could not
        return record.levelno >= logging.WARNING and not str(record.msg).startswith("Please consider to run pre-")


@contextmanager
def _root_info_muted() -> Iterator[None]:
    """Drop the per-tensor INFO lines ``quantize_dynamic`` logs through ``logging.info`` (the root logger),
    and its warning to preprocess the model.

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


# --- FP32 and static int8 deployments -------------------------------------------------------------

CalibrationMethodName = Literal["minmax", "percentile"]
StaticPreset = Literal["auto", "cnn", "transformer"]
DEFAULT_CALIBRATION: CalibrationMethodName = "minmax"
CALIBRATION_BATCH = 32
_ATTENTION_OPS = frozenset({"Softmax", "LayerNormalization"})


def optimize_onnx(src: Path, dst: Path) -> Path:
    """ONNX Runtime's offline graph optimization of ``src`` (``ORT_ENABLE_EXTENDED``), saved to ``dst``.

    Extended: constant folding and fusions (LayerNorm, Gelu, MatMul + bias...), which make the session
    load faster (Swin-tiny: 223 -> 75 ms) at the same latency, since the session applies them online
    anyway. Not ``ORT_ENABLE_ALL``, whose NCHWc layout rewrite ties the saved file to the CPU it was
    optimized on. The result holds ONNX Runtime contrib operators: it is for ONNX Runtime only.
    """
    import onnxruntime as ort

    src, dst = Path(src), Path(dst)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    try:
        with _atomic_target(dst) as tmp:
            options.optimized_model_filepath = str(tmp)
            ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise OnnxRuntimeError(f"ONNX Runtime could not optimize {src}: {first_line(exc)}") from exc
    return dst


def export_fp32_onnx(
    model: nn.Module, example_input: torch.Tensor, path: Path, *, optimize: bool = True, notes: list[str] | None = None
) -> Path:
    """The FP32 deployment: :func:`export_onnx`, then (``optimize``) :func:`optimize_onnx` in place.

    Should the optimization fail, the plain export is kept (logged, and said in ``notes`` when given): it
    runs the same, loads slower.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=path.parent) as work:
        exported = export_onnx(model, example_input, Path(work) / "float.onnx")
        try:
            source = optimize_onnx(exported, Path(work) / "optimized.onnx") if optimize else exported
        except OnnxRuntimeError as exc:
            logger.warning("%s; deploying the plain export", exc)
            if notes is not None:
                notes.append(f"{first_line(exc)}: the plain export is deployed (runs the same, loads slower)")
            source = exported
        with _atomic_target(path) as tmp:
            os.replace(source, tmp)
    return path


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


def static_quantize_onnx(
    fp32_path: Path,
    out_path: Path,
    calibration: torch.Tensor | np.ndarray,
    *,
    method: CalibrationMethodName = DEFAULT_CALIBRATION,
    preset: StaticPreset = "auto",
    per_channel: bool = True,
    percentile: float = 99.999,
    preprocess: bool = True,
) -> Path:
    """Static int8 (QDQ) quantization of ``fp32_path`` by ONNX Runtime, calibrated on ``calibration``.

    Weights int8 (symmetric, per output channel when ``per_channel``), activations uint8 with ranges
    from the calibration images (``method``: ``minmax`` or ``percentile`` at ``percentile``), as ONNX
    Runtime recommends for x86 CPUs with VNNI (``reduce_range`` off). ``preset``:

    * ``cnn`` — every operator ONNX Runtime quantizes (Conv, Gemm, Add, pooling...): int8 flows from
      convolution to convolution (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm);
    * ``transformer`` — only Conv/MatMul/Gemm with a constant weight, and MatMul/Gemm outputs left in
      float (they run as MatMulIntegerToFloat): quantized Softmax, residual Adds and attention MatMuls
      cost more in Q/DQ conversions than they save on small token counts;
    * ``auto`` — :func:`static_preset` of the graph.

    ``preprocess`` runs :func:`preprocess_onnx` first. The input's batch axis stays dynamic.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    fp32_path, out_path = Path(fp32_path), Path(out_path)
    if not fp32_path.is_file():
        raise OnnxRuntimeError(f"{fp32_path} does not exist: export the FP32 model first (export_onnx)")
    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}
    if method not in methods:
        raise OnnxRuntimeError(f"unknown calibration method {method!r}: choose one of {', '.join(methods)}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ort-static-", dir=out_path.parent) as work:
        source = preprocess_onnx(fp32_path, Path(work) / "preprocessed.onnx") if preprocess else fp32_path
        chosen = static_preset(source) if preset == "auto" else preset
        options: dict[str, object] = {"CalibPercentile": percentile} if method == "percentile" else {}
        op_types: list[str] | None = None
        nodes: list[str] | None = None
        if chosen == "transformer":
            op_types, nodes = list(STATIC_OP_TYPES), list(constant_weight_nodes(source))
            options["OpTypesToExcludeOutputQuantization"] = ["MatMul", "Gemm"]
        reader = CalibrationReader(calibration, input_name_of(source))
        try:
            with _atomic_target(out_path) as tmp, _root_info_muted(), _quiet_stdout():
                quantize_static(
                    source,
                    tmp,
                    reader,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=op_types,
                    nodes_to_quantize=nodes,
                    per_channel=per_channel,
                    reduce_range=False,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=methods[method],
                    extra_options=options,
                )
        except Exception as exc:
            raise OnnxRuntimeError(
                f"ONNX Runtime static quantization of {fp32_path} failed: {first_line(exc)}"
            ) from exc
    logger.info(
        "static int8 (%s preset, %s on %d images) of %s to %s (%.2f MB)",
        chosen,
        method,
        reader.images,
        fp32_path,
        out_path,
        out_path.stat().st_size / 1e6,
    )
    return out_path


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """ONNX Runtime's histogram calibrators print their progress to stdout: send it to the debug log."""
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        yield
    if buffer.getvalue().strip():
        logger.debug("onnxruntime calibration: %s", " | ".join(buffer.getvalue().split("\n")).strip(" |"))


class OrtModel:
    """An ONNX Runtime CPU session used like a classifier: ``model(pixel_values) -> logits`` (torch tensor).

    ``threads`` (intra-op) defaults to ``torch.get_num_threads()`` so ORT and torch compete on equal
    terms; one inter-op thread, sequential execution, all graph optimizations. ``spinning=False``
    (default) lets ORT's idle worker threads sleep instead of busy-waiting: on a shared or small
    machine the spinning threads steal the cores other threads (and the next model timed in an
    interleaved comparison) need; ViT-B/16 int8 at 2 threads on a loaded 2-core host took 125 ms
    without spinning and 231 ms with it.

    ``fixed_batch`` (the deployed artifacts): one session per batch size seen (the last
    :attr:`max_sessions` kept), each with the symbolic batch dimension fixed (ONNX Runtime's free-dimension
    override), so the graph's shape arithmetic folds into constants when the session is built: on Swin-style
    graphs, full of window reshapes, that is most of their nodes (measured: ``cifar10-swin-tiny`` int8,
    2.03 → 1.53 ms at batch 1). The same file and weights (outputs equal up to float rounding); without it
    (the baselines), one session with the dynamic batch, as a user gets from ONNX Runtime by default.

    Not an ``nn.Module``: the evaluation helpers call ``.eval()``/``.train()`` only on nn.Modules,
    read the float dtype only from nn.Modules, and move the input batch to ``device`` themselves
    (keep ``device="cpu"``); the input is converted to a float32 CPU array here.
    """

    max_sessions = 3

    def __init__(
        self, path: Path | str, *, threads: int | None = None, spinning: bool = False, fixed_batch: bool = False
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise OnnxRuntimeError(f"{self.path} does not exist: export (and quantize) the model first")
        self.threads = int(threads) if threads and threads > 0 else torch.get_num_threads()
        self.spinning, self.fixed_batch = spinning, fixed_batch
        self.session = self._open(None)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1:
            raise OnnxRuntimeError(f"{self.path} has {len(inputs)} inputs: expected one (pixel_values)")
        self.input_name: str = inputs[0].name
        self.output_name: str = outputs[0].name
        batch_dim = inputs[0].shape[0] if inputs[0].shape else None
        #: The symbolic batch dimension's name (None when the batch is fixed in the file).
        self.batch_dim: str | None = batch_dim if isinstance(batch_dim, str) else None
        self._sessions: OrderedDict[int, Any] = OrderedDict()

    def _open(self, batch: int | None) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if not self.spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if batch is not None and self.batch_dim is not None:
            options.add_free_dimension_override_by_name(self.batch_dim, batch)
        try:
            return ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise OnnxRuntimeError(f"cannot open {self.path} with ONNX Runtime: {first_line(exc)}") from exc

    def session_for(self, batch: int) -> Any:
        """The session that runs a batch of ``batch`` images (see ``fixed_batch``)."""
        if not self.fixed_batch or self.batch_dim is None:
            return self.session
        if batch not in self._sessions:
            self._sessions[batch] = self._open(batch)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(batch)
        return self._sessions[batch]

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        array = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        (logits,) = self.session_for(array.shape[0]).run([self.output_name], {self.input_name: array})
        return torch.from_numpy(logits)

    def __repr__(self) -> str:
        return f"OrtModel({str(self.path)!r}, threads={self.threads}, fixed_batch={self.fixed_batch})"


class OnnxBaseline(BaseModel):
    """The ONNX Runtime baseline's files; sizes in MB of 10^6 bytes."""

    fp32_path: str
    quantized_path: str
    fp32_size_mb: float = Field(description="FP32 .onnx file, 10^6 bytes")
    quantized_size_mb: float = Field(description="int8 .onnx file, 10^6 bytes")
    threads: int = Field(description="intra-op threads for sessions opened through this record")

    def fp32_model(self, threads: int | None = None) -> OrtModel:
        return OrtModel(self.fp32_path, threads=threads or self.threads)

    def quantized_model(self, threads: int | None = None) -> OrtModel:
        return OrtModel(self.quantized_path, threads=threads or self.threads)


def onnx_baseline(
    model: nn.Module,
    example_input: torch.Tensor,
    out_dir: Path,
    *,
    threads: int | None = None,
    per_channel: bool = True,
) -> OnnxBaseline:
    """Export ``model`` to ``out_dir/model.onnx`` and quantize it to ``out_dir/model.int8.onnx``.

    Idempotent: a file already there is complete (atomic writes) and is reused as it is, whatever
    model or options made it; use a fresh ``out_dir`` per model. ``threads`` is recorded for the
    sessions opened through the record (:meth:`OnnxBaseline.quantized_model`); default: torch's.
    """
    out_dir = Path(out_dir)
    fp32 = out_dir / FP32_FILENAME
    quantized = out_dir / QUANTIZED_FILENAME
    exported = not fp32.is_file()
    if exported:
        export_onnx(model, example_input, fp32)
    else:
        logger.info("reusing %s", fp32)
    if exported or not quantized.is_file():  # a fresh export makes an older quantized file stale
        quantize_onnx(fp32, quantized, per_channel=per_channel)
    else:
        logger.info("reusing %s", quantized)
    return OnnxBaseline(
        fp32_path=str(fp32),
        quantized_path=str(quantized),
        fp32_size_mb=round(fp32.stat().st_size / 1e6, 4),
        quantized_size_mb=round(quantized.stat().st_size / 1e6, 4),
        threads=int(threads) if threads and threads > 0 else torch.get_num_threads(),
    )


__all__: list[str] = [
    "CalibrationReader",
    "OnnxBaseline",
    "OnnxRuntimeError",
    "OrtModel",
    "constant_weight_nodes",
    "export_fp32_onnx",
    "export_onnx",
    "input_name_of",
    "linear_nodes",
    "onnx_baseline",
    "optimize_onnx",
    "preprocess_onnx",
    "quantize_onnx",
    "quantized_op_counts",
    "static_preset",
    "static_quantize_onnx",
    "weighted_nodes",
]
