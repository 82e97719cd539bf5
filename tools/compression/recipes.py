"""Compression recipes as config objects, in the spirit of torchao's ``quantize_(model, config)``.

A recipe says *how* to compress, independently of *what* (the plan's recommendations say which layers, by
how much): :class:`PruningConfig` for :func:`tools.compression.pruning.apply_pruning` and ``tools.stages.ops.prune``,
:class:`RecoveryConfig` for :func:`tools.compression.recovery.recover_`. Fields are checked against their
registries when a config is built (``ValueError``, one line per field), so a bad name fails at the start of a
run rather than deep inside it. The deployment recipe, ``QuantizationConfig``, is :mod:`tools.deploy.config`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tools.compression.importance import IMPORTANCE, unknown_importance
from tools.compression.recovery import RecoveryConfig


class PruningConfig(BaseModel):
    """How pruning recommendations are applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    importance: str = Field(
        default="act", description="Channel/head importance: a name of IMPORTANCE (act, taylor, l1, l2, random)."
    )
    round_to: int = Field(
        default=0,
        description="Round kept channel counts to a multiple of this (0: off, the exact ratio; a run's default "
        "is 8, the counts int8 kernels run fastest: agents.context).",
    )
    head_round_to: int = Field(
        default=0,
        description="Round narrowed head widths (head_dim pruning) to a multiple of this (0: off, the exact "
        "ratio; a run's default is 8).",
    )
    seed: int = Field(default=0, description="Seed for random importance.")
    max_ratio: float = Field(
        default=0.9, description="Highest per-unit pruning ratio a plan may use (``--max-pruning-ratio``)."
    )
    kinds: tuple[str, ...] = Field(
        default=(),
        description="The unit kinds (pruning types of tools.compression.units.UNIT_KINDS) a planner may use; empty: "
        "every one (the run checks the names: agents.context).",
    )

    def allows(self, pruning_type: str) -> bool:
        """Whether a plan may use the unit kind ``pruning_type``."""
        return not self.kinds or pruning_type in self.kinds

    @field_validator("importance")
    @classmethod
    def _known_importance(cls, value: str) -> str:
        if value not in IMPORTANCE:
            raise ValueError(unknown_importance(value))
        return value

    @field_validator("round_to", "head_round_to")
    @classmethod
    def _non_negative_round_to(cls, value: int, info: ValidationInfo) -> int:
        if value < 0:
            raise ValueError(f"{info.field_name} must be 0 (off) or a positive integer, got {value}")
        return value

    @field_validator("max_ratio")
    @classmethod
    def _ratio_in_range(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError(f"max_ratio must be in (0, 1), got {value}")
        return value


__all__ = ["PruningConfig", "RecoveryConfig"]
