"""The HTML report's building blocks: escaping, number cells, badges, tables, sections and embedded charts.

Every helper returns HTML text; anything that comes from the report goes through :func:`esc`. Number
helpers accept any value and show ``–`` for what is missing or not a number.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Callable, Iterable
from typing import Any

from tools.reporting.format import EN_DASH, accuracy_pct, millions, millis
from tools.reporting.plots import short_pattern

logger = logging.getLogger(__name__)


def esc(value: Any) -> str:
    """``value`` as escaped text (``None`` as nothing)."""
    return html.escape("" if value is None else str(value), quote=True)


def as_number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` for ``None``, booleans and what is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def acc_text(value: Any) -> str:
    return accuracy_pct(as_number(value))


def delta_html(drop: Any) -> str:
    """The report stores the accuracy *drop* in points; people read the change (+ is better)."""
    v = as_number(drop)
    if v is None:
        return EN_DASH
    change = -v + 0.0  # no "-0.00"
    if abs(change) < 0.005:
        return "0.00"
    cls = "good" if change > 1e-9 else "bad" if change < -1e-9 else ""
    return f'<span class="{cls}">{change:+.2f}</span>' if cls else f"{change:+.2f}"


def params_text(value: Any) -> str:
    """A parameter count, in the unit that reads best: ``86.57 M``, ``0.250 M``, ``9,000``."""
    v = as_number(value)
    if v is None:
        return EN_DASH
    return millions(v, digits=2) if v >= 1e7 else millions(v) if v >= 1e4 else f"{v:,.0f}"


def macs_text(value: Any) -> str:
    v = as_number(value)
    if v is None:
        return EN_DASH
    return f"{v / 1e9:.2f} G" if v >= 1e9 else millions(v, digits=1)


def ms_text(value: Any) -> str:
    return millis(as_number(value), missing=EN_DASH)


def mb_text(value: Any) -> str:
    v = as_number(value)
    return EN_DASH if v is None else f"{v:.2f}" if v >= 0.1 else f"{v:.4f}"


def latency_ratio(base: Any, other: Any) -> float | None:
    """``base / other``, or ``None`` when either is missing or zero."""
    b, o = as_number(base), as_number(other)
    return b / o if b and o else None


def speedup_html(base: Any, other: Any) -> str:
    r = latency_ratio(base, other)
    if r is None:
        return EN_DASH
    cls = "good" if r >= 1.005 else "bad" if r <= 0.995 else ""
    text = f"{r:.2f}×"
    return f'<span class="{cls}">{text}</span>' if cls else text


def saved_html(base: Any, other: Any) -> str:
    """How much smaller ``other`` is than ``base``, in percent, coloured."""
    b, o = as_number(base), as_number(other)
    if not b or o is None:
        return EN_DASH
    saved = 100 * (1 - o / b)
    cls = "good" if saved > 0.05 else "bad" if saved < -0.05 else ""
    return f'<span class="{cls}">{saved:.1f}%</span>' if cls else f"{saved:.1f}%"


def badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{esc(text)}</span>'


def budget_badge(within: Any) -> str:
    if within is None:
        return badge(EN_DASH, "neutral")
    return badge("within budget", "good") if within else badge("over budget", "bad")


def shape_text(shape: Any) -> str:
    """An input shape (the report's dict, or a list) as ``3 × 224 × 224 (from config)``."""
    if isinstance(shape, dict):
        dims = [shape.get(k) for k in ("channels", "height", "width")]
        text = " × ".join(str(d) for d in dims if d is not None)
        if shape.get("channels_source") or shape.get("size_source"):  # where each number came from
            return f"{text} (channels from {shape.get('channels_source')}; size from {shape.get('size_source')})"
        return f"{text} (from {shape['source']})" if shape.get("source") else text
    if isinstance(shape, list | tuple):
        return " × ".join(str(d) for d in shape)
    return EN_DASH if shape is None else str(shape)


def short(pattern: Any) -> str:
    """A layer regex written for people (see :func:`tools.reporting.plots.short_pattern`)."""
    return short_pattern(str(pattern or ""), max_len=60)


def table(headers: Iterable[tuple[str, bool]], rows: Iterable[tuple[str, list[str]]]) -> str:
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


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{body}</section>'


def chart(make: Callable[[], bytes], alt: str, caption: str) -> str:
    """The PNG that ``make`` draws, embedded as a data URI; a short message when it cannot be drawn."""
    try:
        data = make()
    except Exception:  # a chart must never cost the report
        logger.exception("could not draw the chart %r", alt)
        return f'<div class="chart-missing">{esc(alt)}: the chart could not be drawn (see the log).</div>'
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{uri}" alt="{esc(alt)}">{cap}</figure>'
