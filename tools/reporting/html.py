"""The run's report as one self-contained HTML page (``report.html``): inline CSS, charts as PNG data URIs.

``render_html(report, profile)`` takes the :class:`~tools.schemas.RunReport` of
:func:`tools.reporting.report.build_report` (or the dict of ``report.json``) and, optionally, the profile
(``profile/profile.json``) for the per-layer latency chart. Every piece of text from the report is escaped.
A chart that cannot be drawn is replaced by a short message: the page is always written.

The page's sections are in :mod:`tools.reporting.html_results` and :mod:`tools.reporting.html_plans`, their
building blocks in :mod:`tools.reporting.html_parts`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tools.reporting import html_plans, html_results
from tools.reporting.html_parts import esc
from tools.reporting.html_sensitivity import sensitivity_section
from tools.reporting.int8_view import html_section as int8_section
from tools.reporting.time_table import time_html
from tools.schemas import RunReport, TimeSpent

logger = logging.getLogger(__name__)

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


def render_html(report: RunReport | dict[str, Any], profile: dict[str, Any] | None = None) -> str:
    """The report as one self-contained HTML page (no external resources)."""
    report = RunReport.model_validate(report)
    top, model_section = html_results.header(report)
    spec = report.model.get("spec") or "model"
    sections = [
        model_section,
        html_results.summary(report),
        html_results.budget(report),
        html_plans.plan(report),
        html_plans.rounds(report),
        html_plans.planner(report),
        html_plans.deployment(report),
        int8_section(report),
        html_results.profile_section(report, profile),
        sensitivity_section(report, profile),
        html_results.tradeoffs(report),
        html_results.notes(report),
        html_results.artifacts(report),
        html_results.settings_section(report),
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ProfilingAgent report: {esc(spec)}</title><style>{_CSS}</style></head>"
        f"<body>{top}<main>{''.join(sections)}"
        "<footer>Generated by ProfilingAgent · report.json holds every number shown here.</footer>"
        "</main></body></html>\n"
    )
    return with_time_section(page, report.time_spent)


def with_time_section(page: str, spent: TimeSpent | None) -> str:
    """``page`` (from :func:`render_html` without a time table) with the "Where the time went" section before the
    notes: drawn last, so that the table counts the time the page's charts took."""
    section = time_html(spent)
    return page.replace(_NOTES, section + _NOTES, 1) if section else page


_NOTES = '<section id="notes">'


def load_profile(report: RunReport | dict[str, Any]) -> dict[str, Any] | None:
    """The profile named by ``report.profile["path"]``, or ``None`` when it is missing or unreadable."""
    path = RunReport.model_validate(report).profile.get("path")
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        logger.warning("could not read the profile %s: the HTML report leaves the per-layer chart out", path)
        return None
    return data if isinstance(data, dict) else None


def write_html_report(report: RunReport | dict[str, Any], profile: dict[str, Any] | None, path: Path | str) -> Path:
    """Render and write the page atomically; returns its path."""
    from tools.store.files import atomic_write_text

    target = Path(path)
    atomic_write_text(target, render_html(report, profile))
    return target
