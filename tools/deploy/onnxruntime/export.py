"""ONNX export for ONNX Runtime: a classifier as an ONNX graph, preprocessed or optimized by ONNX Runtime.

* :func:`export_onnx` -- FP32 export through the TorchScript exporter (``dynamo=False``: with torch 2.13 the
  dynamo exporter's graph makes ``quantize_dynamic`` fail in shape inference), input ``pixel_values``, output
  ``logits``, dynamic batch axis;
* :func:`preprocess_onnx` -- ONNX Runtime's ``quant_pre_process`` (shape inference, graph optimization), the
  step before quantization;
* :func:`optimize_onnx` / :func:`export_fp32_onnx` -- the FP32 deployment: the export, optimized offline by
  ONNX Runtime.

Every file is written under a temporary name and moved into place (:func:`atomic_target`), so a file that
exists is complete.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import chdir, contextmanager
from pathlib import Path

import torch
from torch import nn

from tools.deploy.export_form import export_form
from tools.models.base import LogitsOnly
from tools.text import first_line

logger = logging.getLogger(__name__)

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
DEFAULT_OPSET = 17


class OnnxRuntimeError(RuntimeError):
    """An export, quantization or session that cannot be carried out (one line, actionable)."""


@contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
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
        with atomic_target(path) as tmp, warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            torch.onnx.export(
                export_form(wrapper, example),
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
                with atomic_target(out_path) as tmp:
                    quant_pre_process(str(fp32_path), str(tmp), skip_symbolic_shape=skip_symbolic)
                return out_path
            except Exception as exc:
                problem = problem or first_line(exc)
    logger.warning("quant_pre_process failed (%s); quantizing the model as exported", problem)
    return fp32_path


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
        with atomic_target(dst) as tmp:
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
        with atomic_target(path) as tmp:
            os.replace(source, tmp)
    return path


__all__: list[str] = [
    "DEFAULT_OPSET",
    "INPUT_NAME",
    "OUTPUT_NAME",
    "OnnxRuntimeError",
    "export_fp32_onnx",
    "export_onnx",
    "optimize_onnx",
    "preprocess_onnx",
]
