"""Generic chart builders, as PNG bytes (matplotlib, Agg backend, no display, no pyplot state).

Both take plain lists of labelled values, so any caller can reuse them:

* :func:`share_bar_chart`: horizontal bars of shares (fractions), e.g. latency share per layer group, with an
  optional secondary share drawn as a thin bar under each (e.g. MACs share).
* :func:`scatter_panels`: one or more scatter panels side by side, points grouped into styled series, with
  per-point annotations, an optional trail joining points in order and optional reference lines.

Output is deterministic for the same input (no timestamps or version in the PNG metadata, fixed fonts
and sizes) and each chart renders in well under a second. The report's own charts are in
:mod:`tools.reporting.plots`.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

DPI = 100
#: Default figure size in inches at :data:`DPI`: 900 x 500 px.
DEFAULT_SIZE = (9.0, 5.0)
#: Colour cycle for categories (matplotlib's tab10, stable order).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_RC: Any = {  # typed loosely: matplotlib's stubs want literal keys
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.7,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "svg.hashsalt": "profiling-agent",
}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    return buffer.getvalue()


def _figure(size: tuple[float, float]) -> Figure:
    return Figure(figsize=size, dpi=DPI, layout="constrained")


def _message_chart(title: str, message: str, size: tuple[float, float]) -> bytes:
    with matplotlib.rc_context(_RC):
        fig = _figure(size)
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.set_title(title, loc="left")
        ax.text(0.5, 0.5, message, ha="center", va="center", color="#666666", transform=ax.transAxes)
        return _png(fig)


# --------------------------------------------------------------------------------------------
# Generic: share bars
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar: ``value`` and ``secondary`` are fractions (0.25 = 25%); ``category`` picks the colour."""

    label: str
    value: float
    secondary: float | None = None
    category: str = ""


def share_bar_chart(
    bars: Sequence[Bar],
    *,
    title: str,
    value_label: str = "share",
    secondary_label: str = "",
    footnote: str = "",
    clip_at: float | None = 1.0,
    size: tuple[float, float] = DEFAULT_SIZE,
) -> bytes:
    """Horizontal bars, first bar on top, each labelled with its percentage.

    Bars above ``clip_at`` (a fraction; ``None`` for no clipping) are cut at the axis edge and say so in
    their label, so one outlier does not flatten every other bar.
    """
    if not bars:
        return _message_chart(title, "nothing to plot", size)
    categories = list(dict.fromkeys(b.category for b in bars))
    colours = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(categories)}
    scale = _bar_scale(bars, clip_at)

    with matplotlib.rc_context(_RC):
        fig = _figure(size)
        ax = fig.add_subplot()
        _draw_bars(ax, bars, colours, scale)
        ax.invert_yaxis()
        ax.set_xlim(0, scale.limit)
        ax.xaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
        ax.grid(axis="y", visible=False)
        ax.set_xlabel(value_label)
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
        handles = [_patch(colours[c], c) for c in categories if c]
        if scale.has_secondary and secondary_label:
            handles.append(_patch("#bbbbbb", secondary_label))
        if handles:
            fig.legend(handles=handles, loc="outside right upper")
        notes = [footnote] if footnote else []
        if scale.clipped:
            notes.append(f"› bars above {100 * (clip_at or 0):.0f}% are cut at the axis edge.")
        _footnote(fig, "  ".join(notes), size)
        return _png(fig)


@dataclass(frozen=True)
class _BarScale:
    """The bars' values (negative and non-finite ones as 0), whether they are cut at the axis edge, and its limit."""

    values: list[float]
    secondaries: list[float | None]
    clipped: bool
    limit: float

    @property
    def has_secondary(self) -> bool:
        return any(s is not None for s in self.secondaries)


def _bar_scale(bars: Sequence[Bar], clip_at: float | None) -> _BarScale:
    """The values of ``bars`` and the x-axis limit: the largest value, or ``clip_at`` when a bar exceeds it."""
    values = [max(0.0, finite(b.value)) for b in bars]
    secondaries = [None if b.secondary is None else max(0.0, finite(b.secondary)) for b in bars]
    clipped = clip_at is not None and any(v > clip_at for v in values)
    top = max([*values, *(s for s in secondaries if s is not None), 1e-9])
    limit = (clip_at if clipped and clip_at is not None else top) * 1.16
    return _BarScale(values, secondaries, clipped, limit)


def _draw_bars(ax: Any, bars: Sequence[Bar], colours: dict[str, str], scale: _BarScale) -> None:
    """The bars (each secondary a thin grey bar under its bar), their percentages and their labels."""
    has_secondary = scale.has_secondary
    positions = list(range(len(bars)))
    height = 0.58 if has_secondary else 0.75
    shown = [min(v, scale.limit / 1.16) if scale.clipped else v for v in scale.values]
    ax.barh(
        [p - (0.12 if has_secondary else 0.0) for p in positions],
        shown,
        height=height,
        color=[colours[b.category] for b in bars],
        zorder=2,
    )
    if has_secondary:
        ax.barh(
            [p + 0.3 for p in positions],
            [s or 0.0 for s in scale.secondaries],
            height=0.22,
            color="#bbbbbb",
            zorder=2,
        )
    for p, value, drawn in zip(positions, scale.values, shown, strict=True):
        text = f"{100 * value:.1f}%" + (" ›" if drawn < value else "")
        ax.text(
            drawn + scale.limit * 0.008,
            p - (0.12 if has_secondary else 0.0),
            text,
            va="center",
            fontsize=8,
            color="#b00020" if drawn < value else "#222222",
        )
    ax.set_yticks(positions, [b.label for b in bars], fontsize=8, fontfamily="DejaVu Sans Mono")


def _footnote(fig: Figure, text: str, size: tuple[float, float], extra_inches: float = 0.0) -> float:
    """Small grey text along the bottom edge; keeps ``extra_inches`` more free above it (for a legend).

    Returns the height the text takes, as a fraction of the figure height.
    """
    lines = textwrap.wrap(text, width=int(size[0] * 16)) if text else []
    text_height = (len(lines) * 7.5 * 1.3 / 72 + (0.06 if lines else 0.0)) / size[1]
    reserved = text_height + extra_inches / size[1]
    engine = fig.get_layout_engine()
    if engine is not None and reserved > 0:
        engine.set(rect=(0.0, reserved, 1.0, 1.0 - reserved))  # type: ignore[call-arg]
    if lines:
        fig.text(0.01, 0.04 / size[1], "\n".join(lines), fontsize=7.5, color="#666666", ha="left", va="bottom")
    return text_height


def _patch(colour: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, label=label)


def finite(value: float | None) -> float:
    """``value`` as a float, or 0.0 when it is missing, infinite or NaN."""
    return float(value) if value is not None and math.isfinite(float(value)) else 0.0


# --------------------------------------------------------------------------------------------
# Generic: scatter panels
# --------------------------------------------------------------------------------------------


#: Markers drawn as lines only (no face to fill, no edge to outline).
_LINE_MARKERS = frozenset({"x", "+", "1", "2", "3", "4", "|", "_"})


@dataclass(frozen=True)
class SeriesStyle:
    marker: str = "o"
    color: str = "#1f77b4"
    size: float = 55.0
    filled: bool = True
    zorder: int = 3


@dataclass(frozen=True)
class Point:
    """A point of series ``series``; ``note`` is written next to it (e.g. a round number)."""

    x: float
    y: float
    series: str
    note: str = ""


@dataclass
class Panel:
    """One scatter panel. ``trail`` joins points in order (a faint dotted line, e.g. rounds in order);
    ``hlines`` are reference lines ``(y, label)``, drawn only when they sit near the data."""

    points: list[Point]
    xlabel: str
    ylabel: str
    title: str = ""
    trail: list[tuple[float, float]] = field(default_factory=list)
    trail_label: str = ""
    hlines: list[tuple[float, str]] = field(default_factory=list)
    x_format: str = "{:g}"
    y_format: str = "{:g}"


def scatter_panels(
    panels: Sequence[Panel],
    *,
    title: str,
    styles: dict[str, SeriesStyle] | None = None,
    footnote: str = "",
    size: tuple[float, float] = DEFAULT_SIZE,
) -> bytes:
    """Panels side by side with one shared legend (series in first-appearance order)."""
    panels = [p for p in panels if p.points]
    if not panels:
        return _message_chart(title, "nothing to plot", size)
    order = list(dict.fromkeys(pt.series for p in panels for pt in p.points))
    styles = _series_styles(order, styles)

    with matplotlib.rc_context(_RC):
        fig = _figure(size)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        handles: dict[str, Any] = {}
        for ax, panel in zip(axes, panels, strict=True):
            _draw_panel(fig, ax, panel, [(name, styles[name]) for name in order], handles)
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
        ncols = min(len(handles), 4)
        legend_rows = math.ceil(len(handles) / ncols) if handles else 0
        note_height = _footnote(fig, footnote, size, extra_inches=legend_rows * 0.2 + (0.06 if handles else 0.0))
        if handles:
            fig.legend(
                list(handles.values()),
                list(handles.keys()),
                loc="lower center",
                bbox_to_anchor=(0.5, note_height),
                ncols=ncols,
            )
        return _png(fig)


def _series_styles(order: list[str], styles: dict[str, SeriesStyle] | None) -> dict[str, SeriesStyle]:
    """``styles``, with a palette colour for each series of ``order`` it does not style, in order."""
    styles = dict(styles or {})
    for i, name in enumerate(n for n in order if n not in styles):
        styles[name] = SeriesStyle(color=PALETTE[i % len(PALETTE)])
    return styles


def _draw_panel(
    fig: Figure, ax: Any, panel: Panel, series: list[tuple[str, SeriesStyle]], handles: dict[str, Any]
) -> None:
    """One panel: its trail, each series' points, notes and nearby reference lines; adds legend entries to
    ``handles`` (the first artist of each label)."""
    if len(panel.trail) > 1:
        xs, ys = zip(*panel.trail, strict=True)
        (line,) = ax.plot(xs, ys, ls=":", lw=1.0, color="#9a9a9a", zorder=1)
        if panel.trail_label:
            handles.setdefault(panel.trail_label, line)
    for name, style in series:
        pts = [pt for pt in panel.points if pt.series == name]
        if pts:
            artist = ax.scatter([pt.x for pt in pts], [pt.y for pt in pts], label=name, **_scatter_kwargs(style))
            handles.setdefault(name, artist)
    _pad_limits(ax, panel)
    _annotate(ax, [pt for pt in panel.points if pt.note], fig)
    ymin, ymax = ax.get_ylim()
    span = ymax - ymin
    for y, label in panel.hlines:
        if ymin - 0.5 * span <= y <= ymax + 0.5 * span:  # near the data: widen the axis to show it
            line = ax.axhline(y, ls="--", lw=1.0, color="#d62728", alpha=0.7, zorder=1)
            handles.setdefault(label, line)
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, y - 0.06 * span), max(hi, y + 0.06 * span))
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.title:
        ax.set_title(panel.title, loc="left")
    ax.xaxis.set_major_formatter(FuncFormatter(_formatter(panel.x_format)))
    ax.yaxis.set_major_formatter(FuncFormatter(_formatter(panel.y_format)))


def _scatter_kwargs(style: SeriesStyle) -> dict[str, Any]:
    """``ax.scatter``'s keywords for a series of ``style``: line markers, filled or hollow ones."""
    kwargs: dict[str, Any] = {"s": style.size, "marker": style.marker, "zorder": style.zorder}
    if style.marker in _LINE_MARKERS:
        kwargs.update(c=style.color, linewidths=1.6)
    elif style.filled:
        kwargs.update(c=style.color, edgecolors="white", linewidths=0.6)
    else:
        kwargs.update(facecolors="none", edgecolors=style.color, linewidths=1.6)
    return kwargs


#: Where a point's note may go, in points from the point, tried in order.
_NOTE_OFFSETS = ((5, 4), (5, -11), (-7, 4), (-7, -11), (5, 13), (5, -20), (-7, 13), (-7, -20), (14, -4))


def _annotate(ax: Any, points: list[Point], fig: Figure) -> None:
    """Write each point's note at the first nearby offset where it overlaps no earlier note."""
    scale = fig.dpi / 72.0
    taken: list[tuple[float, float, float, float]] = []
    for pt in points:
        px, py = ax.transData.transform((pt.x, pt.y))
        width, height = 4.6 * len(pt.note) * scale, 9.0 * scale
        choice = _NOTE_OFFSETS[0]
        for dx, dy in _NOTE_OFFSETS:
            x0 = px + dx * scale - (width if dx < 0 else 0.0)
            y0 = py + dy * scale
            box = (x0, y0, x0 + width, y0 + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
                choice = (dx, dy)
                taken.append(box)
                break
        else:
            x0 = px + choice[0] * scale
            taken.append((x0, py + choice[1] * scale, x0 + width, py + choice[1] * scale + height))
        ax.annotate(
            pt.note,
            (pt.x, pt.y),
            xytext=choice,
            textcoords="offset points",
            ha="right" if choice[0] < 0 else "left",
            va="bottom",
            fontsize=7.5,
            color="#333333",
            zorder=5,
        )


def _formatter(template: str) -> Any:
    def fmt(value: float, _pos: int | None = None) -> str:
        return template.format(value)

    return fmt


def _pad_limits(ax: Any, panel: Panel) -> None:
    """Limits with a margin, and a minimum span so near-identical values do not fill the axis with noise."""
    for values, setter in (
        ([pt.x for pt in panel.points], ax.set_xlim),
        ([pt.y for pt in panel.points], ax.set_ylim),
    ):
        lo, hi = min(values), max(values)
        span = max(hi - lo, 0.02 * max(abs(lo), abs(hi)), 1e-9)
        setter(lo - 0.12 * span, hi + 0.18 * span)
