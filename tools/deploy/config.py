"""The deployment recipe: :class:`QuantizationConfig`, in the spirit of torchao's ``quantize_(model, config)``.

A recipe says *how* to deploy, independently of *what* (the plan's quantization recommendations say which
layers, to which dtype): the backend, checked against the registry (:data:`tools.deploy.registry.DEPLOY_CHOICES`)
when the config is built (``ValueError``), so a bad name fails at the start of a run rather than deep inside it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tools.deploy.registry import DEFAULT_BACKEND, DEPLOY_CHOICES


class QuantizationConfig(BaseModel):
    """How quantization recommendations are carried out (per-layer dtypes are the plan's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(
        default=DEFAULT_BACKEND,
        description="A name of BACKENDS; auto (a run deploys the fastest it measures; a single "
        "quantize call takes ONNX Runtime where installed); torch (deploy the float model as it is).",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in DEPLOY_CHOICES:
            raise ValueError(f"unknown deployment backend {value!r}: choose one of {', '.join(DEPLOY_CHOICES)}")
        return value


__all__ = ["QuantizationConfig"]
