"""Models timed in the runtime and precision a deployment runs them in: what ``--objective latency`` measures units by.

At batch 1 a CPU runtime's latency is not proportional to parameters or MACs: an int8 CNN costs per layer, so its
narrower channels barely pay while a removed block saves every call of its layers
(``benchmarks/channel_blocks.py``). The latency objective therefore measures what a unit saves where the model will
run: :func:`compiled_in` builds a float model for ``openvino`` (OpenVINO FP32), ``onnxruntime`` (ONNX Runtime FP32)
or ``pytorch`` (the module itself), OpenVINO's bf16 for ``openvino-bf16``, or an int8 one for ``openvino-int8``
(NNCF) and ``onnxruntime-int8`` (ONNX Runtime's static QDQ), calibrated on :data:`PROBE_CALIBRATION_IMAGES` random
images (NNCF's without bias correction: the kernels, not the answers, are what is timed), and :func:`latencies_in`
times several of them at batch 1, interleaved in warm blocks (:func:`tools.evaluation.cost.compare_latencies`), so
drift affects them alike. Where the original deploys in OpenVINO int8 or bf16, or in ONNX Runtime's static int8 (as
on CPUs without VNNI), the probes are timed in that precision (an int8 probe costs a calibration, about a second for
a CIFAR ResNet): the precisions do not rank units alike. CIFAR ResNet-20 on an AMX Xeon, each model timed for a
second against the original: cutting 24 of layer3.0.conv1's 64 channels ran 1.038x in FP32 and 0.993x in int8, 56
of layer3.1.conv1's 1.102x and 1.009x, removing the block layer3.1 1.158x and 1.079x; the runs' channel-pruned
rounds ran 0.92-0.96x in int8.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.clock import counts_as
from tools.evaluation.cost import SERVING_BLOCK, compare_latencies

__all__ = ["RUNTIMES", "compiled_in", "latencies_in"]

#: The runtimes a model can be timed in here.
RUNTIMES = ("pytorch", "onnxruntime", "onnxruntime-int8", "openvino", "openvino-bf16", "openvino-int8")

#: Seconds of calls at least behind each probe's timing (:func:`latencies_in`).
PROBE_TIMING_SECONDS = 0.5

#: Random images an int8 probe (``openvino-int8``, ``onnxruntime-int8``) is calibrated on: enough to place its
#: quantizers.
PROBE_CALIBRATION_IMAGES = 8


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


def _probe_images(example: torch.Tensor) -> torch.Tensor:
    """The random images an int8 probe is calibrated on (:data:`PROBE_CALIBRATION_IMAGES`, seeded)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(PROBE_CALIBRATION_IMAGES, *example.shape[1:], generator=generator)


def compiled_in(runtime: str, model: nn.Module, example: torch.Tensor) -> Callable[..., Any]:
    """``model`` (float, eval mode) as ``runtime`` runs it (see module doc); ``ValueError`` for another."""
    if runtime == "pytorch":
        return model.eval()
    directory = Path(tempfile.mkdtemp(prefix="profiling-agent-timed-"))
    try:
        if runtime in ("openvino", "openvino-bf16"):
            from tools.deploy.openvino.convert import export_openvino
            from tools.deploy.openvino.model import OpenVinoModel

            path = export_openvino(model.eval(), example, directory / "m.xml")
            precision = "bf16" if runtime == "openvino-bf16" else "f32"
            return _Compiled(OpenVinoModel(path, precision=precision), directory)
        if runtime == "openvino-int8":
            from tools.compression.heads import has_attention
            from tools.deploy.openvino.convert import convert_openvino, save_openvino
            from tools.deploy.openvino.model import OpenVinoModel
            from tools.deploy.openvino.quantize import quantize_openvino

            converted = convert_openvino(model.eval(), example[:1])
            quantized = quantize_openvino(
                converted, _probe_images(example), transformer=has_attention(model), bias_correction=False
            )
            return _Compiled(OpenVinoModel(save_openvino(quantized, directory / "m.xml")), directory)
        if runtime in ("onnxruntime", "onnxruntime-int8"):
            from tools.deploy.onnxruntime.export import export_onnx
            from tools.deploy.onnxruntime.quantize import static_quantize_onnx
            from tools.deploy.onnxruntime.session import OrtModel

            path = export_onnx(model.eval(), example[:1], directory / "m.onnx")
            if runtime == "onnxruntime-int8":
                path = static_quantize_onnx(  # the ranges kept with the probe: no other build shares its graph
                    path, directory / "m-int8.onnx", _probe_images(example), calibration_cache=directory / "r.json"
                )
            return _Compiled(OrtModel(path, threads=torch.get_num_threads()), directory)
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    shutil.rmtree(directory, ignore_errors=True)
    raise ValueError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")


@counts_as("time")
def latencies_in(
    models: Mapping[str, Callable[..., Any]], example: torch.Tensor, repeats: int = 10
) -> dict[str, float]:
    """Median batch-1 seconds of each compiled model (:func:`compiled_in`), interleaved in warm blocks, for at least
    :data:`PROBE_TIMING_SECONDS` of the fastest's calls (a unit's saving is a few per cent of a CIFAR ResNet's
    0.3 ms, which ten repetitions measure to about 3 %)."""
    return compare_latencies(
        dict(models), example[:1], warmup=2, repeats=repeats, block=SERVING_BLOCK, min_seconds=PROBE_TIMING_SECONDS
    )
