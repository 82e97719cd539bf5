"""What a unit kind is: the one place that knows how its units are found, pruned, probed, checked and described.

A *unit* (:class:`tools.schemas.SensitivityUnit`) is what a plan addresses on its own; its *kind* is the pruning type
of the recommendations that act on it (``PruningRecommendation.pruning_type``, the key of the registry
:data:`tools.compression.units.UNIT_KINDS`). A kind is one subclass of :class:`UnitKind` in its own module of this
package; nothing else in the project tests a kind's name: the pruner (:func:`tools.compression.pruning.apply_pruning`),
the sensitivity profile, the planners' allocation and checks, the LLM prompt and the reports ask the kind. A new
kind is one module and one line of the registry.

While one :func:`~tools.compression.pruning.apply_pruning` call runs, the kinds share a :class:`PruningSession`: the
model, its example inputs, the importance criterion and the channels claimed so far.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from tools.compression.channels import PruningContext
from tools.compression.recipes import PruningConfig
from tools.compression.reports import AppliedPruning, PrunableLayers, SkippedPruning
from tools.schemas import LayerProfile, PruningRecommendation, SensitivityUnit

__all__ = ["PruningSession", "UnitKind", "exact_name", "layer_shares", "layers_inside"]


def exact_name(name: str) -> str:
    """The regex that selects exactly the module ``name``."""
    return "^" + re.escape(name) + "$"


def layers_inside(layers: Sequence[LayerProfile], members: Sequence[str]) -> list[LayerProfile]:
    """The profiled ``layers`` that are one of the modules ``members`` or inside one."""
    return [lp for lp in layers if any(lp.name == m or lp.name.startswith(f"{m}.") for m in members)]


def layer_shares(found: Sequence[LayerProfile]) -> tuple[float, str]:
    """The share of the latency ``found`` takes, and its shares of the latency, MACs and parameters for the LLM
    prompt (``1.0% of latency, 2.0% of MACs, 3.0% of parameters``)."""
    latency = sum(lp.latency_share for lp in found)
    return latency, (
        f"{100 * latency:.1f}% of latency, {100 * sum(lp.macs_share for lp in found):.1f}% of MACs, "
        f"{100 * sum(lp.params_share for lp in found):.1f}% of parameters"
    )


@dataclass
class PruningSession:
    """One :func:`~tools.compression.pruning.apply_pruning` call: what its recommendations share."""

    model: nn.Module
    inputs: Any
    config: PruningConfig
    context: PruningContext
    importance: Any
    """The channel importance criterion (Torch-Pruning's interface)."""
    scores: dict[nn.Module, torch.Tensor] | None
    """Data-aware input-channel scores by module (None: the criterion is not data-aware)."""
    generator: torch.Generator
    claimed: dict[nn.Module, str] = field(default_factory=dict)
    """Modules whose output channels a recommendation of this call pruned already, with which one."""
    memo: dict[str, Any] = field(default_factory=dict)
    """What a kind found in the model once per call (its blocks), by the kind's name."""


class UnitKind(ABC):
    """One kind of unit (see module doc). Class attributes say what it is; methods do what it does."""

    name: ClassVar[str]
    """The pruning type of its recommendations, and its key in the registry."""
    label: ClassVar[str]
    """What a unit of it is, for people: ``attention heads``."""
    counts: ClassVar[str]
    """What its applied counts count, short: ``ch``, ``heads``."""
    removes: ClassVar[str]
    """What a ratio of one unit removes: ``output channels``."""
    keywords: ClassVar[tuple[str, ...]] = ()
    """Words an LLM may call it by (``head width``): :func:`tools.compression.units.kind_named`. A kind whose words
    contain another's is asked first (``head_width`` before ``heads``)."""
    flavour: ClassVar[str] = ""
    """Its units' ``SensitivityUnit.kind`` where they have one flavour (``heads``)."""
    whole: ClassVar[bool] = False
    """A unit is removed whole (ratio 1) or not at all, never by a share."""
    sheds_layers: ClassVar[bool] = False
    """Removing a unit removes whole layers, and their fixed cost per call with them: at batch 1 latency may fall
    by more than MACs do (channels, heads and head width leave every layer in place, and latency falls by less)."""
    uniform: ClassVar[bool] = False
    """The uniform baselines prune every unit of this kind at one ratio (the paper's: channels and heads)."""
    description: ClassVar[str] = ""
    """For the LLM planner, short: what a recommendation of this kind removes (``pruning_type X removes ...``)."""

    def removes_of(self, unit: SensitivityUnit) -> str:
        """What a ratio of ``unit`` removes (a kind whose units come in flavours says it per flavour)."""
        return self.removes

    # --- finding --------------------------------------------------------------------------------------------

    @abstractmethod
    def find(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        """Every unit of this kind in a model's prunable record (in forward order)."""

    @abstractmethod
    def selectable(self, prunable: PrunableLayers) -> dict[str, list[str]]:
        """Each prunable module of this kind -> the names a pattern may select it by (itself, its projections)."""

    def patterns(self, prunable: PrunableLayers) -> list[str]:
        """Patterns of its prunable modules, for messages."""
        from tools.profiling.profile import name_pattern

        return sorted({name_pattern(n) for n in self.selectable(prunable)})

    def level_targets(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[list[str], str]]:
        """What the rules planner prunes at one global level where there is no sensitivity profile: groups of this
        kind's modules (the same layer repeated across blocks), each with why. Default: none."""
        return []

    # --- ratios -----------------------------------------------------------------------------------------------

    def step(self, unit: SensitivityUnit, config: PruningConfig) -> int:
        """What ``unit``'s kept count is rounded to under ``config`` (its ``size`` known); 0: any count."""
        return 0

    def reachable(self, unit: SensitivityUnit, ratio: float) -> float:
        """The share of ``unit`` (``size`` and ``step`` set) that pruning at ``ratio`` really removes (4 decimals)."""
        from tools.compression.heads import kept_count

        if self.whole:
            return 1.0 if ratio > 0 else 0.0
        if unit.size <= 0:
            return round(ratio, 4)
        return round(1.0 - kept_count(unit.size, ratio, unit.step) / unit.size, 4)

    def allowed(self, ratio: float, max_ratio: float) -> bool:
        """Whether a plan may prune a unit at ``ratio`` under the run's highest ratio (whole units: at 1)."""
        return ratio <= 1.0 + 1e-9 if self.whole else ratio <= max_ratio + 1e-9

    def admits(
        self, unit: SensitivityUnit, chosen: Sequence[SensitivityUnit], units: Sequence[SensitivityUnit]
    ) -> bool:
        """Whether a plan that prunes ``chosen`` (units of any kind) may prune ``unit`` too; ``units``: every unit of
        the profile. Default: always."""
        return True

    def probe_ratios(self, ratios: Sequence[float], max_ratio: float) -> list[float]:
        """The ratios the sensitivity profile probes a unit at."""
        return [1.0] if self.whole else sorted({float(r) for r in ratios if 0 < r <= max_ratio})

    def size(self, model: nn.Module, unit: SensitivityUnit) -> int:
        """The count a ratio is a share of (output channels of the unit's first module)."""
        module = model.get_submodule(unit.modules[0])
        return int(getattr(module, "out_channels", getattr(module, "out_features", 0)))

    def involved(self, unit: SensitivityUnit, layers: Sequence[str], consumers: Sequence[str]) -> list[str]:
        """The profiled layers whose MACs and latency pruning ``unit`` shrinks (for the saving it is credited)."""
        return list(dict.fromkeys([*unit.modules, *unit.members, *consumers]))

    # --- pruning ----------------------------------------------------------------------------------------------

    traced: ClassVar[bool] = False
    """Its pruning needs the model's dependency graph traced before the first recommendation."""

    def prepare(self, model: nn.Module, regexes: Sequence[re.Pattern[str]], inputs: Any) -> None:  # noqa: B027
        """Make the modules ``regexes`` select prunable by this kind before anything is scored (default: nothing)."""

    @abstractmethod
    def matches(self, session: PruningSession, regex: re.Pattern[str]) -> bool:
        """Whether ``regex`` selects anything this kind can prune in the session's model."""

    @abstractmethod
    def apply(
        self, session: PruningSession, rec: PruningRecommendation, regex: re.Pattern[str]
    ) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
        """Apply one recommendation of this kind IN PLACE, checked and rolled back where it breaks the forward."""

    noun: ClassVar[str] = "prunable module"
    """What a module a pattern of this kind may select is called in messages: ``head-prunable attention module``."""

    @property
    def nothing_matches(self) -> str:
        """The reason a recommendation whose pattern selects nothing is skipped."""
        return f"no {self.noun} matches"

    # --- describing -------------------------------------------------------------------------------------------

    def prompt_lines(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[float, str]]:
        """The LLM prompt's lines on this kind's modules: (latency share, line) per group of them."""
        from tools.profiling.profile import name_pattern

        names = list(self.selectable(prunable))
        by_pattern: dict[str, list[str]] = {}
        for name in names:
            by_pattern.setdefault(name_pattern(name), []).append(name)
        rows = []
        for pattern, members in by_pattern.items():
            latency, shares = layer_shares(layers_inside(layers, members))
            rows.append((latency, f"- {pattern} : {len(members)} {self.noun}s; {shares}"))
        return rows

    def group_status(self, members: Sequence[str], prunable: PrunableLayers) -> str | None:
        """How a profile group of ``members`` is prunable by this kind, for the LLM prompt (None: not at all)."""
        hit = [m for m in members if m in self.selectable(prunable)]
        return f"{self.noun}s ({len(hit)}; pruning_type {self.name!r})" if hit else None
