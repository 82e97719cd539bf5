"""What pruning reports: recommendations applied or skipped, parameter counts, and what a model can prune."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tools.schemas import PruningType


class AppliedPruning(BaseModel):
    """One recommendation as applied: what it pruned and by how much (channels or heads, summed)."""

    pattern: str
    pruning_type: PruningType
    ratio: float
    modules: list[str] = Field(description="Pruned modules: group roots (structured) or attention modules.")
    before: int = Field(
        description="Output channels (structured), heads (head) or per-head dimensions (head_dim) of `modules`, before."
    )
    after: int = Field(description="The same count after pruning.")
    consumers: list[str] = Field(
        default_factory=list,
        description="Conv2d/Linear layers whose input channels were pruned with them (what recovery refits).",
    )
    kept_outputs: dict[str, list[bool]] = Field(
        default_factory=dict,
        exclude=True,  # for recovery in the same process, not for the record
        description="Conv2d/Linear layer -> which of the output channels it had it kept (a mask).",
    )


class SkippedPruning(BaseModel):
    """A module (or a whole pattern) that a recommendation targeted but that was left untouched."""

    target: str = Field(description="Module name, or the recommendation's pattern when nothing matched.")
    reason: str


class PruneReport(BaseModel):
    applied: list[AppliedPruning] = Field(default_factory=list)
    skipped: list[SkippedPruning] = Field(default_factory=list)
    params_before: int
    params_after: int

    def consumers(self) -> list[str]:
        """Every layer whose input channels were pruned, each once, in the order pruned."""
        return list(dict.fromkeys(c for a in self.applied for c in a.consumers))

    def kept_outputs(self) -> dict[str, list[bool]]:
        """Each layer whose output channels were pruned -> which it kept (a layer's outputs are pruned once in a
        prune), for refitting a consumer whose own outputs were pruned too."""
        return {name: kept for a in self.applied for name, kept in a.kept_outputs.items()}


class PrunableLayers(BaseModel):
    """What ``apply_pruning`` can prune in a model (each unit kind finds its units in it).

    ``structured``: Conv2d/Linear names (forward order) whose output channels can be pruned.
    ``heads``: attention-module name -> number of heads, for head pruning.
    ``head_dims``: query-projection name -> head_dim, for narrowing heads (``head_dim`` pruning).
    ``blocked``: Conv2d/Linear name -> why its output channels are not prunable.
    """

    structured: list[str] = Field(default_factory=list)
    heads: dict[str, int] = Field(default_factory=dict)
    head_dims: dict[str, int] = Field(
        default_factory=dict,
        description="Query projection of each attention whose heads can be narrowed -> its head_dim (a head_dim "
        "recommendation selects the attention module through that projection).",
    )
    blocked: dict[str, str] = Field(default_factory=dict)
    coupling: dict[str, int] = Field(
        default_factory=dict,
        description="structured name -> Conv2d/Linear layers whose outputs are pruned with it (1: internal "
        "to its block; more: coupled, e.g. through a residual add).",
    )
    groups: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Coupled groups (coupling > 1): the first member in forward order -> every Conv2d/Linear whose "
        "output channels are pruned together (a residual stage's stream, a mobile block's expansion and depthwise "
        "convolutions). Pruning the first member prunes them all.",
    )
    grouped_convs: list[str] = Field(
        default_factory=list, description="Prunable Conv2d layers with groups > 1 (depthwise): a mobile block's."
    )
    blocks: dict[str, int] = Field(
        default_factory=dict,
        description="Removable blocks (tools.compression.kinds.blocks) -> the output layout of what replaces them.",
    )


__all__ = ["AppliedPruning", "PrunableLayers", "PruneReport", "SkippedPruning"]
