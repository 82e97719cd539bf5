"""Report agent: write ``report.json`` and ``report.md`` once, atomically, at the end of the run."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from agents.common import paths, settings
from graph.context import Context
from graph.state import State
from tools.reporting.report import build_report, write_report_files


def write_report(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    ctx = settings(runtime)
    run = paths(dict(state))
    report = build_report(dict(state), ctx.to_dict())
    written = write_report_files(report, run.report_json, run.report_md)
    summary = {key: written[key] for key in ("baseline", "pruned", "quantized", "quantized_original")}
    return {"report_path": str(run.report_json), "summary": summary}
