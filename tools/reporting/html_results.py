"""The HTML report's sections about results: model and data, summary, budget, profile, trade-offs, notes,
artifacts and settings. Each takes the :class:`~tools.schemas.RunReport` and returns its ``<section>``.
"""

from __future__ import annotations

import json
from typing import Any

from tools.reporting.format import named_entries
from tools.reporting.html_parts import (
    acc_text,
    as_number,
    chart,
    esc,
    latency_ratio,
    macs_text,
    mb_text,
    ms_text,
    params_text,
    saved_html,
    section,
    shape_text,
    short,
    speedup_html,
    table,
)
from tools.reporting.paired_text import agreement, confirmed_text, delta_ci_html, selection_text, split_text
from tools.reporting.plots import layer_latency_chart, tradeoff_charts
from tools.schemas import RunReport

#: The page's navigation: (section anchor, title).
NAV_LINKS = (
    ("summary", "Summary"),
    ("budget", "Budget"),
    ("plan", "Plan"),
    ("rounds", "Rounds"),
    ("planner", "Planner decisions"),
    ("deployment", "Deployment"),
    ("profile", "Profile"),
    ("sensitivity", "Sensitivity"),
    ("tradeoffs", "Trade-offs"),
    ("time", "Time"),
    ("notes", "Notes"),
    ("artifacts", "Artifacts"),
)


def header(report: RunReport) -> tuple[str, str]:
    """The page's top bar (title and navigation) and the model-and-data section."""
    model, dataset, settings = report.model, report.dataset, report.settings
    family = model.get("family") or "–"
    sub = f"{model.get('model_class') or 'model'} · family {family} · source {model.get('source') or '–'}"
    nav = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in NAV_LINKS)
    top = (
        '<header class="top"><div class="inner"><h1>ProfilingAgent report</h1>'
        f'<div class="model">{esc(model.get("spec") or "(unnamed model)")}</div>'
        f'<div class="sub">{esc(sub)}</div><nav>{nav}</nav></div></header>'
    )
    label_match = dataset.get("label_match") or {}
    classes = ""
    if label_match.get("unlabelled"):
        classes = "none (unlabelled): each image's target is the original's answer; accuracy = agreement with it"
    elif label_match.get("mapping"):
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
        ("parameters", params_text(model.get("params"))),
        ("labels", model.get("num_labels")),
        ("input shape", shape_text(model.get("input_shape"))),
        ("dataset", ds),
        ("classes", classes or None),
        ("evaluation samples", settings.get("eval_samples")),
        ("data split", split_text(dataset)),
        ("what ships", confirmed_text(report)),
        ("device", settings.get("device")),
        ("planner", settings.get("planner")),
        ("pruning rounds", settings.get("iterations")),
        ("selection", settings.get("selection")),
    ]
    meta = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items if v not in (None, ""))
    banner = ""
    if report.untrained:
        banner = (
            '<div class="banner warn" id="untrained">UNTRAINED model (random weights)'
            '<div class="detail">Accuracy is not meaningful and is reported as n/a; the numbers below serve '
            "profiling, latency and memory studies.</div></div>"
        )
    return top, banner + section("model", "Model and data", f'<dl class="meta">{meta}</dl>')


def _cards(report: RunReport) -> str:
    """Headline cards: the final model (quantized, else best pruned) against the original."""
    finals = [(label, entry) for key, label, entry in named_entries(report) if key in ("pruned", "quantized")]
    if not finals:
        return ""
    label, final = finals[-1]
    base = report.baseline
    cards = []
    r = latency_ratio(base.latency_s if base else None, final.latency_s)
    if r is not None:
        cards.append(("speed-up (batch 1)", f"{r:.2f}×", "good" if r >= 1.005 else "bad" if r <= 0.995 else ""))
    sizes: list[tuple[str, float | None, float]] = [
        ("parameters", base.params if base else None, final.params),
        ("memory", base.memory_mb if base else None, final.memory_mb),
    ]
    for name, base_size, final_size in sizes:
        b, o = as_number(base_size), as_number(final_size)
        if b and o is not None:
            saved = 100 * (1 - o / b)
            cards.append((f"{name} saved", f"{saved:.1f}%", "good" if saved > 0.05 else "bad" if saved < -0.05 else ""))
    drop = as_number(final.accuracy_drop_points)
    if drop is not None:
        change = -drop
        cards.append(("accuracy change", f"{change:+.2f} pts", "good" if change >= 0 else "bad"))
    elif report.untrained or final.accuracy is None:
        cards.append(("accuracy change", "n/a", ""))
    body = "".join(
        f'<div class="card"><div class="label">{esc(lab)}</div><div class="value {cls}">{esc(val)}</div>'
        f'<div class="hint">{esc(label)} vs original</div></div>'
        for lab, val, cls in cards
    )
    return f'<div class="cards">{body}</div>'


def summary(report: RunReport) -> str:
    """Headline cards and one row per named model: accuracy, size, latency and memory against the original."""
    base = report.baseline
    base_latency, base_memory = (base.latency_s, base.memory_mb) if base else (None, None)
    headers = [
        ("model", False),
        ("accuracy", True),
        ("Δaccuracy (pts, 95 % CI)", True),
        ("agreement", True),
        ("params", True),
        ("MACs", True),
        ("latency (batch 1)", True),
        ("speed-up", True),
        ("memory (MB)", True),
        ("memory saved", True),
    ]
    rows = []
    for key, label, m in named_entries(report):
        is_base = key == "baseline"
        name = esc(label)
        if key == "pruned" and m.round is not None:
            name += f' <span class="muted small">(round {esc(m.round)})</span>'
        rows.append(
            (
                "best" if key == "pruned" else "",
                [
                    name,
                    acc_text(m.accuracy),
                    "–" if is_base else delta_ci_html(m.accuracy_drop_points, m.paired),
                    "–" if is_base else esc(agreement(m.paired, "–")),
                    params_text(m.params),
                    macs_text(m.macs),
                    ms_text(m.latency_s),
                    "1.00×" if is_base else speedup_html(base_latency, m.latency_s),
                    mb_text(m.memory_mb),
                    "–" if is_base else saved_html(base_memory, m.memory_mb),
                ],
            )
        )
    interleaved = any(m.latency_measured == "interleaved" for _, _, m in named_entries(report))
    note = (
        '<p class="muted small">Latencies of these models were re-measured together, interleaved, so their ratios '
        "hold on a noisy machine. Memory is the size of the model as saved for deployment (10<sup>6</sup> bytes).</p>"
        if interleaved
        else '<p class="muted small">Memory is the size of the model as saved for deployment (10<sup>6</sup> bytes).'
        "</p>"
    )
    return section("summary", "Summary", _cards(report) + table(headers, rows) + note)


def budget(report: RunReport) -> str:
    """Whether the best pruned model stayed within the accuracy budget, and how many rounds did."""
    max_drop = as_number(report.settings.get("max_accuracy_drop"))
    limit = "–" if max_drop is None else f"{max_drop:g} points"
    pruned, rounds = report.pruned, report.rounds
    ok = sum(1 for r in rounds if r.within_budget)
    counts = f"{ok} of {len(rounds)} round(s) within budget." if rounds else "No pruning round ran."
    if pruned is None:
        box = '<div class="banner warn">No pruned model<div class="detail">Pruning was switched off.</div></div>'
    elif pruned.within_budget is False:
        box = (
            '<div class="banner bad">No pruned candidate stayed within the accuracy budget'
            f'<div class="detail">Every round lost more than {esc(limit)} of accuracy: '
            "'best pruned' is the original model. "
            f"{esc(counts)}</div></div>"
        )
    else:
        acc_known = as_number(pruned.accuracy) is not None and as_number(pruned.accuracy_drop_points) is not None
        where = f"round {pruned.round}" if pruned.round is not None else "the original"
        if acc_known:
            change = -float(pruned.accuracy_drop_points or 0.0)
            detail = (
                f"Best pruned model: {where}, accuracy {change:+.2f} points against the original "
                f"(budget: a drop of at most {limit}). {counts}"
            )
        else:
            detail = (
                f"Best pruned model: {where}. Accuracy was not measured (untrained model or no dataset), so the "
                f"budget ({limit}) could not reject any round. {counts}"
            )
        head, kind = ("Within the accuracy budget", "good") if acc_known else ("Accuracy budget not checked", "warn")
        box = f'<div class="banner {kind}">{head}<div class="detail">{esc(detail)}</div></div>'
    selection = report.settings.get("selection")
    rule = (
        "best accuracy, then fewest parameters, then lowest latency"
        if selection == "accuracy"
        else "fewest parameters within budget"
    )
    extra = f'<p class="muted small">Selection: {esc(selection)} ({esc(rule)}).</p>' if selection else ""
    if rounds and report.dataset.get("spec"):
        extra += f'<p class="muted small">{esc(selection_text(report))}</p>'
    confirmed = confirmed_text(report)
    if confirmed:
        extra = f'<p id="confirmed"><strong>{esc(confirmed)}</strong></p>' + extra
    return section("budget", "Accuracy budget", box + extra)


def profile_section(report: RunReport, profile: dict[str, Any] | None) -> str:
    """The profile's headline figures, the per-layer latency chart and every layer group."""
    figures = report.profile
    facts = []
    if figures.get("latency_s") is not None:
        facts.append(f"forward latency {ms_text(figures['latency_s'])} (batch 1)")
    if figures.get("total_macs") is not None:
        facts.append(f"{macs_text(figures['total_macs'])} MACs")
    if figures.get("total_params") is not None:
        facts.append(f"{params_text(figures['total_params'])} parameters")
    if figures.get("peak_memory_mb") is not None:
        facts.append(f"peak memory {mb_text(figures['peak_memory_mb'])} MB")
    parts = [f'<p class="muted">{esc(", ".join(facts))}</p>'] if facts else []
    if profile and profile.get("groups"):
        parts.append(
            chart(
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
                    f'<span title="{esc(g.get("pattern"))}">{esc(short(g.get("pattern")))}</span>',
                    esc(g.get("type")),
                    esc(g.get("count")),
                    f"{100 * (as_number(g.get('latency_share')) or 0):.1f}%",
                    f"{100 * (as_number(g.get('macs_share')) or 0):.1f}%",
                    f"{100 * (as_number(g.get('params_share')) or 0):.1f}%",
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
        parts.append(f"<details><summary>All {len(rows)} layer groups</summary>{table(headers, rows)}</details>")
    else:
        parts.append('<div class="chart-missing">No profile available: the per-layer chart is left out.</div>')
    return section("profile", "Profile: where the time goes", "".join(parts))


def tradeoffs(report: RunReport) -> str:
    accuracy = any(as_number(m.accuracy) is not None for _, _, m in named_entries(report)) or any(
        as_number(r.metrics.accuracy) is not None for r in report.rounds
    )
    caption = (
        "Each round (R#, green: within budget, red ×: over budget), the original, the best pruned model and the "
        "quantized models. Up and to the left is better."
        if accuracy
        else "Accuracy is not available (untrained model or no dataset): size against latency instead. Down and to "
        "the left is better."
    )
    return section("tradeoffs", "Trade-offs", chart(lambda: tradeoff_charts(report), "Trade-off charts", caption))


def notes(report: RunReport) -> str:
    body = (
        '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in report.notes) + "</ul>"
        if report.notes
        else '<p class="muted">No notes.</p>'
    )
    return section("notes", "Notes", body)


def artifacts(report: RunReport) -> str:
    """Where the run's models, profile and trace are, each path once."""
    items: list[tuple[str, Any]] = [(label, m.artifact) for _, label, m in named_entries(report)]
    items += [(f"round {r.round}", r.metrics.artifact) for r in report.rounds]
    items += [("profile", report.profile.get("path")), ("Chrome trace", report.profile.get("trace_path"))]
    seen: set[tuple[str, str]] = set()
    rows = []
    for label, path in items:
        if not path or (label, str(path)) in seen:
            continue
        seen.add((label, str(path)))
        rows.append(("", [esc(label), f"<code>{esc(path)}</code>"]))
    if not rows:
        return section("artifacts", "Artifacts", '<p class="muted">No artifact paths recorded.</p>')
    hint = (
        '<p class="muted small">Models reload without unpickling: '
        "<code>from tools import load_compressed; load_compressed(path)</code>. "
        "Open the trace in Perfetto or <code>chrome://tracing</code>.</p>"
    )
    return section("artifacts", "Artifacts", table([("what", False), ("path", False)], rows) + hint)


def settings_section(report: RunReport) -> str:
    if not report.settings:
        return ""
    text = json.dumps(report.settings, indent=2, sort_keys=True, default=str)
    return section(
        "settings",
        "Settings",
        f'<details><summary>Run settings</summary><pre class="mono small">{esc(text)}</pre></details>',
    )
