"""What every deployment backend is: the description it declares, the protocol it implements, what it reports.

A backend turns a float model and the layers a plan selects into a deployed artifact, and loads it back ready
to run (:class:`QuantizationBackend`: ``supported`` / ``save`` / ``load``, used by
:func:`tools.artifacts.io.save_compressed` and :func:`~tools.artifacts.io.load_compressed`). Each one also
declares, as attributes, what it is (:class:`Deployment`): its ``name``, the ``runtime`` that runs it, its
``precision`` (the label of reports), its ``float_reference`` (the FP32 backend of the same runtime, which its
speed-up is measured against) and the Python modules it ``requires``. The registry
(:mod:`tools.deploy.registry`) lists them; every table of names, runtimes and precisions is derived from there.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.deploy.accuracy import AccuracyControl
from tools.deploy.cpu import Int8Settings
from tools.schemas import QuantDType

Runtime = Literal["pytorch", "onnxruntime", "openvino"]
"""The runtime that runs a deployed model."""

#: The precision labels of the float backends: FP32 (exact), and bf16 (every float operation in bf16, which can cost
#: accuracy as int8 does). Int8 backends' labels start with "int8".
PRECISION_FP32 = "fp32"
PRECISION_BF16 = "bf16"
#: The module types whose weights static int8 quantizes (Conv and MatMul/Gemm operators): a plan's layers for it.
WEIGHTED_MODULES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d)


class QuantizationError(ValueError):
    """A quantization request that cannot be carried out."""


class BackendNotApplicable(QuantizationError):
    """The backend does not apply to this kind of model (fused attention for a CNN): not a failure."""


class QuantReport(BaseModel):
    backend: str
    layers: dict[str, QuantDType] = Field(default_factory=dict, description="module name -> dtype")
    unmatched: list[str] = Field(default_factory=list, description="patterns that selected no nn.Linear")
    notes: list[str] = Field(default_factory=list, description="what the backend could not do as asked")
    float_layers: dict[str, str] = Field(
        default_factory=dict,
        description="Layers an int8 backend could quantize but kept in float (mixed precision): layer -> why.",
    )
    int8: Int8Settings | None = Field(
        default=None,
        description="The CPU kind the int8 arithmetic is built for, its settings, and the CPU it was built and "
        "validated on (None: a float or torch backend, whose int8 does not depend on the CPU kind).",
    )
    runtime_properties: dict[str, str] = Field(
        default_factory=dict,
        description="The properties the runtime must compile the artifact with to compute what was validated "
        "(OpenVINO: INFERENCE_PRECISION_HINT, whose default is bf16 on CPUs with AMX).",
    )


QuantizedModel = Callable[[torch.Tensor], Any]
"""What a backend loads: an ``nn.Module`` (torch backends) or another callable ``pixel_values -> logits``."""


class Deployment(Protocol):
    """A way to deploy a model, as reports and the measured choice name it (the float model included)."""

    name: str
    runtime: Runtime
    precision: str
    float_reference: str
    requires: tuple[str, ...]
    #: Whether its int8 arithmetic depends on the CPU kind (VNNI or not): its report then carries ``int8``.
    cpu_dependent_int8: bool
    #: For a mixed-precision backend, the full-int8 backend it controls (built only when that one is over budget).
    mixed_of: str | None
    #: The deployment whose timing build (:class:`TimingBuild`) stands for this one where a model is timed as it would
    #: run (the latency objective's probes: ``tools.evaluation.runtime_latency``): itself, or the build of the same
    #: kernels (OpenVINO's int8 for its fast-bias and mixed builds; a runtime's FP32 for its dynamic int8).
    timed_as: str


@runtime_checkable
class TimingBuild(Protocol):
    """A deployment that builds a model for timing alone: the kernels it deploys, not its answers."""

    def timing_build(
        self, model: nn.Module, example: torch.Tensor, directory: Path, calibration: torch.Tensor
    ) -> QuantizedModel:
        """``model`` (float, eval mode) as this deployment runs it, its files in ``directory``; an int8 build
        calibrated on ``calibration`` (a few random images: the kernels, not the answers, are what is timed)."""
        ...


@dataclass(frozen=True)
class Build:
    """What a backend builds from (``QuantizationBackend.save``): the float model, the plan's report of what to
    quantize, where to write, and what some backends need besides: an example input (for the export), an in-memory
    ``qmodel`` already quantized by the backend, ``calibration`` images (static int8: preprocessed, N x C x H x W) and
    ``accuracy_control`` (mixed precision). One recipe object, not one keyword list copied into every backend."""

    float_model: nn.Module
    report: QuantReport
    out_dir: Path
    example_input: torch.Tensor | None = None
    qmodel: nn.Module | None = None
    calibration: torch.Tensor | None = None
    accuracy_control: AccuracyControl | None = None


class QuantizationBackend(Deployment, Protocol):
    """A quantization method and the artifact it deploys (one file, ``deployed_file``, in the artifact dir;
    a backend whose weights sit beside it names that file ``weights_file`` as well)."""

    deployed_file: str
    #: The module types whose weights it can quantize (a plan's layer patterns select among these).
    layer_kinds: tuple[type[nn.Module], ...]

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        """The targets this backend quantizes as asked, and notes on those it leaves in float."""
        ...

    def save(self, build: Build) -> QuantReport:
        """Quantize ``build.float_model`` as ``build.report`` says (or take ``build.qmodel``, already quantized by
        this backend) and write ``build.out_dir / deployed_file``; return the report as carried out. Its
        ``calibration`` is for backends that quantize activations statically (dynamic ones ignore it), its
        ``accuracy_control`` for mixed-precision backends, which keep layers in float until it holds."""
        ...

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        """The deployed model of ``out_dir``, ready to run on the CPU; ``rebuild()`` gives the float model
        (structure and placeholder weights) for backends that need one."""
        ...


@runtime_checkable
class ModuleBackend(QuantizationBackend, Protocol):
    """A backend that quantizes in memory into an ``nn.Module`` (what :func:`tools.deploy.registry.quantize` needs)."""

    def quantize(self, model: nn.Module, targets: dict[str, QuantDType]) -> nn.Module: ...

    def kept_float(self, model: nn.Module, targets: dict[str, QuantDType]) -> dict[str, str]:
        """The layers of ``targets`` that must stay float in ``model`` (layer -> why): those swapping the module
        would break."""
        ...


def importable(modules: Iterable[str]) -> bool:
    """Whether every one of ``modules`` can be imported here (found, not imported)."""
    return all(importlib.util.find_spec(module) is not None for module in modules)


__all__ = [
    "PRECISION_BF16",
    "PRECISION_FP32",
    "WEIGHTED_MODULES",
    "BackendNotApplicable",
    "Deployment",
    "ModuleBackend",
    "QuantReport",
    "QuantizationBackend",
    "QuantizationError",
    "QuantizedModel",
    "Runtime",
    "importable",
]
