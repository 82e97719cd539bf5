"""ONNX Runtime sessions used like models, and the paper's ONNX Runtime baseline.

* :class:`OrtModel` -- an ``InferenceSession`` behind ``model(pixel_values) -> logits`` (a torch tensor), so
  that :func:`tools.evaluation.accuracy.evaluate_accuracy`, :func:`~tools.evaluation.cost.measure_latency` and
  :func:`~tools.evaluation.cost.compare_latencies` take it like any model;
* :func:`onnx_baseline` -- the paper compares its compressed models with ONNX Runtime's post-training dynamic
  quantization: export + quantize into a directory, idempotent (complete files are reused).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.deploy.onnxruntime.export import OnnxRuntimeError, export_onnx
from tools.deploy.onnxruntime.quantize import quantize_onnx
from tools.text import first_line

logger = logging.getLogger(__name__)

FP32_FILENAME = "model.onnx"
QUANTIZED_FILENAME = "model.int8.onnx"


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
    reduce_range: bool | None = None,
) -> OnnxBaseline:
    """Export ``model`` to ``out_dir/model.onnx`` and quantize it to ``out_dir/model.int8.onnx``.

    Idempotent: a file already there is complete (atomic writes) and is reused as it is, whatever
    model or options made it; use a fresh ``out_dir`` per model. ``threads`` is recorded for the
    sessions opened through the record (:meth:`OnnxBaseline.quantized_model`); default: torch's.
    ``reduce_range`` (7-bit weights): default, what this CPU kind needs (:func:`tools.deploy.cpu.int8_settings`),
    so that the baseline is as accurate here as ONNX Runtime's documentation advises for CPUs without VNNI.
    """
    from tools.deploy.cpu import int8_settings

    out_dir = Path(out_dir)
    fp32 = out_dir / FP32_FILENAME
    quantized = out_dir / QUANTIZED_FILENAME
    exported = not fp32.is_file()
    if exported:
        export_onnx(model, example_input, fp32)
    else:
        logger.info("reusing %s", fp32)
    if exported or not quantized.is_file():  # a fresh export makes an older quantized file stale
        seven_bit = int8_settings().reduce_range if reduce_range is None else reduce_range
        quantize_onnx(fp32, quantized, per_channel=per_channel, reduce_range=seven_bit)
    else:
        logger.info("reusing %s", quantized)
    return OnnxBaseline(
        fp32_path=str(fp32),
        quantized_path=str(quantized),
        fp32_size_mb=round(fp32.stat().st_size / 1e6, 4),
        quantized_size_mb=round(quantized.stat().st_size / 1e6, 4),
        threads=int(threads) if threads and threads > 0 else torch.get_num_threads(),
    )


__all__: list[str] = ["FP32_FILENAME", "QUANTIZED_FILENAME", "OnnxBaseline", "OrtModel", "onnx_baseline"]
