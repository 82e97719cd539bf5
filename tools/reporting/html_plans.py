"""The HTML report's sections about plans: the analysis plan, the pruning rounds and the planner's decisions.

Each takes the :class:`~tools.schemas.RunReport` and returns its ``<section>``.
"""

from __future__ import annotations

from typing import Any

from tools.compression.units import UNIT_KINDS
from tools.deploy.choice import is_chosen
from tools.deploy.choice import label as candidate_label
from tools.reporting.format import damage_text, recovery_text
from tools.reporting.html_parts import (
    acc_text,
    as_number,
    badge,
    budget_badge,
    esc,
    ms_text,
    params_text,
    section,
    short,
    table,
)
from tools.reporting.paired_text import agreement, delta_ci_html, float_twins_text, stopped_text
from tools.schemas import PairedAccuracy, PruningRecommendation, QuantizationRecommendation, RoundResult, RunReport


def _recommendation(rec: PruningRecommendation | QuantizationRecommendation) -> str:
    layer = rec.layer
    if isinstance(rec, QuantizationRecommendation):
        kind, what = " quant", f"quantize {short(layer) if layer != 'all' else 'all Linear layers'}"
        tags = badge(str(rec.quantization_type or ""), "accent") + " " + badge(str(rec.dtype), "neutral")
    else:
        kind, what = "", f"prune {short(layer)}"
        tags = badge(str(rec.pruning_type or ""), "accent") + " " + badge(f"ratio {rec.pruning_ratio:.2f}", "neutral")
    return (
        f'<div class="rec{kind}"><div class="head"><span class="what">{esc(what)}</span>{tags}'
        f"<code>{esc(layer)}</code></div>"
        f'<div class="why">{esc(rec.justification or "(no justification given)")}</div></div>'
    )


def plan(report: RunReport) -> str:
    """The analysis agent's plan: every pruning and quantization recommendation with its justification."""
    pruning = report.plan.pruning_recommendations
    quant = report.plan.quantization_recommendations
    source = badge(str(report.plan.source or "–"), "neutral")
    parts = [
        f'<p class="muted">Written by the analysis agent from the profile; source {source}. '
        "Later rounds adjust it (see the rounds table).</p>"
    ]
    if pruning:
        parts.append("<h3>Pruning</h3>" + "".join(_recommendation(r) for r in pruning))
    if quant:
        parts.append("<h3>Quantization</h3>" + "".join(_recommendation(r) for r in quant))
    if not pruning and not quant:
        parts.append('<p class="muted">The plan has no recommendations.</p>')
    return section("plan", "Plan (analysis agent)", "".join(parts))


def _round_plan(r: RoundResult) -> str:
    """A round's pruning recommendations, what each changed, and what pruning skipped."""
    applied = {a.get("pattern"): a for a in (r.prune_report or {}).get("applied") or []}
    items = []
    for p in r.plan.pruning_recommendations:
        text = f"{p.pruning_type} {short(p.layer)} {p.pruning_ratio:.2f}"
        done = applied.get(p.layer)
        change = ""
        if done and done.get("before") is not None:
            unit = UNIT_KINDS[p.pruning_type].counts if p.pruning_type in UNIT_KINDS else ""
            change = f' <span class="muted">({esc(done["before"])}→{esc(done.get("after"))} {unit})</span>'
        items.append(f'<li title="{esc(p.layer)}">{esc(text)}{change}</li>')
    skipped = (r.prune_report or {}).get("skipped") or []
    if skipped:
        reasons = "; ".join(f"{s.get('target')}: {s.get('reason')}" for s in skipped)
        items.append(f'<li class="muted small">skipped: {esc(reasons)}</li>')
    return f'<ul class="plan-list">{"".join(items)}</ul>' if items else '<span class="muted">–</span>'


def rounds(report: RunReport) -> str:
    """One row per pruning round, the best one marked."""
    if not report.rounds:
        return section("rounds", "Pruning rounds", '<p class="muted">No pruning round ran.</p>')
    best = report.pruned.round if report.pruned else None
    headers = [
        ("round", True),
        ("source", False),
        ("plan", False),
        ("accuracy", True),
        ("Δaccuracy (pts, 95 % CI)", True),
        ("agreement", True),
        ("answers changed (predicted → measured)", False),
        ("params", True),
        ("latency", True),
        ("within budget", False),
        ("recovery", False),
    ]
    rows = []
    for r in report.rounds:
        m = r.metrics
        is_best = best is not None and r.round == best
        label = esc(r.round) + (" " + badge("best", "accent") if is_best else "")
        rows.append(
            (
                "best" if is_best else "",
                [
                    label,
                    esc(r.source),
                    _round_plan(r),
                    acc_text(m.accuracy),
                    delta_ci_html(r.accuracy_drop_points, m.paired),
                    esc(agreement(m.paired, "–")),
                    esc(damage_text(r.planner_state, m.paired, "–")),
                    params_text(m.params),
                    ms_text(m.latency_s),
                    budget_badge(r.within_budget),
                    esc(recovery_text(r.prune_report)),
                ],
            )
        )
    note = (
        '<p class="muted small">Every round prunes an intact copy of the original. Round latencies are measured as '
        "each round is evaluated.</p>"
    )
    stopped = _stopped(report, [(f"round {r.round}", r.metrics.paired) for r in report.rounds])
    return section("rounds", "Pruning rounds", table(headers, rows) + note + stopped)


def _stopped(report: RunReport, rows: list[tuple[str, Any]]) -> str:
    """The paragraph naming the candidates sequential evaluation stopped early (empty when none was)."""
    text = stopped_text(rows, report.baseline.samples if report.baseline else 0)
    return f'<p class="muted small">{esc(text)}</p>' if text else ""


def planner(report: RunReport) -> str:
    """Which planner wrote each plan, with its attempts, fallbacks and rejected plans."""
    steps = [("analysis", report.plan.source, report.plan.planner_state or {})]
    steps += [(f"round {r.round}", r.source, r.planner_state or {}) for r in report.rounds]
    items = []
    for step, source, state in steps:
        bits = [f"<strong>{esc(step)}</strong>: {badge(str(source or '–'), 'neutral')}"]
        if "attempts" in state:
            bits.append(f"after {esc(state['attempts'])} attempt(s)")
        if state.get("model"):
            bits.append(f"model <code>{esc(state['model'])}</code>")
        if state.get("level") is not None and as_number(state.get("level")) is not None:
            bits.append(f'<span class="muted">level {float(state["level"]):.3g}</span>')
        usage = state.get("token_usage") or {}
        if usage.get("total_tokens"):
            bits.append(f'<span class="muted">{esc(usage["total_tokens"])} tokens</span>')
        line = " ".join(bits)
        if state.get("fallback_reason"):
            line += f'<br><span class="bad">fell back to the rules planner: {esc(state["fallback_reason"])}</span>'
        rejected = state.get("rejected") or []
        if rejected:
            sub = []
            for rej in rejected:
                reasons = rej.get("reasons") or [rej.get("failure") or "unparsable answer"]
                attempt = f"attempt {rej['attempt']}: " if rej.get("attempt") is not None else ""
                sub.append(f"<li>{esc(attempt)}rejected: {esc('; '.join(str(x) for x in reasons))}</li>")
            line += f"<ul>{''.join(sub)}</ul>"
        items.append(f"<li>{line}</li>")
    if all(source in (None, "rules") for _, source, _ in steps):
        intro = (
            '<p class="muted">Every plan came from the rules planner (offline, deterministic); none was rejected.</p>'
        )
    else:
        n_rejected = sum(len(s.get("rejected") or []) for _, _, s in steps)
        intro = f'<p class="muted">{esc(n_rejected)} plan(s) rejected in all.</p>'
    return section("planner", "Planner decisions", f'{intro}<ul class="decisions">{"".join(items)}</ul>')


def deployment(report: RunReport) -> str:
    """The runtime table: every runtime and precision measured for deployment, the one deployed and why."""
    choice = report.deployment
    if not choice:
        return section("deployment", "Deployment", '<p class="muted">No deployment was measured.</p>')
    headers = [
        ("backend", False),
        ("runtime", False),
        ("precision", False),
        ("latency (batch 1)", True),
        ("throughput", True),
        ("memory", True),
        ("accuracy", True),
        ("Δaccuracy (pts, 95 % CI)", True),
        ("within budget", False),
    ]
    rows = []
    for c in choice.get("candidates") or []:
        deployed = is_chosen(c, choice)
        label = esc(candidate_label(c)) + (" " + badge("deployed", "accent") if deployed else "")
        if c.get("error") or c.get("skipped"):
            why = f"could not run: {c['error']}" if c.get("error") else f"not built: {c['skipped']}"
            cells = [label, esc(c["runtime"]), esc(c["precision"]), esc(why)]
            rows.append(("", cells + ["–"] * 5))
            continue
        paired = PairedAccuracy.model_validate(c["paired"]) if c.get("paired") else None
        rows.append(
            (
                "best" if deployed else "",
                [
                    label,
                    esc(c["runtime"]),
                    esc(c["precision"]),
                    ms_text(c.get("latency_s")),
                    esc(f"{c['throughput_ips']:.0f} img/s" if c.get("throughput_ips") else "–"),
                    esc(f"{c['memory_mb']:.2f} MB" if c.get("memory_mb") is not None else "–"),
                    acc_text(c.get("accuracy")),
                    delta_ci_html(c.get("accuracy_drop_points"), paired),
                    budget_badge(bool(c.get("within_budget"))),
                ],
            )
        )
    built = f" (built from {esc(choice['source'])})" if choice.get("source") else ""
    why = f"<p>Deployed: <b>{esc(choice['chosen'])}</b>{built} — {esc(choice['why'])}.</p>"
    if choice.get("calibration"):
        why += f'<p class="muted small">Static int8 candidates were calibrated on {esc(choice["calibration"])}.</p>'
    if twins := float_twins_text(choice.get("candidates") or []):
        why += f'<p class="muted small">{esc(twins)}</p>'

    original = choice.get("original_latency_s")
    note = (
        f'<p class="muted small">All latencies are measured interleaved in one process; the original FP32 PyTorch '
        f"model took {ms_text(original)} in the same comparison.</p>"
        if original
        else ""
    )
    note += _stopped(report, [(candidate_label(c), c.get("paired")) for c in choice.get("candidates") or []])
    return section(
        "deployment", "Deployment: runtimes measured side by side", why + table(headers, rows) + note + _speedup(report)
    )


def _speedup(report: RunReport) -> str:
    """The deployed model's speed-up as runtime x precision x pruning (one timing run)."""
    if not report.speedup:
        return ""
    from tools.deploy.speedup import SpeedupFactors

    factors = SpeedupFactors.model_validate(report.speedup)
    items = "".join(f"<li>{esc(line)}</li>" for line in factors.lines())
    return (
        '<h3>Speed-up, decomposed</h3><p class="small">The deployed model against the original FP32 PyTorch model '
        "at batch 1; all four models were timed interleaved in one run, so the factors multiply to the total.</p>"
        f'<ul class="decisions">{items}</ul>'
    )
