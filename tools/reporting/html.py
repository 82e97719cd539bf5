"""The run's report as one self-contained HTML page (``report.html``): inline CSS, charts as PNG data URIs.

``render_html(report, profile)`` takes the dict of :func:`tools.report.build_report` and, optionally, the
profile (``profile/profile.json``) for the per-layer latency chart. Every piece of text from the report is
escaped. A chart that cannot be drawn is replaced by a short message: the page is always written.
"""

from __future__ import annotations

import base64
import html
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tools.reporting.plots import layer_latency_chart, short_pattern, tradeoff_charts

logger = logging.getLogger(__name__)

#: The report's named models, in table order.
NAMED_MODELS = (
    ("baseline", "original"),
    ("pruned", "best pruned"),
    ("quantized", "pruned + quantized"),
    ("quantized_original", "original quantized"),
)

_CSS = """
:root { --fg: #1d2433; --muted: #5f6b7a; --line: #e3e7ee; --bg: #f6f8fb; --card: #ffffff;
        --good: #1a7f37; --good-bg: #e9f7ee; --bad: #b42318; --bad-bg: #fdecea; --warn: #8a5a00;
        --warn-bg: #fff6dd; --accent: #2f5fd0; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); line-height: 1.45;
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "DejaVu Sans", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; }
header.top { background: #1d2433; color: #fff; }
header.top .inner { max-width: 1120px; margin: 0 auto; padding: 20px 28px 18px; }
header.top h1 { margin: 0 0 2px; font-size: 13px; font-weight: 600; letter-spacing: .08em;
                text-transform: uppercase; color: #aab4c3; }
header.top .model { font-size: 24px; font-weight: 650; word-break: break-all; }
header.top .sub { color: #c9d1dc; margin-top: 4px; }
nav { margin-top: 12px; display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 13px; }
nav a { color: #9ec1ff; text-decoration: none; }
nav a:hover { text-decoration: underline; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
          padding: 18px 22px; margin: 18px 0; }
h2 { font-size: 17px; margin: 0 0 12px; }
h3 { font-size: 14px; margin: 16px 0 8px; }
p { margin: 6px 0; }
.muted { color: var(--muted); }
.small { font-size: 12px; }
code, .mono { font-family: "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
code { background: #f0f2f6; border-radius: 4px; padding: 1px 5px; word-break: break-all; }
.banner { border-radius: 10px; padding: 12px 16px; margin: 18px 0 0; font-weight: 600; }
.banner.warn { background: var(--warn-bg); color: var(--warn); border: 1px solid #f1d48a; }
.banner.bad { background: var(--bad-bg); color: var(--bad); border: 1px solid #f3b8b2; }
.banner.good { background: var(--good-bg); color: var(--good); border: 1px solid #a9dcb8; }
.banner .detail { font-weight: 400; color: var(--fg); margin-top: 2px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 0; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; word-break: break-word; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; margin-bottom: 14px; }
.card { border: 1px solid var(--line); border-radius: 10px; padding: 12px 14px; background: #fbfcfe; }
.card .label { color: var(--muted); font-size: 12px; }
.card .value { font-size: 24px; font-weight: 700; margin: 2px 0; }
.card .value.good { color: var(--good); }
.card .value.bad { color: var(--bad); }
.card .hint { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f3f5f9; font-weight: 600; color: #364152; white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr.best td { background: #eef4ff; }
tr.best td:first-child { box-shadow: inset 3px 0 0 var(--accent); }
.table-wrap { overflow-x: auto; }
.good { color: var(--good); }
.bad { color: var(--bad); }
.badge { display: inline-block; border-radius: 999px; padding: 1px 9px; font-size: 12px; font-weight: 600;
         white-space: nowrap; }
.badge.good { background: var(--good-bg); color: var(--good); }
.badge.bad { background: var(--bad-bg); color: var(--bad); }
.badge.neutral { background: #eef0f4; color: #4a5565; }
.badge.accent { background: #e7eeff; color: var(--accent); }
.rec { border: 1px solid var(--line); border-left: 4px solid var(--accent); border-radius: 8px; padding: 10px 14px;
       margin: 10px 0; }
.rec.quant { border-left-color: #8e44ad; }
.rec .head { display: flex; flex-wrap: wrap; align-items: baseline; gap: 6px 10px; margin-bottom: 4px; }
.rec .what { font-weight: 650; }
.rec .why { color: #2b3442; }
ul.plan-list { margin: 0; padding-left: 18px; }
ul.plan-list li { margin: 1px 0; }
figure { margin: 6px 0 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 8px; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 6px; }
.chart-missing { padding: 26px; text-align: center; color: var(--muted); border: 1px dashed var(--line);
                 border-radius: 8px; }
details { margin-top: 10px; }
summary { cursor: pointer; color: var(--accent); }
ul.notes li, ul.decisions li { margin: 4px 0; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 24px; }
@media print { body { background: #fff; } section { break-inside: avoid; border-color: #ccc; } nav { display: none; } }
"""


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _acc(value: Any) -> str:
    v = _num(value)
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _delta_points(drop: Any) -> str:
    """The report stores the accuracy *drop* in points; people read the change (+ is better)."""
    v = _num(drop)
    if v is None:
        return "–"
    change = -v + 0.0  # no "-0.00"
    if abs(change) < 0.005:
        return "0.00"
    cls = "good" if change > 1e-9 else "bad" if change < -1e-9 else ""
    return f'<span class="{cls}">{change:+.2f}</span>' if cls else f"{change:+.2f}"


def _params(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "–"
    return f"{v / 1e6:.2f} M" if v >= 1e7 else f"{v / 1e6:.3f} M" if v >= 1e4 else f"{v:,.0f}"


def _macs(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "–"
    return f"{v / 1e9:.2f} G" if v >= 1e9 else f"{v / 1e6:.1f} M"


def _ms(value: Any) -> str:
    v = _num(value)
    return "–" if v is None else f"{1000 * v:.2f} ms"


def _mb(value: Any) -> str:
    v = _num(value)
    return "–" if v is None else f"{v:.2f}" if v >= 0.1 else f"{v:.4f}"


def _ratio(base: Any, other: Any) -> float | None:
    b, o = _num(base), _num(other)
    return b / o if b and o else None


def _speedup(base: Any, other: Any) -> str:
    r = _ratio(base, other)
    if r is None:
        return "–"
    cls = "good" if r >= 1.005 else "bad" if r <= 0.995 else ""
    text = f"{r:.2f}×"
    return f'<span class="{cls}">{text}</span>' if cls else text


def _saved(base: Any, other: Any) -> str:
    b, o = _num(base), _num(other)
    if not b or o is None:
        return "–"
    saved = 100 * (1 - o / b)
    cls = "good" if saved > 0.05 else "bad" if saved < -0.05 else ""
    return f'<span class="{cls}">{saved:.1f}%</span>' if cls else f"{saved:.1f}%"


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{_e(text)}</span>'


def _budget_badge(within: Any) -> str:
    if within is None:
        return _badge("–", "neutral")
    return _badge("within budget", "good") if within else _badge("over budget", "bad")


def _shape(shape: Any) -> str:
    if isinstance(shape, dict):
        dims = [shape.get(k) for k in ("channels", "height", "width")]
        text = " × ".join(str(d) for d in dims if d is not None)
        return f"{text} (from {shape['source']})" if shape.get("source") else text
    if isinstance(shape, list | tuple):
        return " × ".join(str(d) for d in shape)
    return "–" if shape is None else str(shape)


def _short(pattern: Any) -> str:
    return short_pattern(str(pattern or ""), max_len=60)


def _table(headers: Iterable[tuple[str, bool]], rows: Iterable[tuple[str, list[str]]]) -> str:
    """``headers``: (escaped label, numeric); ``rows``: (row class, cells already escaped/HTML)."""
    heads = list(headers)
    head = "".join(f'<th class="num">{h}</th>' if num else f"<th>{h}</th>" for h, num in heads)
    body = []
    for cls, cells in rows:
        tds = "".join(
            f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, (_, num) in zip(cells, heads, strict=True)
        )
        body.append(f'<tr class="{cls}">{tds}</tr>' if cls else f"<tr>{tds}</tr>")
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{body}</section>'


# --------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------


def _chart(make: Callable[[], bytes], alt: str, caption: str) -> str:
    try:
        data = make()
    except Exception:  # a chart must never cost the report
        logger.exception("could not draw the chart %r", alt)
        return f'<div class="chart-missing">{_e(alt)}: the chart could not be drawn (see the log).</div>'
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{uri}" alt="{_e(alt)}">{cap}</figure>'


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _header(report: dict[str, Any]) -> tuple[str, str]:
    model = report.get("model") or {}
    dataset = report.get("dataset") or {}
    settings = report.get("settings") or {}
    family = model.get("family") or "–"
    sub = f"{model.get('model_class') or 'model'} · family {family} · source {model.get('source') or '–'}"
    links = [
        ("summary", "Summary"),
        ("budget", "Budget"),
        ("plan", "Plan"),
        ("rounds", "Rounds"),
        ("planner", "Planner decisions"),
        ("profile", "Profile"),
        ("tradeoffs", "Trade-offs"),
        ("notes", "Notes"),
        ("artifacts", "Artifacts"),
    ]
    nav = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in links)
    top = (
        '<header class="top"><div class="inner"><h1>ProfilingAgent report</h1>'
        f'<div class="model">{_e(model.get("spec") or "(unnamed model)")}</div>'
        f'<div class="sub">{_e(sub)}</div><nav>{nav}</nav></div></header>'
    )
    label_match = dataset.get("label_match") or {}
    classes = ""
    if label_match.get("mapping"):
        classes = f"{len(label_match['mapping'])} classes matched"
        if label_match.get("unmatched"):
            classes += f", {len(label_match['unmatched'])} unmatched (left out): " + ", ".join(
                str(u) for u in label_match["unmatched"][:12]
            )
    ds = dataset.get("spec") or "none (latency and memory only)"
    if dataset.get("split"):
        ds += f" (split {dataset['split']})"
    items = [
        ("model", model.get("spec")),
        ("model class", model.get("model_class")),
        ("family", family),
        ("source", model.get("source")),
        ("parameters", _params(model.get("params"))),
        ("labels", model.get("num_labels")),
        ("input shape", _shape(model.get("input_shape"))),
        ("dataset", ds),
        ("classes", classes or None),
        ("evaluation samples", settings.get("eval_samples")),
        ("device", settings.get("device")),
        ("planner", settings.get("planner")),
        ("pruning rounds", settings.get("iterations")),
        ("selection", settings.get("selection")),
    ]
    meta = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items if v not in (None, ""))
    banner = ""
    if report.get("untrained"):
        banner = (
            '<div class="banner warn" id="untrained">UNTRAINED model (random weights)'
            '<div class="detail">Accuracy is not meaningful and is reported as n/a; the numbers below serve '
            "profiling, latency and memory studies.</div></div>"
        )
    return top, banner + _section("model", "Model and data", f'<dl class="meta">{meta}</dl>')


def _cards(report: dict[str, Any]) -> str:
    base = report.get("baseline") or {}
    key, label = next(((k, lab) for k, lab in reversed(NAMED_MODELS[:3]) if report.get(k)), ("baseline", "original"))
    final = report.get(key) or {}
    if key == "baseline":
        return ""
    cards = []
    r = _ratio(base.get("latency_s"), final.get("latency_s"))
    if r is not None:
        cards.append(("speed-up (batch 1)", f"{r:.2f}×", "good" if r >= 1.005 else "bad" if r <= 0.995 else ""))
    for name, field in (("parameters", "params"), ("memory", "memory_mb")):
        b, o = _num(base.get(field)), _num(final.get(field))
        if b and o is not None:
            saved = 100 * (1 - o / b)
            cards.append((f"{name} saved", f"{saved:.1f}%", "good" if saved > 0.05 else "bad" if saved < -0.05 else ""))
    drop = _num(final.get("accuracy_drop_points"))
    if drop is not None:
        change = -drop
        cards.append(("accuracy change", f"{change:+.2f} pts", "good" if change >= 0 else "bad"))
    elif report.get("untrained") or final.get("accuracy") is None:
        cards.append(("accuracy change", "n/a", ""))
    body = "".join(
        f'<div class="card"><div class="label">{_e(lab)}</div><div class="value {cls}">{_e(val)}</div>'
        f'<div class="hint">{_e(label)} vs original</div></div>'
        for lab, val, cls in cards
    )
    return f'<div class="cards">{body}</div>'


def _summary(report: dict[str, Any]) -> str:
    base = report.get("baseline") or {}
    headers = [
        ("model", False),
        ("accuracy", True),
        ("Δaccuracy (pts)", True),
        ("params", True),
        ("MACs", True),
        ("latency (batch 1)", True),
        ("speed-up", True),
        ("memory (MB)", True),
        ("memory saved", True),
    ]
    rows = []
    for key, label in NAMED_MODELS:
        m = report.get(key)
        if not m:
            continue
        is_base = key == "baseline"
        name = _e(label)
        if key == "pruned" and m.get("round") is not None:
            name += f' <span class="muted small">(round {_e(m["round"])})</span>'
        rows.append(
            (
                "best" if key == "pruned" else "",
                [
                    name,
                    _acc(m.get("accuracy")),
                    "–" if is_base else _delta_points(m.get("accuracy_drop_points")),
                    _params(m.get("params")),
                    _macs(m.get("macs")),
                    _ms(m.get("latency_s")),
                    "1.00×" if is_base else _speedup(base.get("latency_s"), m.get("latency_s")),
                    _mb(m.get("memory_mb")),
                    "–" if is_base else _saved(base.get("memory_mb"), m.get("memory_mb")),
                ],
            )
        )
    interleaved = any((report.get(k) or {}).get("latency_measured") == "interleaved" for k, _ in NAMED_MODELS)
    note = (
        '<p class="muted small">Latencies of these models were re-measured together, interleaved, so their ratios '
        "hold on a noisy machine. Memory is the size of the model as saved for deployment (10<sup>6</sup> bytes).</p>"
        if interleaved
        else '<p class="muted small">Memory is the size of the model as saved for deployment (10<sup>6</sup> bytes).'
        "</p>"
    )
    return _section("summary", "Summary", _cards(report) + _table(headers, rows) + note)


def _budget(report: dict[str, Any]) -> str:
    settings = report.get("settings") or {}
    max_drop = _num(settings.get("max_accuracy_drop"))
    budget = "–" if max_drop is None else f"{max_drop:g} points"
    pruned = report.get("pruned")
    rounds = report.get("rounds") or []
    ok = sum(1 for r in rounds if r.get("within_budget"))
    counts = f"{ok} of {len(rounds)} round(s) within budget." if rounds else "No pruning round ran."
    if pruned is None:
        box = '<div class="banner warn">No pruned model<div class="detail">Pruning was switched off.</div></div>'
    elif pruned.get("within_budget") is False:
        box = (
            '<div class="banner bad">No pruned candidate stayed within the accuracy budget'
            f'<div class="detail">Every round lost more than {_e(budget)} of accuracy: '
            "'best pruned' is the original model. "
            f"{_e(counts)}</div></div>"
        )
    else:
        acc_known = _num(pruned.get("accuracy")) is not None and _num(pruned.get("accuracy_drop_points")) is not None
        where = f"round {pruned.get('round')}" if pruned.get("round") is not None else "the original"
        if acc_known:
            change = -float(pruned["accuracy_drop_points"])
            detail = (
                f"Best pruned model: {where}, accuracy {change:+.2f} points against the original "
                f"(budget: a drop of at most {budget}). {counts}"
            )
        else:
            detail = (
                f"Best pruned model: {where}. Accuracy was not measured (untrained model or no dataset), so the "
                f"budget ({budget}) could not reject any round. {counts}"
            )
        head, kind = ("Within the accuracy budget", "good") if acc_known else ("Accuracy budget not checked", "warn")
        box = f'<div class="banner {kind}">{head}<div class="detail">{_e(detail)}</div></div>'
    selection = settings.get("selection")
    rule = (
        "best accuracy, then fewest parameters, then lowest latency"
        if selection == "accuracy"
        else "fewest parameters within budget"
    )
    extra = f'<p class="muted small">Selection: {_e(selection)} ({_e(rule)}).</p>' if selection else ""
    return _section("budget", "Accuracy budget", box + extra)


def _recommendation(rec: dict[str, Any], quant: bool) -> str:
    layer = rec.get("layer")
    if quant:
        what = f"quantize {_short(layer) if layer != 'all' else 'all Linear layers'}"
        tags = (
            _badge(str(rec.get("quantization_type") or ""), "accent") + " " + _badge(str(rec.get("dtype")), "neutral")
        )
    else:
        what = f"prune {_short(layer)}"
        ratio = _num(rec.get("pruning_ratio"))
        tags = _badge(str(rec.get("pruning_type") or ""), "accent")
        if ratio is not None:
            tags += " " + _badge(f"ratio {ratio:.2f}", "neutral")
    return (
        f'<div class="rec{" quant" if quant else ""}"><div class="head"><span class="what">{_e(what)}</span>{tags}'
        f"<code>{_e(layer)}</code></div>"
        f'<div class="why">{_e(rec.get("justification") or "(no justification given)")}</div></div>'
    )


def _plan(report: dict[str, Any]) -> str:
    plan = report.get("plan") or {}
    pruning = plan.get("pruning_recommendations") or []
    quant = plan.get("quantization_recommendations") or []
    source = _badge(str(plan.get("source") or "–"), "neutral")
    parts = [
        f'<p class="muted">Written by the analysis agent from the profile; source {source}. '
        "Later rounds adjust it (see the rounds table).</p>"
    ]
    if pruning:
        parts.append("<h3>Pruning</h3>" + "".join(_recommendation(r, False) for r in pruning))
    if quant:
        parts.append("<h3>Quantization</h3>" + "".join(_recommendation(r, True) for r in quant))
    if not pruning and not quant:
        parts.append('<p class="muted">The plan has no recommendations.</p>')
    return _section("plan", "Plan (analysis agent)", "".join(parts))


def _round_plan(r: dict[str, Any]) -> str:
    applied = {a.get("pattern"): a for a in (r.get("prune_report") or {}).get("applied") or []}
    items = []
    for p in (r.get("plan") or {}).get("pruning_recommendations") or []:
        ratio = _num(p.get("pruning_ratio"))
        text = f"{p.get('pruning_type')} {_short(p.get('layer'))}" + (f" {ratio:.2f}" if ratio is not None else "")
        done = applied.get(p.get("layer"))
        change = ""
        if done and done.get("before") is not None:
            unit = "heads" if p.get("pruning_type") == "head" else "ch"
            change = f' <span class="muted">({_e(done["before"])}→{_e(done.get("after"))} {unit})</span>'
        items.append(f'<li title="{_e(p.get("layer"))}">{_e(text)}{change}</li>')
    skipped = (r.get("prune_report") or {}).get("skipped") or []
    if skipped:
        reasons = "; ".join(f"{s.get('target')}: {s.get('reason')}" for s in skipped)
        items.append(f'<li class="muted small">skipped: {_e(reasons)}</li>')
    return f'<ul class="plan-list">{"".join(items)}</ul>' if items else '<span class="muted">–</span>'


def _rounds(report: dict[str, Any]) -> str:
    rounds = report.get("rounds") or []
    if not rounds:
        return _section("rounds", "Pruning rounds", '<p class="muted">No pruning round ran.</p>')
    best = (report.get("pruned") or {}).get("round")
    headers = [
        ("round", True),
        ("source", False),
        ("plan", False),
        ("accuracy", True),
        ("Δaccuracy (pts)", True),
        ("params", True),
        ("latency", True),
        ("within budget", False),
    ]
    rows = []
    for r in rounds:
        m = r.get("metrics") or {}
        is_best = best is not None and r.get("round") == best
        label = _e(r.get("round")) + (" " + _badge("best", "accent") if is_best else "")
        rows.append(
            (
                "best" if is_best else "",
                [
                    label,
                    _e(r.get("source")),
                    _round_plan(r),
                    _acc(m.get("accuracy")),
                    _delta_points(r.get("accuracy_drop_points")),
                    _params(m.get("params")),
                    _ms(m.get("latency_s")),
                    _budget_badge(r.get("within_budget")),
                ],
            )
        )
    note = (
        '<p class="muted small">Every round prunes an intact copy of the original. Round latencies are measured as '
        "each round is evaluated.</p>"
    )
    return _section("rounds", "Pruning rounds", _table(headers, rows) + note)


def _planner(report: dict[str, Any]) -> str:
    plan = report.get("plan") or {}
    steps = [("analysis", plan.get("source"), plan.get("planner_state") or {})]
    steps += [
        (f"round {r.get('round')}", r.get("source"), r.get("planner_state") or {}) for r in report.get("rounds") or []
    ]
    items = []
    for step, source, state in steps:
        if not isinstance(state, dict):
            state = {}
        bits = [f"<strong>{_e(step)}</strong>: {_badge(str(source or '–'), 'neutral')}"]
        if "attempts" in state:
            bits.append(f"after {_e(state['attempts'])} attempt(s)")
        if state.get("model"):
            bits.append(f"model <code>{_e(state['model'])}</code>")
        if state.get("level") is not None and _num(state.get("level")) is not None:
            bits.append(f'<span class="muted">level {float(state["level"]):.3g}</span>')
        usage = state.get("token_usage") or {}
        if usage.get("total_tokens"):
            bits.append(f'<span class="muted">{_e(usage["total_tokens"])} tokens</span>')
        line = " ".join(bits)
        if state.get("fallback_reason"):
            line += f'<br><span class="bad">fell back to the rules planner: {_e(state["fallback_reason"])}</span>'
        rejected = state.get("rejected") or []
        if rejected:
            sub = []
            for rej in rejected:
                reasons = rej.get("reasons") or [rej.get("failure") or "unparsable answer"]
                attempt = f"attempt {rej['attempt']}: " if rej.get("attempt") is not None else ""
                sub.append(f"<li>{_e(attempt)}rejected: {_e('; '.join(str(x) for x in reasons))}</li>")
            line += f"<ul>{''.join(sub)}</ul>"
        items.append(f"<li>{line}</li>")
    if all(source in (None, "rules") for _, source, _ in steps):
        intro = (
            '<p class="muted">Every plan came from the rules planner (offline, deterministic); none was rejected.</p>'
        )
    else:
        n_rejected = sum(len((s or {}).get("rejected") or []) for _, _, s in steps if isinstance(s, dict))
        intro = f'<p class="muted">{_e(n_rejected)} plan(s) rejected in all.</p>'
    return _section("planner", "Planner decisions", f'{intro}<ul class="decisions">{"".join(items)}</ul>')


def _profile(report: dict[str, Any], profile: dict[str, Any] | None) -> str:
    summary = report.get("profile") or {}
    facts = []
    if summary.get("latency_s") is not None:
        facts.append(f"forward latency {_ms(summary['latency_s'])} (batch 1)")
    if summary.get("total_macs") is not None:
        facts.append(f"{_macs(summary['total_macs'])} MACs")
    if summary.get("total_params") is not None:
        facts.append(f"{_params(summary['total_params'])} parameters")
    if summary.get("peak_memory_mb") is not None:
        facts.append(f"peak memory {_mb(summary['peak_memory_mb'])} MB")
    parts = [f'<p class="muted">{_e(", ".join(facts))}</p>'] if facts else []
    if profile and profile.get("groups"):
        parts.append(
            _chart(
                lambda: layer_latency_chart(profile),
                "Per-layer latency share",
                "Layer groups are layers repeated across blocks (× count); grey: share of MACs. A container's time "
                "excludes its children's.",
            )
        )
        rows = [
            (
                "",
                [
                    f'<span title="{_e(g.get("pattern"))}">{_e(_short(g.get("pattern")))}</span>',
                    _e(g.get("type")),
                    _e(g.get("count")),
                    f"{100 * (_num(g.get('latency_share')) or 0):.1f}%",
                    f"{100 * (_num(g.get('macs_share')) or 0):.1f}%",
                    f"{100 * (_num(g.get('params_share')) or 0):.1f}%",
                ],
            )
            for g in profile["groups"]
        ]
        headers = [
            ("layer group", False),
            ("type", False),
            ("count", True),
            ("latency share", True),
            ("MACs share", True),
            ("params share", True),
        ]
        parts.append(f"<details><summary>All {len(rows)} layer groups</summary>{_table(headers, rows)}</details>")
    else:
        parts.append('<div class="chart-missing">No profile available: the per-layer chart is left out.</div>')
    return _section("profile", "Profile: where the time goes", "".join(parts))


def _tradeoffs(report: dict[str, Any]) -> str:
    accuracy = any(_num((report.get(k) or {}).get("accuracy")) is not None for k, _ in NAMED_MODELS) or any(
        _num((r.get("metrics") or {}).get("accuracy")) is not None for r in report.get("rounds") or []
    )
    caption = (
        "Each round (R#, green: within budget, red ×: over budget), the original, the best pruned model and the "
        "quantized models. Up and to the left is better."
        if accuracy
        else "Accuracy is not available (untrained model or no dataset): size against latency instead. Down and to "
        "the left is better."
    )
    return _section("tradeoffs", "Trade-offs", _chart(lambda: tradeoff_charts(report), "Trade-off charts", caption))


def _notes(report: dict[str, Any]) -> str:
    notes = report.get("notes") or []
    body = (
        '<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"
        if notes
        else '<p class="muted">No notes.</p>'
    )
    return _section("notes", "Notes", body)


def _artifacts(report: dict[str, Any]) -> str:
    items: list[tuple[str, Any]] = [(label, (report.get(key) or {}).get("artifact")) for key, label in NAMED_MODELS]
    items += [(f"round {r.get('round')}", (r.get("metrics") or {}).get("artifact")) for r in report.get("rounds") or []]
    profile = report.get("profile") or {}
    items += [("profile", profile.get("path")), ("Chrome trace", profile.get("trace_path"))]
    seen: set[tuple[str, str]] = set()
    rows = []
    for label, path in items:
        if not path or (label, str(path)) in seen:
            continue
        seen.add((label, str(path)))
        rows.append(("", [_e(label), f"<code>{_e(path)}</code>"]))
    if not rows:
        return _section("artifacts", "Artifacts", '<p class="muted">No artifact paths recorded.</p>')
    hint = (
        '<p class="muted small">Models reload without unpickling: <code>tools.artifacts.load_compressed(path)</code>. '
        "Open the trace in Perfetto or <code>chrome://tracing</code>.</p>"
    )
    return _section("artifacts", "Artifacts", _table([("what", False), ("path", False)], rows) + hint)


def _settings(report: dict[str, Any]) -> str:
    settings = report.get("settings") or {}
    if not settings:
        return ""
    text = json.dumps(settings, indent=2, sort_keys=True, default=str)
    return _section(
        "settings",
        "Settings",
        f'<details><summary>Run settings</summary><pre class="mono small">{_e(text)}</pre></details>',
    )


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def render_html(report: dict[str, Any], profile: dict[str, Any] | None = None) -> str:
    """The report as one self-contained HTML page (no external resources)."""
    top, model_section = _header(report)
    spec = (report.get("model") or {}).get("spec") or "model"
    sections = [
        model_section,
        _summary(report),
        _budget(report),
        _plan(report),
        _rounds(report),
        _planner(report),
        _profile(report, profile),
        _tradeoffs(report),
        _notes(report),
        _artifacts(report),
        _settings(report),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ProfilingAgent report: {_e(spec)}</title><style>{_CSS}</style></head>"
        f"<body>{top}<main>{''.join(sections)}"
        "<footer>Generated by ProfilingAgent · report.json holds every number shown here.</footer>"
        "</main></body></html>\n"
    )


def load_profile(report: dict[str, Any]) -> dict[str, Any] | None:
    """The profile named by ``report["profile"]["path"]``, or ``None`` when it is missing or unreadable."""
    path = (report.get("profile") or {}).get("path")
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        logger.warning("could not read the profile %s: the HTML report leaves the per-layer chart out", path)
        return None
    return data if isinstance(data, dict) else None


def write_html_report(report: dict[str, Any], profile: dict[str, Any] | None, path: Path | str) -> Path:
    """Render and write the page atomically; returns its path."""
    from tools.store.artifacts import atomic_write_text

    target = Path(path)
    atomic_write_text(target, render_html(report, profile))
    return target
