"""Float models timed in the runtime a deployment runs them in: what ``--objective latency`` measures units by.

At batch 1 a CPU runtime's latency is not proportional to parameters or MACs: an int8 CNN costs per layer, so its
narrower channels barely pay while a removed block saves every call of its layers
(``benchmarks/channel_blocks.py``). The latency objective therefore measures what a unit saves where the model will
run: :func:`compiled_in` builds a float model for ``openvino`` (OpenVINO FP32), ``onnxruntime`` (ONNX Runtime FP32)
or ``pytorch`` (the module itself), and :func:`latencies_in` times several of them at batch 1, interleaved in warm
blocks (:func:`tools.evaluation.cost.compare_latencies`), so drift affects them alike. FP32, not the int8 the
deployment may build: an int8 build per probe would cost a calibration each, and the units' ranking comes from the
graph's shape (a layer run or not), which the two precisions share.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.evaluation.cost import SERVING_BLOCK, compare_latencies

__all__ = ["RUNTIMES", "compiled_in", "latencies_in"]

#: The runtimes a float model can be timed in here.
RUNTIMES = ("pytorch", "onnxruntime", "openvino")


class _Compiled:
    """A compiled float model that owns the directory its files were written to."""

    def __init__(self, model: Callable[..., Any], directory: Path | None) -> None:
        self.model = model
        self._directory = directory

    def __call__(self, x: torch.Tensor) -> Any:
        return self.model(x)

    def __del__(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


def compiled_in(runtime: str, model: nn.Module, example: torch.Tensor) -> Callable[..., Any]:
    """``model`` (float, eval mode) as ``runtime`` runs it at FP32 (see module doc); ``ValueError`` for another."""
    if runtime == "pytorch":
        return model.eval()
    directory = Path(tempfile.mkdtemp(prefix="profiling-agent-timed-"))
    try:
        if runtime == "openvino":
            from tools.deploy.openvino.convert import export_openvino
            from tools.deploy.openvino.model import OpenVinoModel

            return _Compiled(OpenVinoModel(export_openvino(model.eval(), example, directory / "m.xml")), directory)
        if runtime == "onnxruntime":
            from tools.deploy.onnxruntime.export import export_onnx
            from tools.deploy.onnxruntime.session import OrtModel

            path = export_onnx(model.eval(), example[:1], directory / "m.onnx")
            return _Compiled(OrtModel(path, threads=torch.get_num_threads()), directory)
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    shutil.rmtree(directory, ignore_errors=True)
    raise ValueError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")


def latencies_in(
    models: Mapping[str, Callable[..., Any]], example: torch.Tensor, repeats: int = 10
) -> dict[str, float]:
    """Median batch-1 seconds of each compiled model (:func:`compiled_in`), interleaved in warm blocks."""
    return compare_latencies(dict(models), example[:1], warmup=2, repeats=repeats, block=SERVING_BLOCK)
