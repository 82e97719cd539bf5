"""Where a run's time went: the report's table of seconds by node and by kind of work (:mod:`tools.clock`).

Built from the nodes' times the graph recorded (``State.time_spent``): a row per node (its runs together, in the
order each first ran), the start before the first node, and the time between the nodes (checkpoints, routing). A gap
longer than :data:`PAUSE_S` is a pause (a wait for approval, a resume later), not the run's time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tools.clock import WORK_KINDS
from tools.reporting.html_parts import esc, section, table
from tools.schemas import NodeTime, TimeRow, TimeSpent

__all__ = ["OTHER", "PAUSE_S", "time_html", "time_lines", "time_spent"]

#: A gap between two nodes longer than this is a pause, not work (seconds).
PAUSE_S = 30.0
#: The kind of a node's seconds that no kind of work covers.
OTHER = "other"
START = "start (graph, checkpoints)"
BETWEEN = "between the nodes (checkpoints)"
REPORT = "write_report"


def time_spent(times: Sequence[NodeTime], started_at: float | None, now: float | None = None) -> TimeSpent | None:
    """The time table of a run whose nodes took ``times``, started at ``started_at`` (unix seconds; None: not known)
    and reported at ``now`` (the report node's own time so far counted as its row)."""
    if not times:
        return None
    now = time.time() if now is None else now
    rows: dict[str, TimeRow] = {}
    between = paused = 0.0
    for t, after in zip(times, [*times[1:], None], strict=True):
        row = rows.setdefault(t.node, TimeRow(name=t.node, runs=0, seconds=0.0))
        row.runs += 1
        row.seconds += t.seconds
        for kind, seconds in t.work.items():
            row.work[kind] = row.work.get(kind, 0.0) + seconds
        end = t.started_at + t.seconds
        if after is None:  # the report node, still running: its time so far
            report = rows.setdefault(REPORT, TimeRow(name=REPORT, runs=0, seconds=0.0))
            report.runs += 1
            report.seconds += max(0.0, now - end)
        elif after.started_at - end > PAUSE_S:
            paused += after.started_at - end
        else:
            between += max(0.0, after.started_at - end)
    start = times[0].started_at - started_at if started_at is not None else 0.0
    if 0.0 < start <= PAUSE_S:
        rows = {START: TimeRow(name=START, seconds=start), **rows}
    if between > 0:
        rows[BETWEEN] = TimeRow(name=BETWEEN, seconds=between)
    table = list(rows.values())
    for row in table:
        row.work[OTHER] = max(0.0, row.seconds - sum(row.work.values()))
    by_kind = {kind: sum(r.work.get(kind, 0.0) for r in table) for kind in (*WORK_KINDS, OTHER)}
    return TimeSpent(
        rows=table,
        by_kind={k: round(v, 3) for k, v in by_kind.items() if v > 0.0005},
        total_s=round(sum(r.seconds for r in table), 3),
        paused_s=round(paused, 3),
    )


def time_lines(spent: TimeSpent | None) -> list[str]:
    """The report's "Where the time went" section (markdown)."""
    if spent is None or not spent.rows:
        return []
    kinds = [k for k in (*WORK_KINDS, OTHER) if spent.by_kind.get(k, 0.0) >= 0.05]
    total = max(spent.total_s, 1e-9)
    shares = ", ".join(f"{k} {spent.by_kind[k]:,.0f} s ({100 * spent.by_kind[k] / total:.0f} %)" for k in kinds)
    paused = f" (less {spent.paused_s:,.0f} s paused)" if spent.paused_s else ""
    lines = [
        "",
        "## Where the time went",
        "",
        f"{spent.total_s:,.1f} s in all{paused}: {shares}.",
        "",
        "| node | runs | seconds | " + " | ".join(kinds) + " |",
        "|---|---|---|" + "---|" * len(kinds),
    ]
    for row in sorted(spent.rows, key=lambda r: -r.seconds):
        cells = " | ".join(_cell(row.work.get(k, 0.0)) for k in kinds)
        lines.append(f"| {row.name} | {row.runs} | {row.seconds:,.1f} | {cells} |")
    return lines


#: The bar's colour of each kind of work (the HTML report).
KIND_COLOURS = {
    "profile": "#8e6bbf",
    "evaluate": "#3b7dd8",
    "prune": "#d8833b",
    "distil": "#c8463b",
    "build": "#3ba37d",
    "time": "#b8a23b",
    OTHER: "#9aa0a6",
}


def time_html(spent: TimeSpent | None) -> str:
    """The HTML report's "Where the time went": one bar of the run's seconds by kind of work, and the node table."""
    if spent is None or not spent.rows:
        return ""
    total = max(spent.total_s, 1e-9)
    kinds = [k for k in KIND_COLOURS if spent.by_kind.get(k, 0.0) >= 0.05]
    bar = "".join(
        f'<div title="{esc(k)}: {spent.by_kind[k]:,.1f} s" style="width:{100 * spent.by_kind[k] / total:.2f}%;'
        f'background:{KIND_COLOURS[k]};height:18px;display:inline-block"></div>'
        for k in kinds
    )
    legend = " · ".join(
        f'<span style="color:{KIND_COLOURS[k]}">■</span> {esc(k)} {spent.by_kind[k]:,.0f} s '
        f"({100 * spent.by_kind[k] / total:.0f} %)"
        for k in kinds
    )
    paused = f" (less {spent.paused_s:,.0f} s paused)" if spent.paused_s else ""
    rows = [
        ("", [esc(r.name), str(r.runs), f"{r.seconds:,.1f}"] + [_cell(r.work.get(k, 0.0)) for k in kinds])
        for r in sorted(spent.rows, key=lambda r: -r.seconds)
    ]
    headers = [("node", False), ("runs", True), ("seconds", True)] + [(esc(k), True) for k in kinds]
    body = (
        f"<p>{spent.total_s:,.1f} s in all{esc(paused)}.</p>"
        f'<div style="white-space:nowrap;overflow:hidden;border-radius:4px">{bar}</div>'
        f'<p class="muted">{legend}</p>' + table(headers, rows)
    )
    return section("time", "Where the time went", body)


def _cell(seconds: float) -> str:
    return f"{seconds:,.1f}" if seconds >= 0.05 else ""
