"""Heads: one attention module's whole heads (``head``).

``layer`` is a regex matched against the name of a head-prunable attention module (:data:`tools.compression.heads.
ATTENTION_SPECS`: Hugging Face's and timm's classes, ``nn.MultiheadAttention`` split into q/k/v/o layers by
:mod:`tools.compression.mha`) *or* the names of its q/k/v/o projections. ``round(ratio * heads)`` heads are removed
(at least one is kept), ranked by the norm of each head's q/k/v rows and o columns (or the data-aware score of o's
inputs), with their q/k/v rows and o columns, so the residual width is kept. A unit is one attention module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from torch import nn

from tools.compression.heads import (
    ATTENTION_SPECS,
    AttentionSpec,
    HeadCut,
    HeadPruner,
    apply_heads,
    head_targets,
    prune_heads_of,
)
from tools.compression.kinds.base import PruningSession, UnitKind, exact_name, layer_shares, layers_inside
from tools.compression.mha import split_selected_
from tools.compression.reports import AppliedPruning, PrunableLayers, SkippedPruning
from tools.schemas import LayerProfile, PruningRecommendation, SensitivityUnit

__all__ = ["Heads"]


class AttentionKind(UnitKind):
    """What the two attention kinds share: their units are attention modules, selected by name or projection."""

    noun = "head-prunable attention module"
    projections: ClassVar[tuple[str, ...]] = tuple(
        sorted({p for spec in ATTENTION_SPECS.values() for p in spec.projections})
    )

    def selectable(self, prunable: PrunableLayers) -> dict[str, list[str]]:
        return {h: [h, *(f"{h}.{p}" for p in self.projections)] for h in prunable.heads}

    def prompt_lines(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[float, str]]:
        from tools.profiling.profile import name_pattern

        rows = []
        units = self.selectable(prunable)
        for pattern in sorted({name_pattern(h) for h in units}):
            members = [h for h in units if re.search(pattern, h)]
            latency, shares = layer_shares(layers_inside(layers, members))
            detail = self._detail(members, prunable)
            rows.append(
                (
                    latency,
                    f"- {pattern} : {len(members)} attention modules{detail}; with their q/k/v/o projections {shares}",
                )
            )
        return rows

    def _detail(self, members: Sequence[str], prunable: PrunableLayers) -> str:
        return ""

    status: ClassVar[str] = "head-prunable"

    def group_status(self, members: Sequence[str], prunable: PrunableLayers) -> str | None:
        hit = [m for m in members if m in self.selectable(prunable)]
        counts = "/".join(str(c) for c in sorted({prunable.heads[m] for m in hit if m in prunable.heads}))
        return f"{self.status} ({counts} heads each; {self.name!r})" if hit else None

    def involved(self, unit: SensitivityUnit, layers: Sequence[str], consumers: Sequence[str]) -> list[str]:
        return [name for name in layers if any(name.startswith(m + ".") for m in unit.modules)]

    def prepare(self, model: nn.Module, regexes: Sequence[re.Pattern[str]], inputs: object) -> None:
        split_selected_(model, regexes)  # nn.MultiheadAttention's heads are pruned as q/k/v/o layers (exact)

    def matches(self, session: PruningSession, regex: re.Pattern[str]) -> bool:
        return bool(head_targets(session.model, regex))

    def _pruner(self, session: PruningSession, ratio: float) -> HeadPruner:
        raise NotImplementedError

    def _cut(self, session: PruningSession, ratio: float) -> HeadCut:
        """What each attention module a recommendation at ``ratio`` selects loses, under the session's settings."""
        config = session.config
        return HeadCut(ratio, config.importance, session.generator, session.scores, config.head_round_to)

    def apply(
        self, session: PruningSession, rec: PruningRecommendation, regex: re.Pattern[str]
    ) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
        ctx = session.context
        applied, skipped, changed = apply_heads(
            session.model, session.inputs, ctx.num_classes, rec, regex, self._pruner(session, rec.pruning_ratio)
        )
        if changed:
            ctx.dg = None  # shapes changed outside the dependency graph: retrace when needed
        return applied, skipped


class Heads(AttentionKind):
    name = "head"
    label = "attention heads"
    counts = "heads"
    flavour = "heads"
    removes = "attention heads"
    keywords = ("head",)
    uniform = True
    description = "removes that share of whole heads of each selected attention module (by name or q/k/v/o)"

    def find(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        return [
            SensitivityUnit(
                pattern=exact_name(name), pruning_type=self.name, kind=self.flavour, modules=[name], size=int(n)
            )
            for name, n in prunable.heads.items()
            if int(n) > 1
        ]

    def size(self, model: nn.Module, unit: SensitivityUnit) -> int:
        return unit.size

    def _detail(self, members: Sequence[str], prunable: PrunableLayers) -> str:
        counts = "/".join(str(c) for c in sorted({prunable.heads[m] for m in members if m in prunable.heads}))
        return f" with {counts} heads each" if counts else ""

    def level_targets(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[list[str], str]]:
        from tools.profiling.profile import name_pattern

        targets = []
        for pattern in sorted({name_pattern(h) for h in prunable.heads}):
            members = [h for h in prunable.heads if re.search(pattern, h)]
            counts = "/".join(str(c) for c in sorted({prunable.heads[h] for h in members}))
            why = (
                f"{len(members)} attention modules ({counts} heads each); whole heads are removed with their q/k/v "
                "rows and output columns, so the residual width is kept."
            )
            targets.append((members, why))
        return targets

    def _pruner(self, session: PruningSession, ratio: float) -> HeadPruner:
        cut = self._cut(session, ratio)

        def prune(name: str, module: nn.Module, spec: AttentionSpec, parent: nn.Module) -> tuple[int, int] | str:
            return prune_heads_of(module, spec, cut, parent)

        return prune
