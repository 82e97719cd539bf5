"""Check a plan against what the pruner and quantizer can act on, before running it.

:func:`validate_plan` returns precise, self-contained messages (empty list: valid), meant to be sent back
to an LLM that wrote the plan. :func:`repair_plan` makes a plan valid without asking anyone: it clamps
ratios and drops the recommendations that cannot be applied.

What is checked:

* every pruning regex compiles and selects at least one module its unit kind can prune (``UnitKind.selectable``:
  a channel-prunable Conv2d/Linear, an attention module or one of its projections, a removable block);
* a unit kind only where the model has modules of it;
* ``pruning_ratio`` in ``[0, ctx.max_ratio]``;
* no pruning regex selects the classifier (a ``prunable["blocked"]`` module whose reason names the
  classifier / output head);
* no module is selected by two recommendations of the same type (the pruner would skip the second for
  structured pruning, and compound the ratios for heads);
* quantization: ``layer`` is ``all`` or a regex that compiles and selects at least one module name
  (``model_layer_names``, else the profile's ``nn.Linear`` layers);
* optionally (``require_pruning``), that the plan prunes something when something is prunable.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agents.planning.base import PlanningContext
from agents.planning.prompts import is_classifier_reason
from tools.compression.reports import PrunableLayers
from tools.compression.units import UNIT_KINDS, UnitKind, kind_of
from tools.profiling.profile import name_pattern
from tools.schemas import OptimizationPlan, PruningRecommendation, QuantizationRecommendation
from tools.text import listing

#: The profile's layer types a quantization recommendation may select (what the runtimes quantize).
QUANTIZABLE_TYPES = frozenset({"Linear", "Conv1d", "Conv2d"})

logger = logging.getLogger(__name__)

__all__ = ["repair_plan", "validate_plan"]


@dataclass
class _Universe:
    """Names a plan may select, from the planning context: by unit kind, each prunable module with the names a
    pattern may select it by."""

    model_class: str
    prunable: PrunableLayers
    selectable: dict[str, dict[str, list[str]]]
    blocked: dict[str, str]
    classifier: list[str]
    quant_names: list[str]

    @classmethod
    def of(cls, ctx: PlanningContext, model_layer_names: Sequence[str] | None) -> _Universe:
        prunable = ctx.prunable
        names = (
            list(model_layer_names)
            if model_layer_names is not None
            else [lp.name for lp in ctx.profile.layers if lp.type in QUANTIZABLE_TYPES]
        )
        return cls(
            model_class=ctx.profile.model_class,
            prunable=prunable,
            selectable={name: kind.selectable(prunable) for name, kind in UNIT_KINDS.items()},
            blocked=dict(prunable.blocked),
            classifier=[n for n, reason in prunable.blocked.items() if is_classifier_reason(reason)],
            quant_names=names,
        )

    def selected(self, kind: UnitKind, rx: re.Pattern[str]) -> list[str]:
        return [n for n, names in self.selectable[kind.name].items() if any(rx.search(c) for c in names)]

    def others(self, kind: UnitKind, rx: re.Pattern[str]) -> list[UnitKind]:
        """The other kinds whose modules ``rx`` selects (a hint when ``kind``'s select none)."""
        return [k for k in UNIT_KINDS.values() if k is not kind and self.selected(k, rx)]


def _compile(pattern: str) -> tuple[re.Pattern[str] | None, str | None]:
    try:
        return re.compile(pattern), None
    except re.error as exc:
        return None, str(exc)


def _nothing_selected(
    where: str, kind: UnitKind, rx: re.Pattern[str], u: _Universe, classifier: list[str]
) -> list[str]:
    """Why a pattern that selects no unit of ``kind`` does not (nothing more where it hit the ``classifier``)."""
    blocked_hits = [n for n in u.blocked if rx.search(n) and n not in classifier]
    others = u.others(kind, rx)
    if blocked_hits:
        reasons = "; ".join(f"{n}: {u.blocked[n]}" for n in blocked_hits[:2])
        more = f" (and {len(blocked_hits) - 2} more)" if len(blocked_hits) > 2 else ""
        msg = f"{where}: selects only modules whose output channels cannot be pruned — {reasons}{more}"
        return [msg + (f"; for those use pruning_type {others[0].name!r}" if others else "")]
    if classifier:
        return []
    patterns = kind.patterns(u.prunable)
    listed = listing(patterns, quote=True) if patterns else "none"
    hint = f"; it selects {others[0].noun}s: use pruning_type {others[0].name!r}" if others else ""
    return [f"{where}: matches no {kind.noun}; {kind.noun} patterns: {listed}{hint}"]


def _pruning_errors(
    i: int, rec: PruningRecommendation, ctx: PlanningContext, u: _Universe, claimed: dict[tuple[str, str], int]
) -> tuple[list[str], bool]:
    """(errors, fatal): fatal errors make the recommendation unusable; the others (ratio) can be clamped."""
    where = f"pruning_recommendations[{i}] ({rec.pruning_type}, layer {rec.layer!r})"
    try:
        kind = kind_of(rec.pruning_type)
    except ValueError as exc:
        return [f"{where}: {exc}"], True
    if not ctx.allows(kind.name):
        return [f"{where}: the run's --unit-kinds are {', '.join(ctx.kinds)}: do not use {kind.name!r}"], True
    rx, problem = _compile(rec.layer)
    if rx is None:
        return [f"{where}: invalid regular expression: {problem}"], True
    errors: list[str] = []
    fatal = False
    hits_classifier = [n for n in u.classifier if rx.search(n)]
    if hits_classifier:
        errors.append(
            f"{where}: selects the classifier {listing(hits_classifier, quote=True)}, whose outputs are the logits "
            "and are never pruned; anchor the pattern (^...$) so that it selects only the layers you mean"
        )
        fatal = True
    if not u.selectable[kind.name]:
        usable = [k for k in UNIT_KINDS.values() if u.selectable[k.name]]
        hint = (
            f"; use pruning_type {usable[0].name!r} on {listing(usable[0].patterns(u.prunable), quote=True)}"
            if usable
            else ""
        )
        errors.append(f"{where}: {u.model_class} has no {kind.noun}s{hint}")
        return errors, True
    selected = u.selected(kind, rx)
    if not selected:
        fatal = True
        errors += _nothing_selected(where, kind, rx, u, hits_classifier)
    else:
        overlap = sorted({claimed[(rec.pruning_type, n)] for n in selected if (rec.pruning_type, n) in claimed})
        if overlap:
            errors.append(
                f"{where}: selects modules already selected by pruning_recommendations[{overlap[0]}]; give each "
                "module one recommendation per pruning type"
            )
            fatal = True
        elif not fatal:
            for n in selected:
                claimed[(rec.pruning_type, n)] = i
    if not kind.allowed(rec.pruning_ratio, ctx.max_ratio):
        errors.append(f"{where}: pruning_ratio {rec.pruning_ratio:g} exceeds the maximum {ctx.max_ratio:g}")
    elif rec.pruning_ratio < 0:
        errors.append(f"{where}: pruning_ratio {rec.pruning_ratio:g} is negative")
    return errors, fatal


def _quantization_errors(i: int, rec: QuantizationRecommendation, u: _Universe) -> list[str]:
    where = f"quantization_recommendations[{i}] (layer {rec.layer!r})"
    errors = []
    if rec.quantization_type not in ("dynamic", "static"):
        errors.append(f"{where}: quantization_type must be 'dynamic' or 'static'")
    if rec.dtype not in ("qint8", "float16", "float32"):
        errors.append(f"{where}: dtype must be 'qint8', 'float16' or 'float32'")
    if rec.layer == "all":
        return errors
    rx, problem = _compile(rec.layer)
    if rx is None:
        return [*errors, f"{where}: invalid regular expression: {problem}"]
    if u.quant_names and not any(rx.search(n) for n in u.quant_names):
        patterns = sorted({name_pattern(n) for n in u.quant_names})
        errors.append(
            f"{where}: matches no Linear or Conv module; use 'all' or a pattern such as {listing(patterns, quote=True)}"
        )
    return errors


def _prunes_anything(ctx: PlanningContext) -> bool:
    return any(kind.selectable(ctx.prunable) for kind in UNIT_KINDS.values())


def validate_plan(
    plan: OptimizationPlan,
    ctx: PlanningContext,
    model_layer_names: list[str] | None = None,
    *,
    require_pruning: bool = False,
) -> list[str]:
    """Every reason ``plan`` cannot be applied as written to the model of ``ctx``; empty when valid.

    ``model_layer_names``: module names for the quantization check (default: the profile's Linear layers).
    ``require_pruning``: a plan without pruning recommendations is an error when something is prunable.
    """
    u = _Universe.of(ctx, model_layer_names)
    errors: list[str] = []
    claimed: dict[tuple[str, str], int] = {}
    for i, rec in enumerate(plan.pruning_recommendations):
        errors.extend(_pruning_errors(i, rec, ctx, u, claimed)[0])
    for i, qrec in enumerate(plan.quantization_recommendations):
        errors.extend(_quantization_errors(i, qrec, u))
    if require_pruning and not plan.pruning_recommendations and _prunes_anything(ctx):
        errors.append("the plan has no pruning_recommendations; prune at least one of the prunable groups listed")
    return errors


def repair_plan(
    plan: OptimizationPlan, ctx: PlanningContext, model_layer_names: list[str] | None = None
) -> tuple[OptimizationPlan, list[str]]:
    """A valid version of ``plan``: ratios clamped to ``ctx.max_ratio``, unusable recommendations dropped.

    Returns the repaired plan and what was changed (empty when ``plan`` was valid).
    """
    u = _Universe.of(ctx, model_layer_names)
    changes: list[str] = []
    claimed: dict[tuple[str, str], int] = {}
    pruning: list[PruningRecommendation] = []
    for i, rec in enumerate(plan.pruning_recommendations):
        errors, fatal = _pruning_errors(i, rec, ctx, u, claimed)
        if fatal:
            changes.append(f"dropped pruning_recommendations[{i}]: " + "; ".join(errors))
            continue
        kind = kind_of(rec.pruning_type)
        if not kind.allowed(rec.pruning_ratio, ctx.max_ratio):
            changes.append(f"clamped pruning_recommendations[{i}] ratio {rec.pruning_ratio:g} to {ctx.max_ratio:g}")
            rec = rec.model_copy(update={"pruning_ratio": ctx.max_ratio})
        pruning.append(rec)
    quant: list[QuantizationRecommendation] = []
    for i, qrec in enumerate(plan.quantization_recommendations):
        errors = _quantization_errors(i, qrec, u)
        if errors:
            changes.append(f"dropped quantization_recommendations[{i}]: " + "; ".join(errors))
            continue
        quant.append(qrec)
    if changes:
        logger.info("repaired plan: %s", " | ".join(changes))
    return OptimizationPlan(pruning_recommendations=pruning, quantization_recommendations=quant), changes
