"""The deployment recipe: :class:`QuantizationConfig`, in the spirit of torchao's ``quantize_(model, config)``.

A recipe says *how* to deploy, independently of *what* (the plan's quantization recommendations say which
layers, to which dtype): the backend and the CPU kind int8 is built for, checked against the registry
(:data:`tools.deploy.registry.DEPLOY_CHOICES`) and :data:`tools.deploy.cpu.INT8_TARGETS` when the config is built
(``ValueError``), so a bad name fails at the start of a run rather than deep inside it. :func:`build_quantized`
carries a recipe out on a model: its backend's build, or, for ``auto``, the default backend's should that one fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from tools.deploy.base import ModuleBackend, QuantizationError, QuantReport
from tools.deploy.cpu import INT8_TARGETS
from tools.deploy.onnxruntime.export import OnnxRuntimeError
from tools.deploy.registry import AUTO, DEFAULT_BACKEND, DEPLOY_CHOICES, get_backend, plan_quantization
from tools.models.base import example_input
from tools.schemas import InputShape, QuantizationRecommendation

logger = logging.getLogger(__name__)


def _one_of(value: str, choices: Sequence[str], what: str) -> str:
    """``value``, when it is one of ``choices`` (``ValueError`` naming them otherwise)."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


class QuantizationConfig(BaseModel):
    """How quantization recommendations are carried out (per-layer dtypes are the plan's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(
        default=DEFAULT_BACKEND,
        description="A name of BACKENDS; auto (a run deploys the fastest it measures; a single "
        "quantize call takes ONNX Runtime where installed); torch (deploy the float model as it is).",
    )

    int8_cpu: str = Field(
        default="auto",
        description="The CPU kind int8 is built for: auto (this machine's), vnni (AVX512-VNNI, AVX-VNNI, AMX: full "
        "8-bit weights), no-vnni (AVX2, AVX-512 without VNNI: 7-bit weights, NNCF overflow fix; holds on every x86 "
        "CPU). tools.deploy.cpu.",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return _one_of(value, DEPLOY_CHOICES, "deployment backend")

    @field_validator("int8_cpu")
    @classmethod
    def _known_target(cls, value: str) -> str:
        return _one_of(value, INT8_TARGETS, "int8 CPU kind")


def build_quantized(
    model: nn.Module,
    recommendations: Sequence[QuantizationRecommendation],
    backend: str,
    target: str,
    shape: InputShape | None,
    resolve_shape: Callable[[], InputShape],
    save: Callable[..., object],
) -> QuantReport:
    """``model``'s quantization as ``recommendations`` ask, planned with ``backend``
    (:func:`~tools.deploy.registry.plan_quantization`; int8 for the CPU kind ``target``) and built with
    ``save(report=, example_input=)``: a backend that exports the model is given an input of ``shape`` (default:
    ``resolve_shape()``), an in-memory one only of a ``shape`` given. With ``auto``, should the backend it takes fail
    (``OnnxRuntimeError``, ``QuantizationError``), :data:`DEFAULT_BACKEND`'s build instead, with a note and a
    warning. Returns the report built."""
    report = plan_quantization(model, recommendations, backend=backend, int8_cpu=target)
    exports = not isinstance(get_backend(report.backend), ModuleBackend)  # an in-memory backend needs no input
    example = example_input(shape or resolve_shape()) if shape or exports else None
    try:
        save(report=report, example_input=example)
    except (OnnxRuntimeError, QuantizationError) as exc:
        if backend != AUTO or report.backend == DEFAULT_BACKEND:
            raise
        why, failed = (str(exc).splitlines() or [type(exc).__name__])[0], report.backend
        logger.warning("%s quantization failed (%s); falling back to %s", failed, why, DEFAULT_BACKEND)
        report = plan_quantization(model, recommendations, backend=DEFAULT_BACKEND)
        report.notes.append(f"--quant-backend auto: {failed} failed ({why}); used {DEFAULT_BACKEND}")
        save(report=report, example_input=example)
    return report


__all__ = ["QuantizationConfig", "build_quantized"]
