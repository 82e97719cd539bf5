"""The registry of unit kinds, and what the rest of the project asks of a unit through it.

A *unit* (:class:`tools.schemas.SensitivityUnit`) is what a plan can address on its own: pruned alone by the
sensitivity profile, allocated a ratio by the planners and named in a recommendation by its ``pattern``. Its kind is
its recommendations' pruning type; each kind is one module of :mod:`tools.compression.kinds` that owns everything the
kind does (:class:`~tools.compression.kinds.base.UnitKind`), and one line of :data:`UNIT_KINDS`:

``structured``  channels: a Conv2d/Linear's output channels with their coupled group (:mod:`.kinds.channels`)
``head``        one attention module's whole heads (:mod:`.kinds.heads`)
``head_dim``    the width of every head of one attention module (:mod:`.kinds.head_width`)
``block``       a whole residual block or transformer layer, replaced by its input (:mod:`.kinds.blocks`)

A new kind is one module and one line here (``tests/unit/test_unit_kinds.py`` says so). A ratio is not always what
pruning removes: kept counts are whole heads, channel counts rounded to ``round_to``, whole blocks (:func:`unit_step`,
:func:`reachable_ratio`); the sensitivity profile measures, and the planners allocate, reachable ratios only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tools.compression.kinds.base import UnitKind, exact_name
from tools.compression.kinds.blocks import Blocks
from tools.compression.kinds.channels import Channels
from tools.compression.kinds.head_width import HeadWidth
from tools.compression.kinds.heads import Heads
from tools.compression.recipes import PruningConfig
from tools.compression.reports import PrunableLayers
from tools.schemas import LayerProfile, OptimizationPlan, SensitivityUnit

__all__ = [
    "UNIT_KINDS",
    "UnitKind",
    "kind_named",
    "kind_of",
    "prunable_units",
    "reachable_ratio",
    "sheds_layers",
    "unit_kind",
    "unit_pattern",
    "unit_step",
]

#: Every unit kind, by the pruning type of its recommendations.
UNIT_KINDS: dict[str, UnitKind] = {kind.name: kind for kind in (Channels(), Heads(), HeadWidth(), Blocks())}


def unit_pattern(name: str) -> str:
    """The regex that selects exactly the module ``name``."""
    return exact_name(name)


def kind_of(pruning_type: str) -> UnitKind:
    """The kind of recommendations of ``pruning_type`` (``ValueError`` naming the kinds when there is none)."""
    try:
        return UNIT_KINDS[pruning_type]
    except KeyError:
        raise ValueError(
            f"unknown pruning_type {pruning_type!r}: choose one of {', '.join(map(repr, UNIT_KINDS))}"
        ) from None


def kind_named(text: str) -> UnitKind | None:
    """The kind ``text`` names: its registry name, else one of its keywords (``head width``); the kinds with the
    longest keywords are asked first, so that ``head width`` is not read as ``head``. None: no kind."""
    if text in UNIT_KINDS:
        return UNIT_KINDS[text]
    words = re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()
    ranked = sorted(UNIT_KINDS.values(), key=lambda k: -max((len(w) for w in k.keywords), default=0))
    return next((kind for kind in ranked if any(w in words for w in kind.keywords)), None)


def sheds_layers(plan: OptimizationPlan | None) -> bool:
    """Whether ``plan`` removes whole layers (a recommendation of a unit kind that ``sheds_layers``: blocks)."""
    return plan is not None and any(kind_of(r.pruning_type).sheds_layers for r in plan.pruning_recommendations)


def unit_kind(unit: SensitivityUnit) -> UnitKind:
    """The registered kind of ``unit``."""
    return kind_of(unit.pruning_type)


def prunable_units(
    prunable: PrunableLayers | dict[str, object], layers: Sequence[LayerProfile] = ()
) -> list[SensitivityUnit]:
    """Every unit of ``prunable`` (``ops.prunable``'s record), kind by kind in :data:`UNIT_KINDS` order."""
    record = PrunableLayers.model_validate(prunable)
    return [unit for kind in UNIT_KINDS.values() for unit in kind.find(record, layers)]


def unit_step(unit: SensitivityUnit, config: PruningConfig) -> int:
    """What ``unit``'s kept count is rounded to under ``config`` (its ``size`` known); its kind decides."""
    return unit_kind(unit).step(unit, config)


def reachable_ratio(unit: SensitivityUnit, ratio: float) -> float:
    """The share of ``unit`` (``size`` and ``step`` set) that pruning at ``ratio`` really removes (4 decimals)."""
    return unit_kind(unit).reachable(unit, ratio)
