"""Prompts of the LLM planner: pure functions from a profile (and earlier rounds) to strings.

* :func:`analysis_messages` — the analysis agent: the profile summary P, what can be pruned and how,
  the run's importance and recovery and the measured sensitivity of each unit
  (:mod:`agents.planning.prompt_sensitivity`), the budget, the plan schema and the rules; the LLM answers
  with an ``OptimizationPlan``.
* :func:`iteration_messages` — the paper's Algorithm 1: P, every earlier round (plan A_i and
  evaluation E_i), and the request for the next pruning plan.
* :func:`input_shape_messages` — the input-shape resolver: architectural metadata to ``{channels, height,
  width}``.
* :func:`retry_message` — the follow-up that sends validation errors back.

Each takes a :class:`~agents.planning.prompt_budget.PromptDetail` that caps its long parts, so that the
prompt fits a small context window. Everything here is deterministic text built from the inputs; nothing
calls a model.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.prompt_budget import FULL, PromptDetail, capped, compact_schema_text, rounds_shown
from agents.planning.prompt_int8 import int8_lines
from agents.planning.prompt_sensitivity import sensitivity_lines, settings_lines
from agents.planning.recovery import TARGET_SLACK
from tools.compression.reports import PrunableLayers
from tools.compression.units import UNIT_KINDS
from tools.profiling.profile import name_pattern
from tools.schemas import LayerGroupProfile, ModelProfile, OptimizationPlan

__all__ = [
    "ANALYSIS_SYSTEM",
    "INPUT_SHAPE_SYSTEM",
    "ITERATION_SYSTEM",
    "SHAPE_LEVELS",
    "analysis_messages",
    "analysis_prompt",
    "blocked_summary",
    "input_shape_messages",
    "input_shape_prompt",
    "is_classifier_reason",
    "iteration_messages",
    "iteration_prompt",
    "next_round",
    "plan_schema_json",
    "profile_summary",
    "retry_message",
]

ANALYSIS_SYSTEM = (
    "You are the analysis agent of ProfilingAgent, which compresses image classifiers. You read a model's "
    "profile (per-layer latency, MACs and parameters, and what the pruner can act on) and write a layer-wise "
    "optimization plan: structured channel pruning, attention-head pruning (whole heads, or the same share of every "
    "head's dimensions), whole blocks removed, and post-training "
    "quantization. Target what costs the most latency and can be removed safely. Answer with one JSON object "
    "that matches the given schema and nothing else."
)
ITERATION_SYSTEM = (
    "You are the iterative pruning agent of ProfilingAgent. Each round you read the model's profile, every "
    "earlier pruning plan and its measured result, and write the next pruning plan: prune more while accuracy "
    "stays within the budget, back off when a round breaks it, and never repeat a plan already tried. Answer "
    "with one JSON object that matches the given schema and nothing else."
)
INPUT_SHAPE_SYSTEM = (
    "You determine the input tensor shape of an image classifier from its architectural metadata. Answer with "
    'one JSON object {"channels": int, "height": int, "width": int} and nothing else.'
)

_CLASSIFIER_WORDS = ("classifier", "output head")
#: Config / processor fields that tell the input shape, shown first in the input-shape prompt.
SHAPE_CONFIG_FIELDS = (
    "model_type",
    "architectures",
    "image_size",
    "input_size",
    "num_channels",
    "in_channels",
    "patch_size",
    "embed_dim",
    "hidden_size",
    "window_size",
)
SHAPE_PROCESSOR_FIELDS = (
    "image_processor_type",
    "size",
    "crop_size",
    "do_resize",
    "do_center_crop",
    "resample",
    "image_mean",
    "image_std",
    "rescale_factor",
)


# --------------------------------------------------------------------------------------------------
# Formatting helpers
# --------------------------------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _int(value: int) -> str:
    return f"{value:,}"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.3f} ms"


def is_classifier_reason(reason: str) -> bool:
    """Whether a ``prunable["blocked"]`` reason says the module is (or feeds) the classifier's logits."""
    text = reason.lower()
    return any(word in text for word in _CLASSIFIER_WORDS)


def _reason_category(reason: str) -> str:
    """The reason without the module names: 'coupled to the residual stream / embedding channels', ..."""
    head = re.split(r" \(| through | of |: prune", reason, maxsplit=1)[0].strip()
    return head or reason


def blocked_summary(blocked: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """(pattern, count, reason category) for the blocked modules, grouped like the profile's groups."""
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, reason in blocked.items():
        grouped[(name_pattern(name), _reason_category(reason))].append(name)
    return sorted(
        ((p, len(m), r) for (p, r), m in grouped.items()), key=lambda t: (not is_classifier_reason(t[2]), t[0])
    )


def _members(group: LayerGroupProfile, names: Iterable[str]) -> list[str]:
    try:
        rx = re.compile(group.pattern)
    except re.error:
        return []
    return [n for n in names if rx.search(n)]


def _group_status(group: LayerGroupProfile, profile: ModelProfile, prunable: PrunableLayers) -> str:
    """How a profile group is prunable: what each unit kind says of its members, else why not."""
    names = [lp.name for lp in profile.layers if lp.type == group.type]
    members = _members(group, names) or _members(group, [lp.name for lp in profile.layers])
    parts = [status for kind in UNIT_KINDS.values() if (status := kind.group_status(members, prunable))]
    reasons = sorted({_reason_category(prunable.blocked[m]) for m in members if m in prunable.blocked})
    if reasons:
        parts.append("not prunable: " + "; ".join(reasons))
    if not parts:
        owner = next((h for h in prunable.heads if any(m.startswith(f"{h}.") for m in members)), None)
        if owner is not None:
            return "inside a head-prunable attention module (shrinks with head pruning)"
        return "no prunable output channels"
    return "; ".join(parts)


def plan_schema_json() -> str:
    """The exact JSON schema of :class:`OptimizationPlan`, compact."""
    return json.dumps(OptimizationPlan.model_json_schema(), separators=(",", ":"))


# --------------------------------------------------------------------------------------------------
# Profile summary P
# --------------------------------------------------------------------------------------------------


def profile_summary(ctx: PlanningContext, detail: PromptDetail = FULL) -> str:
    """The static profile P as text: model, top layer groups, prunable layers, quantizable layers; each list
    capped by ``detail`` (largest latency share first)."""
    profile = ctx.profile
    shown = [g for g in profile.groups if max(g.latency_share, g.macs_share, g.params_share) >= 0.001]
    shown = shown[: detail.groups]
    out = [
        f"Model: {profile.model_class} (family: {profile.family or 'unknown'}), input "
        f"{'x'.join(str(d) for d in profile.input_shape)}, {_int(profile.total_params)} parameters, "
        f"{_int(profile.total_macs)} MACs, {_ms(profile.latency_s)} per image (batch 1, {profile.device}).",
        "",
        f"Top layer groups by share of latency (a group is the same layer repeated across blocks; the regex "
        f"selects exactly its modules) — {len(shown)} of {len(profile.groups)}:",
    ]
    for g in shown:
        out.append(
            f"- {g.pattern} : {g.count} x {g.type}; latency {_pct(g.latency_share)}, MACs {_pct(g.macs_share)}, "
            f"params {_pct(g.params_share)} — {_group_status(g, profile, ctx.prunable)}"
        )

    absent = []
    for kind in [k for k in UNIT_KINDS.values() if ctx.allows(k.name)]:  # what each unit kind can prune here
        rows = [text for _, text in sorted(kind.prompt_lines(ctx.prunable, profile.layers), key=lambda r: -r[0])]
        if not rows:
            absent.append(kind)
            continue
        what = "" if detail.compact_schema else f" {kind.description}"  # short prompts: the kind's name only
        out += ["", f"pruning_type {kind.name!r}{what}:"]
        out += capped(rows, detail.lines, f"{kind.label} groups")
    for kind in absent:
        out += ["", f"pruning_type {kind.name!r}: none: this model has no {kind.noun}s; do not use {kind.name!r}"]

    blocked = ctx.prunable.blocked
    if blocked:
        out += ["", "Not prunable (never select these with a pruning regex):"]
        listed = [f"- {p} ({n}): {reason}" for p, n, reason in blocked_summary(blocked)]
        out += capped(listed, detail.lines, "not-prunable groups", "select only what is listed as prunable")

    linear = [g for g in profile.groups if g.type == "Linear"]
    n_linear = sum(g.count for g in linear)
    out += [
        "",
        f"Quantizable (dynamic quantization of nn.Linear): {n_linear} Linear layers holding "
        f"{_pct(sum(g.params_share for g in linear))} of parameters and "
        f"{_pct(sum(g.latency_share for g in linear))} of latency; layer 'all' selects every one of them.",
    ]
    return "\n".join(out)


def _measured(ctx: PlanningContext, detail: PromptDetail = FULL) -> list[str]:
    """The pruning settings and the sensitivity table, each followed by a blank line (nothing if absent)."""
    out: list[str] = []
    for block in (
        settings_lines(ctx),
        sensitivity_lines(ctx, max_units=detail.units),
        int8_lines(ctx, detail.int8_blocks),
    ):
        out += [*block, ""] if block else []
    return out


def _budget(ctx: PlanningContext) -> str:
    base = "unknown (untrained model: accuracy is not measured)"
    if ctx.baseline_accuracy is not None:
        base = f"{ctx.baseline_accuracy:.4f} ({_pct(ctx.baseline_accuracy)})"
    return (
        f"Budget: baseline accuracy {base}; a candidate may lose at most {ctx.max_accuracy_drop:g} accuracy points; "
        f"every pruning_ratio must be between 0 and {ctx.max_ratio:g}."
    )


def _rules(ctx: PlanningContext, *, iteration: bool) -> list[str]:
    rules = [
        "Rules:",
        "1. 'layer' is a Python regular expression matched with re.search against module names. Copy the "
        "patterns listed above (or narrow them); a pattern must select at least one prunable module of its type.",
        "2. Each pruning_type only for the modules listed under it above (q/k/v projections are pruned through the "
        "attention kinds, never as channels).",
        "3. Never select the classifier or any module listed as not prunable.",
        f"4. pruning_ratio is the fraction of channels/heads removed, in [0, {ctx.max_ratio:g}] (1 for a kind "
        "removed whole). Higher ratios on layers with a large latency share save the most, and cost the most "
        "accuracy.",
        "5. Each recommendation needs a short justification citing the profile numbers.",
    ]
    if iteration:
        rules.append(
            "6. This loop only prunes: 'quantization_recommendations' may be omitted (the analysis plan's "
            "quantization is kept)."
        )
    else:
        rules.append(
            "6. quantization_recommendations: layer 'all' (every Linear and Conv layer a runtime quantizes) or a regex "
            "over their module names, later entries overriding earlier ones; quantization_type 'dynamic' or "
            "'static'; dtype 'qint8', 'float16' (PyTorch only) or 'float32' (kept in float: mixed precision). Keep "
            "in float only the blocks whose measured int8 damage dominates the whole model's."
        )
    rules.append("7. Output exactly one JSON object matching the schema: no prose, no comments, no code fences.")
    return rules


# --------------------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------------------


def _schema(ctx: PlanningContext, detail: PromptDetail, *, iteration: bool) -> list[str]:
    if detail.compact_schema:
        return [compact_schema_text(ctx.max_ratio, iteration=iteration)]
    return ["JSON schema of the answer (OptimizationPlan):", plan_schema_json()]


def analysis_prompt(ctx: PlanningContext, detail: PromptDetail = FULL) -> str:
    return "\n".join(
        [
            "Write the optimization plan for this model.",
            "",
            profile_summary(ctx, detail),
            "",
            *_measured(ctx, detail),
            _budget(ctx),
            "",
            *_rules(ctx, iteration=False),
            "",
            *_schema(ctx, detail, iteration=False),
        ]
    )


def analysis_messages(ctx: PlanningContext, detail: PromptDetail = FULL) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": ANALYSIS_SYSTEM},
        {"role": "user", "content": analysis_prompt(ctx, detail)},
    ]


# --------------------------------------------------------------------------------------------------
# Iteration (Algorithm 1)
# --------------------------------------------------------------------------------------------------


def _plan_line(plan: OptimizationPlan) -> str:
    recs = [f"{r.pruning_type} {r.layer} @ {r.pruning_ratio:g}" for r in plan.pruning_recommendations]
    return "; ".join(recs) if recs else "(no pruning)"


def _result_line(record: RoundRecord, ctx: PlanningContext) -> str:
    total = ctx.profile.total_params
    params = f"params {_int(record.params)}"
    if total:
        params += f" ({_pct(record.params / total)} of the original {_int(total)})"
    if record.accuracy is None:
        acc = "accuracy n/a"
    else:
        acc = f"accuracy {record.accuracy:.4f}"
        if record.accuracy_drop_points is not None:
            acc += f" (drop {record.accuracy_drop_points:.2f} points"
            if record.budget_drop_points is not None and record.budget_drop_points != record.accuracy_drop_points:
                acc += f"; {record.budget_drop_points:.2f} with one standard error, which the budget test uses"
            acc += ")"
    budget = "within budget" if record.within_budget else "OVER BUDGET"
    return f"{acc}, {params}, latency {_ms(record.latency_s)}; {budget}"


def _over_budget_line(record: RoundRecord, ctx: PlanningContext) -> str | None:
    if record.within_budget:
        return None
    drop = record.budget_drop_points if record.budget_drop_points is not None else record.accuracy_drop_points
    if drop is None or record.accuracy_drop_points is None:
        return f"  Round {record.round} broke the accuracy budget."
    over = drop - ctx.max_accuracy_drop
    noise = "" if drop == record.accuracy_drop_points else " plus one standard error of the measurement"
    return (
        f"  Round {record.round} broke the accuracy budget by {over:.2f} points: it lost "
        f"{record.accuracy_drop_points:.2f} points{noise} ({drop:.2f}), the budget is {ctx.max_accuracy_drop:g}."
    )


def _best(history: list[RoundRecord]) -> RoundRecord | None:
    ok = [r for r in history if r.within_budget]
    if not ok:
        return None
    return min(ok, key=lambda r: (-(r.accuracy if r.accuracy is not None else -1.0), r.params, r.latency_s, r.round))


def next_round(ctx: PlanningContext) -> int:
    return max((r.round for r in ctx.history), default=-1) + 1


def iteration_prompt(ctx: PlanningContext, detail: PromptDetail = FULL) -> str:
    history = sorted(ctx.history, key=lambda r: r.round)
    out = [f"Write the pruning plan for round {next_round(ctx)}.", "", profile_summary(ctx, detail), ""]
    out += [*_measured(ctx, detail), _budget(ctx), ""]
    if history:
        out.append("Earlier rounds (plan A_i, then its evaluation E_i):")
        shown, omitted = rounds_shown(history, detail)
        if omitted:
            over = sum(not r.within_budget for r in history if r not in shown)
            out.append(
                f"({omitted} earlier rounds left out to fit the context window, {over} of them over budget; "
                "shown: the latest rounds and the best within budget)"
            )
        for record in shown:
            distilled = (
                f" (round {record.distilled_from}'s model distilled from the original after the search, each half "
                "of the evaluation images judged by a student that did not see it)"
                if record.distilled_from is not None
                else ""
            )
            out.append(f"Round {record.round} [{record.source}]{distilled}: {_plan_line(record.plan)}")
            out.append(f"  -> {_result_line(record, ctx)}")
            line = _over_budget_line(record, ctx)
            if line:
                out.append(line)
        best = _best(history)
        if best is None:
            out.append("No round has stayed within the budget yet: prune less than every round so far.")
        else:
            out.append(f"Best round within budget so far: round {best.round} ({_result_line(best, ctx)}).")
        last = history[-1]
        target = ctx.distillation_target_points
        if target is not None:
            back = sorted({r.distilled_from for r in history if r.distilled_from is not None and r.within_budget})
            out.append(
                f"Distillation after the search brought round(s) {', '.join(map(str, back))} back within the budget. "
                f"The next round is judged before distillation and then distilled from the original if it loses at "
                f"most about {TARGET_SLACK * target:.2f} points: aim for a round that loses about {target:.2f} "
                "points before distillation (more than the rounds that came back), not one within the budget."
            )
        elif last.within_budget:
            out.append(
                f"The last round (round {last.round}) stayed within budget: prune more (higher ratios or more "
                "groups) to save more latency and parameters."
            )
        else:
            out.append(
                f"The last round (round {last.round}) broke the budget: back off, between the best within-budget "
                "round and the failed one."
            )
    else:
        out.append("No round has been evaluated yet.")
    out += ["", *_rules(ctx, iteration=True), "", *_schema(ctx, detail, iteration=True)]
    return "\n".join(out)


def iteration_messages(ctx: PlanningContext, detail: PromptDetail = FULL) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": ITERATION_SYSTEM},
        {"role": "user", "content": iteration_prompt(ctx, detail)},
    ]


# --------------------------------------------------------------------------------------------------
# Retry
# --------------------------------------------------------------------------------------------------


def retry_message(errors: Iterable[str]) -> str:
    """The follow-up that sends the reasons of a rejection back to the model."""
    lines = ["Your answer was rejected:"]
    lines += [f"- {e}" for e in errors]
    lines.append(
        "Fix every point and answer again with the complete corrected plan as one JSON object matching the "
        "schema, nothing else."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Input shape
# --------------------------------------------------------------------------------------------------


def _compact(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHAPE_NOISE = {"id2label", "label2id", "label_names", "task_specific_params", "transformers_version"}


def _fields(data: Mapping[str, Any], first: tuple[str, ...], limit: int = 25, value_chars: int = 300) -> list[str]:
    """``first`` keys, then the others sorted; label maps, private keys and empty values left out."""
    useful = {
        k: v
        for k, v in data.items()
        if k not in _SHAPE_NOISE and not str(k).startswith("_") and v is not None and v != "" and v != {} and v != []
    }
    keys = [k for k in first if k in useful] + sorted(k for k in useful if k not in first)
    data = useful
    return [f"- {k}: {_compact(data[k], value_chars)}" for k in keys[:limit]]


#: (fields per section, characters per value) of the input-shape prompt, from the most to the least detail.
SHAPE_LEVELS: tuple[tuple[int, int], ...] = ((25, 300), (15, 160), (10, 80))


def input_shape_prompt(metadata: Mapping[str, Any], level: tuple[int, int] = SHAPE_LEVELS[0]) -> str:
    """``metadata``: ``model_class``, ``config`` (dict) and ``processor`` (dict); other keys are shown too.

    ``level``: at most that many fields per section, each value cut to that many characters (the fields
    that tell the shape come first)."""
    limit, chars = level
    out = ["What input tensor does this image classifier take (one image, without the batch dimension)?", ""]
    out.append(f"Model class: {metadata.get('model_class', 'unknown')}")
    config = metadata.get("config")
    if isinstance(config, Mapping) and config:
        out += ["Model config fields:", *_fields(config, SHAPE_CONFIG_FIELDS, limit, chars)]
    processor = metadata.get("processor")
    if isinstance(processor, Mapping) and processor:
        out += ["Image processor fields:", *_fields(processor, SHAPE_PROCESSOR_FIELDS, limit, chars)]
    others = {k: v for k, v in metadata.items() if k not in {"model_class", "config", "processor"}}
    if others:
        out += ["Other metadata:", *_fields(others, (), limit, chars)]
    out += [
        "",
        "The processor's crop_size (else size) is what the model sees; image_mean has one value per channel.",
        'Answer with one JSON object: {"channels": <int>, "height": <int>, "width": <int>}.',
    ]
    return "\n".join(out)


def input_shape_messages(metadata: Mapping[str, Any], level: tuple[int, int] = SHAPE_LEVELS[0]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INPUT_SHAPE_SYSTEM},
        {"role": "user", "content": input_shape_prompt(metadata, level)},
    ]
