"""Report agent: write ``report.json`` and ``report.md`` once, atomically, at the end of the run."""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.common import paths, settings
from agents.context import Context
from agents.state import State
from tools.reporting.report import build_report, write_report_files
from tools.schemas import RunSummary


def write_report(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    run = paths(state)
    report = build_report(state.model_dump(), ctx.to_dict())  # the report reads the state's JSON form
    written = write_report_files(report, run.report_json, run.report_md, (state.time_spent, state.started_at))
    summary = RunSummary.model_validate(
        {key: written[key] for key in ("baseline", "pruned", "quantized", "quantized_original")}
    )
    return {"report_path": str(run.report_json), "summary": summary}
