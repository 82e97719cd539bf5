"""Channels: a Conv2d/Linear's output channels, removed through Torch-Pruning's dependency graph (``structured``).

``layer`` is a regex matched (``re.search``) against the names of ``nn.Conv2d`` / ``nn.Linear`` modules; for each
match, ``pruning_ratio`` of that module's output channels is removed with its whole coupled group (BatchNorm, the
next layers' input channels, residual adds), ranked by the run's importance (:mod:`tools.compression.channels`). A
coupled group is pruned at most once per call: the first module of the group in forward order prunes it.

Its units come in three flavours (``SensitivityUnit.kind``), by what the group holds:

``channels``        a block-internal Conv2d/Linear (coupling 1): an MLP's hidden channels, a residual block's inner
                    convolution (not the model's first convolution, whose channels feed what follows)
``mobile_block``    a coupled group with a depthwise/grouped convolution: a mobile block's expansion 1x1 and its
                    depthwise channels (with squeeze-and-excitation where there is one), repaired at the project 1x1
``residual_stage``  a coupled group of full convolutions: the channels of a residual stream, every block of a stage
                    that adds into it
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import ClassVar

from torch import nn

from tools.compression.channels import apply_structured, channel_step, prunable_names
from tools.compression.forward import check_forward, restore, snapshot
from tools.compression.kinds.base import PruningSession, UnitKind, exact_name, layer_shares
from tools.compression.recipes import PruningConfig
from tools.compression.reports import AppliedPruning, PrunableLayers, SkippedPruning
from tools.compression.shortcuts import to_selection_convs_
from tools.schemas import LayerProfile, PruningRecommendation, SensitivityUnit

logger = logging.getLogger(__name__)

__all__ = ["Channels"]

#: What each flavour's ratio removes, for justifications and prompts.
FLAVOURS = {
    "channels": "output channels",
    "mobile_block": "expanded (depthwise) channels",
    "residual_stage": "residual-stream channels",
}


class Channels(UnitKind):
    name = "structured"
    label = "output channels"
    counts = "ch"
    flavour = "channels"
    removes = "output channels"
    keywords = ("struct", "channel", "filter", "neuron", "width")
    uniform = True
    noun = "structured-prunable module"
    description = "removes that share of each selected Conv2d/Linear's output channels, with all coupled to them"

    flavours: ClassVar[dict[str, str]] = FLAVOURS
    traced = True

    def prepare(self, model: nn.Module, regexes: Sequence[re.Pattern[str]], inputs: object) -> None:
        to_selection_convs_(model, inputs)  # parameter-free padding shortcuts pruned as convolutions, then undone

    def find(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        first_conv = next((lp.name for lp in layers if lp.type == "Conv2d"), None)
        units = [
            SensitivityUnit(pattern=exact_name(name), pruning_type=self.name, kind=self.flavour, modules=[name], size=0)
            for name in prunable.structured
            if prunable.coupling.get(name, 1) == 1 and name != first_conv
        ]
        grouped = set(prunable.grouped_convs)
        for flavour, depthwise in (("mobile_block", True), ("residual_stage", False)):
            units += [
                SensitivityUnit(
                    pattern=exact_name(root),
                    pruning_type=self.name,
                    kind=flavour,
                    modules=[root],
                    members=members,
                    size=0,
                )
                for root, members in prunable.groups.items()
                if bool(grouped & set(members)) == depthwise
            ]
        return units

    def removes_of(self, unit: SensitivityUnit) -> str:
        return self.flavours.get(unit.kind, self.removes)

    def selectable(self, prunable: PrunableLayers) -> dict[str, list[str]]:
        return {name: [name] for name in prunable.structured}

    def level_targets(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[list[str], str]]:
        from tools.profiling.profile import name_pattern

        types = {lp.name: lp.type for lp in layers}
        first_conv = next((lp.name for lp in layers if lp.type == "Conv2d"), None)
        by_template: dict[str, list[str]] = {}
        for name in prunable.structured:
            if name in types and prunable.coupling.get(name, 1) == 1 and name != first_conv:
                by_template.setdefault(name_pattern(name), []).append(name)
        targets = []
        for members in by_template.values():
            what = "Linear layers" if types[members[0]] == "Linear" else "convolutions"
            why = (
                f"{len(members)} {what} whose output channels are internal to their block (the dependency graph "
                "couples them to no other layer's outputs), so removing the weakest ones shrinks this layer and the "
                "next without touching a residual stream."
            )
            targets.append((members, why))
        return targets

    def step(self, unit: SensitivityUnit, config: PruningConfig) -> int:
        return channel_step(unit.size, config.round_to)

    def prompt_lines(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[tuple[float, str]]:
        from tools.profiling.profile import exact_pattern, name_pattern

        stats = {lp.name: lp for lp in layers}
        groups: dict[tuple[bool, str], list[str]] = {}
        for name in prunable.structured:
            groups.setdefault((prunable.coupling.get(name, 1) > 1, name_pattern(name)), []).append(name)
        rows = []
        for (coupled, _), members in groups.items():
            found = [stats[n] for n in members if n in stats]
            exact = len(found) == len(members)
            pattern = exact_pattern(members, list(stats)) if exact else name_pattern(members[0])
            latency, shares = layer_shares(found)
            where = (
                "coupled: pruning them also prunes the layers tied to them (e.g. through residual adds)"
                if coupled
                else "internal to their block (safest)"
            )
            layer_type = found[0].type if found else "layer"
            rows.append((latency, f"- {pattern} : {len(members)} {layer_type}, {shares}; {where}"))
        return rows

    def group_status(self, members: Sequence[str], prunable: PrunableLayers) -> str | None:
        structured = set(prunable.structured)
        internal = [m for m in members if m in structured and prunable.coupling.get(m, 1) == 1]
        coupled = [m for m in members if m in structured and prunable.coupling.get(m, 1) > 1]
        parts = []
        if internal:
            parts.append(f"structured-prunable, internal to its block ({len(internal)} modules)")
        if coupled:
            width = max(prunable.coupling[m] for m in coupled)
            parts.append(f"structured-prunable but coupled with up to {width} layers ({len(coupled)} modules)")
        return "; ".join(parts) or None

    def matches(self, session: PruningSession, regex: re.Pattern[str]) -> bool:
        session.context.ensure_graph()
        return any(regex.search(n) for n in prunable_names(session.context))

    def apply(
        self, session: PruningSession, rec: PruningRecommendation, regex: re.Pattern[str]
    ) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
        ctx, claimed, importance = session.context, session.claimed, session.importance
        ctx.ensure_graph()
        round_to = session.config.round_to or None
        snap, claimed_before = snapshot(session.model), dict(claimed)
        applied, skipped = apply_structured(ctx, rec, regex, round_to, importance, claimed, verify_each=False)
        problem = check_forward(session.model, session.inputs, ctx.num_classes) if applied else None
        if problem:
            logger.warning("structured %r broke the forward (%s); retrying module by module", rec.layer, problem)
            restore(snap)
            claimed.clear()
            claimed.update(claimed_before)
            ctx.rebuild()
            applied, skipped = apply_structured(
                ctx, rec, regex, round_to, session.importance, claimed, verify_each=True
            )
        return applied, skipped
