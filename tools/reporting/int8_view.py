"""The int8 part of a report: the CPU it was built and validated for, the budget's split, the layers kept in float.

Read by ``report.md`` (:func:`markdown_lines`) and the HTML report (:func:`html_section`) from the run's report:
``deployment.int8`` (:class:`tools.deploy.cpu.Int8Settings`), ``accuracy_budget`` (:class:`tools.schemas.
AccuracyBudget`), the candidates' ``float_layers`` and the profile's per-block ``int8_sensitivity``.
"""

from __future__ import annotations

from tools.deploy.cpu import Int8Settings
from tools.reporting.html_parts import esc, section, table
from tools.schemas import AccuracyBudget, Int8Sensitivity, RunReport

__all__ = ["float_layer_rows", "html_section", "markdown_lines"]

#: Blocks of the int8 sensitivity a report lists.
TOP_BLOCKS = 8


def _settings(report: RunReport) -> Int8Settings | None:
    raw = (report.deployment or {}).get("int8")
    return Int8Settings.model_validate(raw) if raw else None


def _sensitivity(report: RunReport) -> Int8Sensitivity | None:
    raw = report.profile.get("int8_sensitivity")
    return Int8Sensitivity.model_validate(raw) if raw else None


def _budget(report: RunReport) -> AccuracyBudget | None:
    raw = getattr(report, "accuracy_budget", None)
    return AccuracyBudget.model_validate(raw) if raw else None


def float_layer_rows(report: RunReport) -> list[tuple[str, str, str, str]]:
    """(candidate, layer, why, what its block's int8 costs alone) for every layer an int8 candidate kept in float.

    The cost is the profile's per-block int8 sensitivity of the original (KL, top-1 flips on calibration images);
    a layer the full-int8 candidate of the same runtime kept in float too is not listed again for the mixed one.
    """
    sensitivity = _sensitivity(report)
    damage = {layer: g for g in (sensitivity.groups if sensitivity else []) for layer in g.layers}
    every = (report.deployment or {}).get("candidates") or []
    candidates = [c for c in every if c.get("float_layers")]
    rows = []
    for c in candidates:
        full = next((f for f in every if c["backend"] == f"{f['backend']}-mixed" and not f.get("source")), None)
        for layer, why in c["float_layers"].items():
            if full is not None and layer not in (full.get("float_layers") or {}) and "or its patterns" in why:
                why = "NNCF's accuracy control (the full-int8 build quantized it)"
            g = damage.get(layer)
            cost = f"block {g.group}: KL {g.kl:.4f}, {g.flips_pct:.1f} % flips" if g else "-"
            rows.append((c["backend"], layer, why, cost))
    return rows


def _sensitivity_rows(sensitivity: Int8Sensitivity) -> list[tuple[str, str, str, str]]:
    return [
        (g.group, str(len(g.layers)), f"{g.kl:.4f}", f"{g.flips_pct:.1f} %") for g in sensitivity.groups[:TOP_BLOCKS]
    ]


def markdown_lines(report: RunReport) -> list[str]:
    """``report.md``'s int8 section (empty when the run measured no int8)."""
    settings, budget, sensitivity = _settings(report), _budget(report), _sensitivity(report)
    if settings is None and budget is None and sensitivity is None:
        return []
    lines = ["", "## Int8: the CPU, the budget, the layers kept in float", ""]
    if settings is not None:
        lines.append(f"- int8 {settings.describe()}")
    if budget is not None:
        lines.append(f"- accuracy budget: {budget.why}")
    if sensitivity is not None:
        lines.append(
            f"- int8 sensitivity ({sensitivity.backend}, {sensitivity.images} calibration images, "
            f"{sensitivity.seconds:.1f} s): every block int8 flips {sensitivity.full_flips_pct:.1f} % of top-1 "
            f"answers (KL {sensitivity.full_kl:.4f}); the most sensitive blocks alone:"
        )
        lines += ["", "| block | layers | KL (int8 alone) | top-1 flips |", "|---|---|---|---|"]
        lines += [f"| `{b}` | {n} | {kl} | {flips} |" for b, n, kl, flips in _sensitivity_rows(sensitivity)]
    elif (why := report.profile.get("int8_not_measured")) is not None:
        lines.append(f"- int8 sensitivity per block: not measured: {why}")
    rows = float_layer_rows(report)
    if rows:
        lines += ["", "| candidate | layer kept in float | why | its block's int8 alone |", "|---|---|---|---|"]
        lines += [f"| {c} | `{layer}` | {why} | {cost} |" for c, layer, why, cost in rows]
    elif settings is not None:
        lines += ["", "Every int8 candidate quantized every layer it could: no layer was kept in float."]
    return lines


def html_section(report: RunReport) -> str:
    """The HTML report's int8 section (empty when the run measured no int8)."""
    settings, budget, sensitivity = _settings(report), _budget(report), _sensitivity(report)
    if settings is None and budget is None and sensitivity is None:
        return ""
    body = ""
    if settings is not None:
        body += f"<p>int8 {esc(settings.describe())}</p>"
    if budget is not None:
        body += f"<p>Accuracy budget: {esc(budget.why)}</p>"
    if sensitivity is not None:
        body += (
            f'<p class="small">Int8 sensitivity ({esc(sensitivity.backend)}, {sensitivity.images} calibration '
            f"images): every block int8 flips {sensitivity.full_flips_pct:.1f} % of top-1 answers.</p>"
        )
        headers = [("block", False), ("layers", True), ("KL (int8 alone)", True), ("top-1 flips", True)]
        body += table(headers, [("", [esc(cell) for cell in row]) for row in _sensitivity_rows(sensitivity)])
    elif (why := report.profile.get("int8_not_measured")) is not None:
        body += f'<p class="small">Int8 sensitivity per block: not measured: {esc(str(why))}.</p>'
    rows = float_layer_rows(report)
    if rows:
        headers = [("candidate", False), ("layer kept in float", False), ("why", False), ("block's int8 alone", False)]
        body += table(headers, [("", [esc(cell) for cell in row]) for row in rows])
    return section("int8", "Int8: the CPU, the budget, the layers kept in float", body)
