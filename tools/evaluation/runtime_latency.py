"""Models timed in the runtime and precision a deployment runs them in: what ``--objective latency`` measures units by.

At batch 1 a CPU runtime's latency is not proportional to parameters or MACs: an int8 CNN costs per layer, so its
narrower channels barely pay while a removed block saves every call of its layers
(``benchmarks/channel_blocks.py``). The latency objective therefore measures what a unit saves where the model will
run: :func:`compiled_in` builds it with the timing build of a deployment of the registry
(``tools.deploy.registry.TIMED``: ``openvino`` FP32, ``onnxruntime-fp32``, ``torch`` (the module itself),
``openvino-bf16``, or int8 ``openvino-int8`` (NNCF) and ``onnxruntime-static`` (ONNX Runtime's QDQ), calibrated on
:data:`PROBE_CALIBRATION_IMAGES` random images (NNCF's without bias correction: the kernels, not the answers, are what
is timed); every other deployment names the one that stands for it, ``Deployment.timed_as``), and :func:`latencies_in`
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

__all__ = ["compiled_in", "latencies_in", "latency_saving"]

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


def compiled_in(name: str, model: nn.Module, example: torch.Tensor) -> Callable[..., Any]:
    """``model`` (float, eval mode) as the deployment ``name`` (one of ``tools.deploy.registry.TIMED``) runs it,
    for timing: its registry entry's timing build (``tools.deploy.base.TimingBuild``), an int8 one calibrated on
    :data:`PROBE_CALIBRATION_IMAGES` random images; ``ValueError`` for another name."""
    from tools.deploy.registry import timing_build

    build = timing_build(name)
    directory = Path(tempfile.mkdtemp(prefix="profiling-agent-timed-"))
    try:
        return _Compiled(build.timing_build(model, example, directory, _probe_images(example)), directory)
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise


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


def latency_saving(name: str, original: nn.Module, example: torch.Tensor) -> Callable[[nn.Module], float]:
    """What a model runs faster than ``original`` as the deployment ``name`` runs it (:func:`compiled_in`), batch 1,
    the two timed interleaved (:func:`latencies_in`): the latency objective's measure of a unit."""
    from tools.models.base import clone_module

    reference = compiled_in(name, clone_module(original).cpu(), example)

    def saving(model: nn.Module) -> float:
        times = latencies_in({"original": reference, "probe": compiled_in(name, model.cpu(), example)}, example)
        return times["original"] - times["probe"]

    return saving
