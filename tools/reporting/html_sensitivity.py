"""The HTML report's sensitivity section: one row per unit, most prunable first, a column group per ratio.

Built from ``report.profile["sensitivity"]`` (or, for a report written before it was copied there, the
``sensitivity`` of ``profile.json``); see :mod:`tools.reporting.sensitivity_view` for the order.
"""

from __future__ import annotations

from typing import Any

from tools.reporting.format import EN_DASH
from tools.reporting.html_parts import as_number, delta_html, esc, params_text, section, short
from tools.reporting.sensitivity_view import (
    as_profile,
    has_accuracy,
    kl_text,
    middle_ratio,
    point_at,
    ranked_units,
    ratio_label,
    summary_text,
)
from tools.schemas import RunReport, SensitivityPoint, SensitivityProfile

__all__ = ["sensitivity_of", "sensitivity_section"]


def sensitivity_of(report: RunReport, profile: dict[str, Any] | None) -> SensitivityProfile | None:
    """The run's sensitivity profile: the report's copy, else the profile file's, else ``None``."""
    return as_profile(report.profile.get("sensitivity")) or as_profile((profile or {}).get("sensitivity"))


def _saved(point: SensitivityPoint, total: float | None) -> str:
    text = params_text(point.params_saved)
    if total:
        return f'<span title="{esc(text)} parameters">{100 * point.params_saved / total:.1f}%</span>'
    return text


def _cells(point: SensitivityPoint | None, total: float | None, accuracy: bool) -> list[str]:
    width = 4 if accuracy else 3
    if point is None:
        return [f'<td class="num muted" title="nothing was pruned at this ratio">{EN_DASH}</td>'] * width
    cells = [_saved(point, total), f"{100 * point.agreement:.1f}%", kl_text(point.kl)]
    if accuracy:
        cells.append(delta_html(point.accuracy_drop_points))
    latency = (
        f"{ratio_label(round(point.ratio, 3))} pruned (what rounding leaves of the ratio): "
        f"saves {1000 * point.latency_saved_s:.3f} ms, {point.macs_saved:,} MACs (profiled)"
    )
    return [f'<td class="num" title="{esc(latency)}">{c}</td>' for c in cells]


def sensitivity_section(report: RunReport, profile: dict[str, Any] | None = None) -> str:
    """The section, or an empty string when the run measured no sensitivity."""
    sens = sensitivity_of(report, profile)
    if sens is None:
        return ""
    accuracy = has_accuracy(sens)
    ratios = sorted(sens.ratios)
    middle = middle_ratio(sens)
    total = as_number(report.profile.get("total_params")) or as_number((profile or {}).get("total_params"))
    metrics = ["params saved", "agreement", "KL"] + (["Δacc (pts)"] if accuracy else [])
    top = "".join(f'<th colspan="{len(metrics)}" class="num">{esc(ratio_label(r))} pruned</th>' for r in ratios)
    sub = "".join(f'<th class="num">{esc(m)}</th>' for _ in ratios for m in metrics)
    head = (
        f'<tr><th rowspan="2">unit</th><th rowspan="2">type</th><th rowspan="2" class="num">size</th>{top}</tr>'
        f"<tr>{sub}</tr>"
    )
    rows = []
    for unit in ranked_units(sens):
        cells = "".join(c for r in ratios for c in _cells(point_at(unit, r), total, accuracy))
        rows.append(
            f'<tr><td><span title="{esc(unit.pattern)}">{esc(short(unit.pattern))}</span></td>'
            f'<td>{esc(unit.pruning_type)}</td><td class="num">{esc(unit.size)}</td>{cells}</tr>'
        )
    table = f'<div class="table-wrap"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'
    order = f" at {ratio_label(middle)}" if middle is not None else ""
    parts = [
        f'<p class="muted">{esc(summary_text(sens).replace("`", ""))}</p>',
        '<p class="muted small">Agreement: share of calibration images where the pruned model keeps the '
        "original's top-1 class. KL: mean KL(original ‖ pruned) of the softmax outputs, in nats."
        + (" Δacc: accuracy change on the calibration images, in points." if accuracy else "")
        + " Damages of different units roughly add up; heads and channels are separate units. Sorted most "
        f"prunable first (least KL per parameter saved{esc(order)}). Hover a cell for the latency and MACs "
        "it saves.</p>",
        table,
    ]
    if sens.skipped:
        items = "".join(f"<li><code>{esc(p)}</code>: {esc(why)}</li>" for p, why in sorted(sens.skipped.items()))
        parts.append(f"<details><summary>{len(sens.skipped)} units not measured</summary><ul>{items}</ul></details>")
    return section("sensitivity", "Sensitivity: damage of pruning each unit alone", "".join(parts))
