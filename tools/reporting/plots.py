"""The report's charts, as PNG bytes: where the time goes, and the trade-offs of a run's models.

* :func:`layer_latency_chart`: latency share of a profile's most expensive layer groups.
* :func:`tradeoff_charts`: accuracy (or, untrained, size) against parameters and latency, for every round,
  the original, the best pruned and the quantized models of a report.
* :func:`short_pattern`: a layer-group regex written for people; :func:`save_png` writes a chart to a file.

Both charts are thin adapters over the generic builders of :mod:`tools.reporting.charts`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tools.reporting.charts import Bar, Panel, Point, SeriesStyle, finite, scatter_panels, share_bar_chart
from tools.reporting.format import deployed_original, named_entries
from tools.schemas import Metrics, RunReport


def save_png(data: bytes, path: Path | str) -> Path:
    """Write PNG bytes to ``path`` atomically."""
    from tools.store.files import atomic_write_bytes

    return atomic_write_bytes(Path(path), data)


def short_pattern(pattern: str, max_len: int = 44) -> str:
    """A layer regex for people: ``^vit\\.layers\\.\\d+\\.attention$`` → ``vit.layers.*.attention``.

    Alternations of explicit names (``^(?:features\\.0|features\\.3)$``) show the first name and how many
    more; long results keep their end (the most specific part) behind an ellipsis.
    """
    text = pattern.strip()
    text = text.removeprefix("^").removesuffix("$")
    alternatives: list[str] = []
    match = re.fullmatch(r"\(\?:(.*)\)", text)
    if match and "(" not in match.group(1):
        alternatives = match.group(1).split("|")
    elif "|" in text and "(" not in text:
        alternatives = text.split("|")
    if alternatives:
        first = _unescape(alternatives[0])
        text = first if len(alternatives) == 1 else f"{first} (+{len(alternatives) - 1})"
    else:
        text = _unescape(text)
    if not text:
        return "(model)"
    if len(text) > max_len:
        suffix = re.search(r" \(\+\d+\)$", text)
        tail = suffix.group(0) if suffix else ""
        body = text[: len(text) - len(tail)]
        room = max_len - 1 - len(tail)
        kept = ""
        for part in reversed(body.split(".")):  # whole name components from the end, while they fit
            candidate = part if not kept else f"{part}.{kept}"
            if len(candidate) + 1 > room:
                break
            kept = candidate
        text = "…" + (kept or body[-room:]) + tail
    return text


_REGEX_TOKEN = re.compile(r"\\d\+|\\d|\\(.)|\.\*|\.\+")


def _unescape(text: str) -> str:
    def token(match: re.Match[str]) -> str:
        found = match.group(0)
        if found == r"\d":
            return "#"
        if match.group(1) is not None:
            return match.group(1)
        return "*"  # \d+, .*, .+

    return _REGEX_TOKEN.sub(token, text)


def layer_latency_chart(profile: dict[str, Any], top: int = 20) -> bytes:
    """Latency share of the ``top`` most expensive layer groups of a profile (``profile["groups"]``)."""
    groups = list(profile.get("groups") or [])[: max(1, top)]
    bars = [
        Bar(
            label=short_pattern(str(g.get("pattern", ""))) + (f" ×{g['count']}" if (g.get("count") or 1) > 1 else ""),
            value=finite(g.get("latency_share")),
            secondary=finite(g.get("macs_share")),
            category=str(g.get("type") or ""),
        )
        for g in groups
    ]
    total = profile.get("latency_s")
    where = f" on {profile['device']}" if profile.get("device") else ""
    title = f"Where the time goes: top {len(bars)} layer groups (batch 1{where}"
    title += f", {1000 * total:.2f} ms per forward)" if total else ")"
    footnote = "Self time of each group (children excluded) as a share of the whole forward pass, timed with hooks."
    return share_bar_chart(
        bars,
        title=title,
        value_label="share of forward latency",
        secondary_label="MACs share",
        footnote=footnote,
        size=(9.0, max(3.2, min(0.9 + 0.22 * len(bars), 6.0))),
    )


#: Styles of the trade-off charts' rounds, by series name, and of the named models, by key in report.json
#: (``original_deployed``: the deployed model when it is the unpruned original).
TRADEOFF_STYLES: dict[str, SeriesStyle] = {
    "round (within budget)": SeriesStyle(marker="o", color="#2ca02c", size=45),
    "round (over budget)": SeriesStyle(marker="x", color="#d62728", size=50),
    "baseline": SeriesStyle(marker="*", color="#222222", size=190, zorder=4),
    "pruned": SeriesStyle(marker="o", color="#1f77b4", size=190, filled=False, zorder=4),
    "quantized": SeriesStyle(marker="s", color="#9467bd", size=75, zorder=4),
    "quantized_original": SeriesStyle(marker="^", color="#ff7f0e", size=75, zorder=4),
    "original_deployed": SeriesStyle(marker="s", color="#ff7f0e", size=75, zorder=4),
}


def _named_styles(report: RunReport) -> dict[str, SeriesStyle]:
    """The style of each series of ``report``'s charts, by the series' label."""
    styles = {name: style for name, style in TRADEOFF_STYLES.items() if name.startswith("round")}
    for key, label, _ in named_entries(report):
        styles[label] = TRADEOFF_STYLES["original_deployed" if deployed_original(label) else key]
    return styles


def _entry(metrics: Metrics) -> dict[str, float | None]:
    return {
        "acc": None if metrics.accuracy is None else 100.0 * float(metrics.accuracy),
        "params": float(metrics.params) / 1e6,
        "latency": 1000.0 * float(metrics.latency_s),
        "memory": float(metrics.memory_mb),
    }


def tradeoff_points(report: RunReport | dict[str, Any]) -> list[tuple[str, str, dict[str, float | None]]]:
    """``(series, note, values)`` for every round and the named models of a report; ``values`` holds
    ``acc`` (%), ``params`` (M), ``latency`` (ms) and ``memory`` (MB), any of them ``None``."""
    report = RunReport.model_validate(report)
    out: list[tuple[str, str, dict[str, float | None]]] = []
    for r in report.rounds:
        series = "round (within budget)" if r.within_budget else "round (over budget)"
        out.append((series, f"R{r.round}", _entry(r.metrics)))
    for _, series, entry in named_entries(report):
        out.append((series, "", _entry(entry)))
    return out


#: A trade-off panel: the x and y keys of :func:`tradeoff_points`' values, the axis labels, the panel's title and
#: the x and y tick formats.
_PanelSpec = tuple[str, str, str, str, str, str, str]


def _panel_specs(has_accuracy: bool, model: str) -> tuple[list[_PanelSpec], str]:
    """The two panels of the trade-off charts and their title: accuracy against size and latency, or without accuracy
    size against latency."""
    if has_accuracy:
        specs = [
            ("params", "acc", "parameters (M)", "accuracy (%)", "Accuracy vs parameters", "{:.3g}", "{:.1f}"),
            ("latency", "acc", "latency, batch 1 (ms)", "accuracy (%)", "Accuracy vs latency", "{:.3g}", "{:.1f}"),
        ]
        return specs, f"Accuracy trade-offs: {model}"
    specs = [
        (
            "latency",
            "params",
            "latency, batch 1 (ms)",
            "parameters (M)",
            "Parameters vs latency",
            "{:.3g}",
            "{:.3g}",
        ),
        ("latency", "memory", "latency, batch 1 (ms)", "memory (MB)", "Memory vs latency", "{:.3g}", "{:.3g}"),
    ]
    return specs, f"Size vs latency: {model} (no accuracy: untrained or no dataset)"


def _budget_lines(report: RunReport, has_accuracy: bool) -> list[tuple[float, str]]:
    """The accuracy budget's line (the baseline's accuracy less the allowed drop), where there is one."""
    budget_lines: list[tuple[float, str]] = []
    base = None if report.baseline is None else _entry(report.baseline)
    max_drop = report.settings.get("max_accuracy_drop")
    if has_accuracy and base and base["acc"] is not None and max_drop is not None:
        budget_lines.append((base["acc"] - float(max_drop), f"budget ({float(max_drop):g} pts)"))
    return budget_lines


def tradeoff_charts(report: RunReport | dict[str, Any]) -> bytes:
    """Accuracy against parameters and against latency, for every round and the named models.

    Without accuracy (untrained models) the panels are parameters and memory against latency instead,
    and the title says so.
    """
    report = RunReport.model_validate(report)
    entries = tradeoff_points(report)
    has_accuracy = any(v["acc"] is not None for _, _, v in entries)
    specs, title = _panel_specs(has_accuracy, report.model.get("spec") or "")
    budget_lines = _budget_lines(report, has_accuracy)
    panels = []
    for xk, yk, xlabel, ylabel, panel_title, xf, yf in specs:
        points = [
            Point(float(x), float(y), series, note)
            for series, note, v in entries
            if (x := v[xk]) is not None and (y := v[yk]) is not None
        ]
        trail = [(p.x, p.y) for p in points if p.note]
        panels.append(
            Panel(
                points,
                xlabel,
                ylabel,
                title=panel_title,
                trail=trail,
                trail_label="rounds in order",
                hlines=budget_lines if yk == "acc" else [],
                x_format=xf,
                y_format=yf,
            )
        )
    footnote = ""
    if any(entry.latency_measured == "interleaved" for _, _, entry in named_entries(report)):
        footnote = (
            "Rounds are timed as they are evaluated; the original, best pruned and quantized models are re-timed "
            "together (interleaved), so the best pruned model can sit apart from its round on the latency axis."
        )
    return scatter_panels(panels, title=title, styles=_named_styles(report), footnote=footnote)
