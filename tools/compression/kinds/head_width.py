"""Head width: every head of one attention module narrowed by the same count of dimensions (``head_dim``).

Every head is kept and ``round(ratio * head_dim)`` of each head's dimensions are removed (at least one is kept), the
same number in every head (the forward reshapes Q, K and V by one ``head_dim``): query/key dimensions by the product
of their q and k row norms, value dimensions by the data-aware score of o's input channels where there is one. The
attention keeps its softmax scale (:func:`tools.compression.heads.narrow_heads_of`); narrowed widths are rounded to
``PruningConfig.head_round_to``. A unit is one attention module whose class can be narrowed.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from tools.compression.heads import AttentionSpec, HeadPruner, narrow_heads_of
from tools.compression.kinds.base import PruningSession, exact_name
from tools.compression.kinds.heads import AttentionKind
from tools.compression.recipes import PruningConfig
from tools.compression.reports import PrunableLayers
from tools.schemas import LayerProfile, SensitivityUnit

__all__ = ["HeadWidth"]


class HeadWidth(AttentionKind):
    name = "head_dim"
    label = "head width"
    counts = "dims/head"
    flavour = "head_width"
    removes = "dimensions of every head"
    keywords = ("head dim", "head width", "head size", "narrow")
    description = "keeps the heads of each selected attention module and narrows them all by that share"

    def find(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        return [
            SensitivityUnit(
                pattern=exact_name(query),
                pruning_type=self.name,
                kind=self.flavour,
                modules=[query.rpartition(".")[0]],
                size=int(dim),
            )
            for query, dim in prunable.head_dims.items()
        ]

    def selectable(self, prunable: PrunableLayers) -> dict[str, list[str]]:
        narrowable = {query.rpartition(".")[0] for query in prunable.head_dims}
        return {h: names for h, names in super().selectable(prunable).items() if h in narrowable}

    def _detail(self, members: Sequence[str], prunable: PrunableLayers) -> str:
        dims = {d for q, d in prunable.head_dims.items() if q.rpartition(".")[0] in set(members)}
        shown = "/".join(str(d) for d in sorted(dims))
        return f" whose heads of {shown} dimensions can be narrowed" if shown else ""

    status = "narrowable"

    def group_status(self, members: Sequence[str], prunable: PrunableLayers) -> str | None:
        hit = [m for m in members if m in self.selectable(prunable)]
        return f"{self.status} ({self.name!r})" if hit else None

    def step(self, unit: SensitivityUnit, config: PruningConfig) -> int:
        return config.head_round_to

    def size(self, model: nn.Module, unit: SensitivityUnit) -> int:
        return unit.size

    def _pruner(self, session: PruningSession, ratio: float) -> HeadPruner:
        cut = self._cut(session, ratio)

        def prune(name: str, module: nn.Module, spec: AttentionSpec, parent: nn.Module) -> tuple[int, int] | str:
            return narrow_heads_of(module, spec, cut)

        return prune
