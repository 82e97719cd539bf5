"""Unit kinds: what a plan can address on its own, found in a model's prunable layers, one registry.

A *unit* (:class:`tools.schemas.SensitivityUnit`) is pruned alone by the sensitivity profile, allocated a ratio by
the planners and named in a recommendation by its ``pattern``. Each kind declares how it is found in the prunable
record (:class:`tools.compression.reports.PrunableLayers`, as a dict), which pruning type applies it and what a
ratio removes (for justifications and prompts):

``heads``            one attention module's whole heads (``head``)
``head_width``       the width of every head of one attention module (``head_dim``)
``channels``         a block-internal Conv2d/Linear: an MLP's hidden channels, a residual block's inner convolution
``mobile_block``     a coupled group with a depthwise/grouped convolution: a mobile block's expansion 1x1 and its
                     depthwise channels (with squeeze-and-excitation where there is one), repaired at the project 1x1
``residual_stage``   a coupled group of full convolutions: the channels of a residual stream, every block of a
                     stage that adds into it (with its projection shortcut, or a parameter-free padding shortcut
                     made a selection convolution first)

A new kind is one :class:`UnitKind` with a ``find`` function and one line of :data:`UNIT_KINDS`.

A ratio is not always what pruning removes: kept counts are whole heads, or channel counts rounded to ``round_to``
(:func:`tools.compression.channels.channel_step`). :func:`unit_step` gives a unit's rounding under a pruning config,
:func:`reachable_ratio` what a requested ratio really removes; the sensitivity profile measures, and the planners
allocate, reachable ratios only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tools.compression.channels import channel_step
from tools.compression.heads import kept_count
from tools.compression.recipes import PruningConfig
from tools.schemas import LayerProfile, PruningType, SensitivityUnit

__all__ = [
    "UNIT_KINDS",
    "UnitKind",
    "prunable_units",
    "reachable_ratio",
    "unit_kind",
    "unit_pattern",
    "unit_step",
]


def unit_pattern(name: str) -> str:
    """The regex that selects exactly the module ``name``."""
    return "^" + re.escape(name) + "$"


Finder = Callable[[dict[str, Any], Sequence[LayerProfile]], list[SensitivityUnit]]


@dataclass(frozen=True)
class UnitKind:
    """One kind of unit: its pruning type, what a ratio removes, and how its units are found."""

    name: str
    pruning_type: PruningType
    removes: str
    """What a ratio of it removes, e.g. ``attention heads``."""
    find: Finder


def _heads(prunable: dict[str, Any], _layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
    return [
        SensitivityUnit(pattern=unit_pattern(name), pruning_type="head", kind="heads", modules=[name], size=int(n))
        for name, n in (prunable.get("heads") or {}).items()
        if int(n) > 1
    ]


def _head_width(prunable: dict[str, Any], _layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
    return [
        SensitivityUnit(
            pattern=unit_pattern(query),
            pruning_type="head_dim",
            kind="head_width",
            modules=[query.rpartition(".")[0]],
            size=int(dim),
        )
        for query, dim in (prunable.get("head_dims") or {}).items()
    ]


def _channels(prunable: dict[str, Any], layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
    """Block-internal layers (coupling 1), but the model's first convolution (its channels feed what follows)."""
    coupling: dict[str, int] = prunable.get("coupling") or {}
    first_conv = next((lp.name for lp in layers if lp.type == "Conv2d"), None)
    return [
        SensitivityUnit(pattern=unit_pattern(name), pruning_type="structured", kind="channels", modules=[name], size=0)
        for name in prunable.get("structured") or []
        if coupling.get(name, 1) == 1 and name != first_conv
    ]


def _coupled(grouped: bool) -> Finder:
    def find(prunable: dict[str, Any], _layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        convs = set(prunable.get("grouped_convs") or [])
        kind = "mobile_block" if grouped else "residual_stage"
        return [
            SensitivityUnit(
                pattern=unit_pattern(root),
                pruning_type="structured",
                kind=kind,
                modules=[root],
                members=members,
                size=0,
            )
            for root, members in (prunable.get("groups") or {}).items()
            if bool(convs & set(members)) == grouped
        ]

    return find


UNIT_KINDS: dict[str, UnitKind] = {
    kind.name: kind
    for kind in (
        UnitKind("heads", "head", "attention heads", _heads),
        UnitKind("head_width", "head_dim", "dimensions of every head", _head_width),
        UnitKind("channels", "structured", "output channels", _channels),
        UnitKind("mobile_block", "structured", "expanded (depthwise) channels", _coupled(grouped=True)),
        UnitKind("residual_stage", "structured", "residual-stream channels", _coupled(grouped=False)),
    )
}


def unit_kind(unit: SensitivityUnit) -> UnitKind:
    """The registered kind of ``unit`` (units saved before kinds existed: by their pruning type)."""
    if unit.kind in UNIT_KINDS:
        return UNIT_KINDS[unit.kind]
    return next(k for k in UNIT_KINDS.values() if k.pruning_type == unit.pruning_type)


def prunable_units(prunable: dict[str, Any], layers: Sequence[LayerProfile] = ()) -> list[SensitivityUnit]:
    """Every unit of ``prunable`` (``ops.prunable``'s record), kind by kind in :data:`UNIT_KINDS` order."""
    return [unit for kind in UNIT_KINDS.values() for unit in kind.find(prunable, layers)]


def unit_step(unit: SensitivityUnit, config: PruningConfig) -> int:
    """What ``unit``'s kept count is rounded to under ``config`` (its ``size`` known): whole heads (0), head widths to
    ``head_round_to``, channels to :func:`~tools.compression.channels.channel_step`."""
    pruning_type = unit_kind(unit).pruning_type
    if pruning_type == "head":
        return 0
    if pruning_type == "head_dim":
        return config.head_round_to
    return channel_step(unit.size, config.round_to)


def reachable_ratio(unit: SensitivityUnit, ratio: float) -> float:
    """The share of ``unit`` (``size`` and ``step`` set) that pruning at ``ratio`` really removes (4 decimals)."""
    if unit.size <= 0:
        return round(ratio, 4)
    return round(1.0 - kept_count(unit.size, ratio, unit.step) / unit.size, 4)
