"""The deployment recipe: :class:`QuantizationConfig`, in the spirit of torchao's ``quantize_(model, config)``.

A recipe says *how* to deploy, independently of *what* (the plan's quantization recommendations say which
layers, to which dtype): the backend and the CPU kind int8 is built for, checked against the registry
(:data:`tools.deploy.registry.DEPLOY_CHOICES`) and :data:`tools.deploy.cpu.INT8_TARGETS` when the config is built
(``ValueError``), so a bad name fails at the start of a run rather than deep inside it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tools.deploy.cpu import INT8_TARGETS
from tools.deploy.registry import DEFAULT_BACKEND, DEPLOY_CHOICES


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
        if value not in DEPLOY_CHOICES:
            raise ValueError(f"unknown deployment backend {value!r}: choose one of {', '.join(DEPLOY_CHOICES)}")
        return value

    @field_validator("int8_cpu")
    @classmethod
    def _known_target(cls, value: str) -> str:
        if value not in INT8_TARGETS:
            raise ValueError(f"unknown int8 CPU kind {value!r}: choose one of {', '.join(INT8_TARGETS)}")
        return value


__all__ = ["QuantizationConfig"]
