"""The run's final report: ``report.json`` (machine-readable) and ``report.md`` (for people)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

METRIC_KEYS = ("accuracy", "params", "macs", "latency_s", "memory_mb", "artifact")


def metrics_view(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's metrics object: the fixed keys first, then whatever else the entry carries."""
    if entry is None:
        return None
    view = {key: entry.get(key) for key in METRIC_KEYS}
    view.update({k: v for k, v in entry.items() if k not in view})
    return view


def artifact_inventory(run_dir: Path) -> list[dict[str, Any]]:
    """Every model file of the run with its size (10^6 bytes) and SHA-256, to check what is deployed."""
    from tools.store.artifacts import sha256_of

    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".onnx"))
    return [
        {"path": str(p.relative_to(run_dir)), "size_mb": round(p.stat().st_size / 1e6, 4), "sha256": sha256_of(p)}
        for p in files
    ]


def build_report(state: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    info = state["model_info"]
    rounds = [
        {
            "round": r["round"],
            "source": r["source"],
            "plan": r["plan"],
            "planner_state": r.get("planner_state"),
            "metrics": metrics_view(r["metrics"]),
            "accuracy_drop_points": r.get("accuracy_drop_points"),
            "within_budget": r["within_budget"],
            "prune_report": r.get("prune_report"),
        }
        for r in state.get("rounds") or []
    ]
    return {
        "model": {**info, "input_shape": state.get("input_shape")},
        "dataset": {
            "spec": state.get("dataset"),
            "split": state.get("dataset_split"),
            "label_match": state.get("label_match"),
        },
        "baseline": metrics_view(state.get("baseline")),
        "pruned": metrics_view(state.get("pruned")),
        "quantized": metrics_view(state.get("quantized")),
        "quantized_original": metrics_view(state.get("quantized_original")),
        "rounds": rounds,
        "plan": {
            "source": state.get("plan_source"),
            **(state.get("plan") or {}),
            "planner_state": state.get("plan_planner_state"),
        },
        "profile": {"path": state.get("profile_path"), **(state.get("profile_summary") or {})},
        "untrained": info.get("untrained", False),
        "notes": state.get("notes") or [],
        "settings": settings,
        "artifacts": artifact_inventory(Path(state["run_dir"])),
    }


def _fmt_acc(value: float | None) -> str:
    return "n/a (untrained)" if value is None else f"{100 * value:.2f}%"


def _fmt_delta(drop_points: float | None) -> str:
    """An accuracy drop in points as a signed change: 0.5 -> '-0.50', 0 -> '+0.00' (never '-0.00')."""
    return "-" if drop_points is None else f"{(round(-drop_points, 2) or 0.0):+.2f}"


def _fmt_params(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f} M"


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.2f} ms"


def _ratio(base: float | None, other: float | None) -> str:
    return "-" if not base or not other else f"{base / other:.2f}x"


def render_markdown(report: dict[str, Any]) -> str:
    model = report["model"]
    base = report["baseline"] or {}
    lines = [
        f"# ProfilingAgent report: {model['spec']}",
        "",
        f"- model class: `{model['model_class']}` (family `{model['family']}`, source {model['source']})",
        f"- input shape: {model.get('input_shape')}",
        f"- dataset: {report['dataset']['spec'] or 'none (latency and memory only)'}",
    ]
    if report["untrained"]:
        lines.append("- **UNTRAINED model (random weights): accuracy is not meaningful and reported as n/a.**")
    lines += [
        "",
        "## Summary",
        "",
        "| model | accuracy | Δacc (pts) | params | MACs | latency (batch 1) | speed-up | memory (MB) | memory saved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in (
        ("baseline", "original"),
        ("pruned", "best pruned"),
        ("quantized", "pruned + quantized"),
        ("quantized_original", "original quantized"),
    ):
        m = report.get(key)
        if not m:
            continue
        drop = m.get("accuracy_drop_points")
        saved = (1 - m["memory_mb"] / base["memory_mb"]) * 100 if base.get("memory_mb") else 0.0
        macs = "-" if m.get("macs") is None else f"{m['macs'] / 1e6:.1f} M"
        lines.append(
            f"| {label} | {_fmt_acc(m.get('accuracy'))} | {_fmt_delta(drop)} | "
            f"{_fmt_params(m.get('params'))} | {macs} | {_fmt_ms(m.get('latency_s'))} | "
            f"{_ratio(base.get('latency_s'), m.get('latency_s'))} | {m['memory_mb']:.2f} | {saved:.1f}% |"
        )
    pruned = report.get("pruned")
    if pruned is not None and pruned.get("within_budget") is False:
        lines += [
            "",
            "**No pruned candidate stayed within the accuracy budget: 'best pruned' is the original.**",
        ]
    lines += ["", "## Plan (analysis agent)", "", f"source: {report['plan'].get('source')}", ""]
    for rec in report["plan"].get("pruning_recommendations", []):
        lines.append(
            f"- prune `{rec['layer']}` ({rec['pruning_type']}, ratio {rec['pruning_ratio']}): {rec['justification']}"
        )
    for rec in report["plan"].get("quantization_recommendations", []):
        lines.append(f"- quantize `{rec['layer']}` ({rec['quantization_type']} {rec['dtype']}): {rec['justification']}")
    if report["rounds"]:
        lines += [
            "",
            "## Pruning rounds",
            "",
            "| round | source | accuracy | Δacc (pts) | params | latency | within budget | plan |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["rounds"]:
            m = r["metrics"]
            plan = ", ".join(
                f"{p['pruning_type']} {p['layer']} {p['pruning_ratio']}"
                for p in r["plan"].get("pruning_recommendations", [])
            )
            drop = r.get("accuracy_drop_points")
            lines.append(
                f"| {r['round']} | {r['source']} | {_fmt_acc(m.get('accuracy'))} | "
                f"{_fmt_delta(drop)} | {_fmt_params(m.get('params'))} | "
                f"{_fmt_ms(m.get('latency_s'))} | {'yes' if r['within_budget'] else 'NO'} | {plan} |"
            )
    lines += _planner_decisions(report)
    profile = report.get("profile") or {}
    if profile.get("top_groups"):
        lines += [
            "",
            "## Profile: most expensive layer groups",
            "",
            "| layer group | latency share | MACs share |",
            "|---|---|---|",
        ]
        for g in profile["top_groups"]:
            lines.append(f"| `{g['pattern']}` | {100 * g['latency_share']:.1f}% | {100 * g['macs_share']:.1f}% |")
    if report["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    if report.get("artifacts"):
        lines += ["", "## Artifacts", "", "| file | size (MB) | SHA-256 |", "|---|---|---|"]
        lines += [f"| `{a['path']}` | {a['size_mb']:.3f} | `{a['sha256'][:16]}…` |" for a in report["artifacts"]]
    return "\n".join(lines) + "\n"


def _planner_decisions(report: dict[str, Any]) -> list[str]:
    """Which planner wrote each plan, and every rejected plan with its reasons (LLM planner)."""
    steps = [("analysis", report["plan"].get("source"), report["plan"].get("planner_state") or {})]
    steps += [(f"round {r['round']}", r["source"], r.get("planner_state") or {}) for r in report["rounds"]]
    if all(source in (None, "rules") for _, source, _ in steps):
        return []
    lines = ["", "## Planner decisions", ""]
    for step, source, state in steps:
        extra = f", fallback because: {state['fallback_reason']}" if state.get("fallback_reason") else ""
        lines.append(f"- {step}: `{source}` after {state.get('attempts', 1)} attempt(s){extra}")
        for rejected in state.get("rejected", []):
            reasons = "; ".join(rejected.get("reasons") or [rejected.get("failure") or "unparsable answer"])
            lines.append(f"  - rejected: {reasons}")
    return lines


def write_report_files(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    from tools.store.artifacts import atomic_write_json, atomic_write_text

    atomic_write_text(md_path, render_markdown(report))
    from tools.reporting.html import load_profile, write_html_report

    write_html_report(report, load_profile(report), md_path.with_name("report.html"))
    atomic_write_json(json_path, report)  # last: a run that has a report.json has finished


def llm_comparison_rows(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per LLM: ΔAccuracy of its best pruned model, original and pruned parameters, plan sources."""
    rows = []
    for name, report in reports.items():
        base, pruned = report["baseline"], report.get("pruned") or report["baseline"]
        sources: dict[str, int] = {}
        rejected = 0
        for r in report["rounds"]:
            sources[r["source"]] = sources.get(r["source"], 0) + 1
            rejected += len((r.get("planner_state") or {}).get("rejected", []))
        drop = None
        if base.get("accuracy") is not None and pruned.get("accuracy") is not None:
            drop = round(100 * (pruned["accuracy"] - base["accuracy"]), 2)
        rows.append(
            {
                "llm": name,
                "delta_accuracy_points": drop,
                "original_params": base["params"],
                "pruned_params": pruned["params"],
                "within_budget": pruned.get("within_budget"),
                "round_sources": sources,
                "rejected_plans": rejected,
            }
        )
    return rows


def render_llm_comparison(result: dict[str, Any]) -> str:
    lines = [
        f"# LLM comparison: {result['model']} on {result['dataset']}",
        "",
        "| LLM | ΔAccuracy (pts) | original params (M) | pruned params (M) | within budget | plans | rejected |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        drop = "n/a" if row["delta_accuracy_points"] is None else f"{row['delta_accuracy_points']:+.2f}"
        sources = ", ".join(f"{k}: {v}" for k, v in row["round_sources"].items())
        lines.append(
            f"| {row['llm']} | {drop} | {row['original_params'] / 1e6:.3f} | {row['pruned_params'] / 1e6:.3f} | "
            f"{'yes' if row['within_budget'] else 'no'} | {sources} | {row['rejected_plans']} |"
        )
    return "\n".join(lines) + "\n"
