"""The run's final report: ``report.json`` (machine-readable) and ``report.md`` (for people).

:func:`build_report` gathers the finished graph state into a :class:`~tools.schemas.RunReport`;
:func:`write_report_files` writes it as ``report.md``, ``report.html`` and, last, ``report.json``.
Readers take a ``RunReport`` or the dict read back from ``report.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from tools.deploy.choice import is_chosen
from tools.deploy.choice import label as candidate_label
from tools.profiling.static import is_count_note
from tools.reporting.format import (
    accuracy_pct,
    damage_text,
    millions,
    millis,
    named_entries,
    percent_less,
    recovery_text,
    signed_points,
    speedup,
)
from tools.reporting.html_parts import shape_text
from tools.reporting.int8_view import markdown_lines as int8_lines
from tools.reporting.paired_text import (
    agreement,
    change_ci,
    confirmed_text,
    float_twins_text,
    selection_text,
    split_text,
    stopped_text,
    tries_text,
)
from tools.reporting.sensitivity_view import as_profile, markdown_lines
from tools.reporting.time_table import time_lines, time_spent
from tools.schemas import Int8Sensitivity, NodeTime, PairedAccuracy, RunReport, SensitivityProfile
from tools.stats import is_budget_note

METRIC_KEYS = ("accuracy", "params", "macs", "latency_s", "memory_mb", "artifact")


def metrics_view(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's metrics object: the fixed keys first, then whatever else the entry carries."""
    if entry is None:
        return None
    view = {key: entry.get(key) for key in METRIC_KEYS}
    view.update({k: v for k, v in entry.items() if k not in view})
    return view


class ArtifactFile(TypedDict):
    """One model file of the run in the report's inventory."""

    path: str
    size_mb: float
    sha256: str


class DataSplit(TypedDict):
    """Images in each part of the data (calibration and finetune fit, evaluation chooses, confirm confirms), and
    whether the roles kept to their own rows as read (None: the run recorded no reads)."""

    calibration_samples: int
    evaluation_samples: int
    confirm_samples: int
    finetune_samples: int
    extra_images: int
    extra_read_by: list[str]
    extra_images_given: bool
    unreadable_images: int
    parts_disjoint: bool | None
    confirm_untouched: bool | None
    overlaps: dict[str, int]


def artifact_inventory(run_dir: Path) -> list[ArtifactFile]:
    """Every model file of the run with its size (10^6 bytes) and SHA-256, to check what is deployed."""
    from tools.store.files import sha256_of

    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".onnx"))
    return [
        {"path": str(p.relative_to(run_dir)), "size_mb": round(p.stat().st_size / 1e6, 4), "sha256": sha256_of(p)}
        for p in files
    ]


def data_split(state: dict[str, Any], settings: dict[str, Any]) -> DataSplit:
    """Images in each part of the data: as drawn (the baseline's ``data_parts``), else as asked; whether the parts
    were kept apart, from the rows each role recorded reading (``RUN/data_reads.json``), not from the plan."""
    from tools.store.reads import read_log
    from tools.store.run_paths import RunPaths

    parts = (state.get("baseline") or {}).get("data_parts") or {}
    if not parts and state.get("dataset"):
        names = {"calibration": "calibration_samples", "evaluation": "eval_samples", "confirm": "confirm_samples"}
        parts = {part: max(0, int(settings.get(key) or 0)) for part, key in names.items()}
    reads_path = RunPaths(state["run_dir"]).data_reads if state.get("run_dir") else None
    reads = read_log(reads_path) if reads_path is not None and reads_path.is_file() else None
    return {
        "calibration_samples": int(parts.get("calibration", 0)),
        "evaluation_samples": int(parts.get("evaluation", 0)),
        "confirm_samples": int(parts.get("confirm", parts.get("holdout", 0))),
        "finetune_samples": int(parts.get("finetune", 0)),
        # the user's extra images (--extra-images) as read: how many fit on, and every role that read any
        "extra_images": len(reads.extra.get("fit", [])) if reads is not None else 0,
        "extra_read_by": sorted(reads.extra) if reads is not None else [],
        "extra_images_given": bool(settings.get("extra_images")),
        "unreadable_images": int(parts.get("unreadable", 0)),  # left out; the notes name them
        # from the rows each role read; unknown (None) for a run that recorded none
        "parts_disjoint": reads.disjoint() if reads is not None else None,
        "confirm_untouched": (not any("confirm" in pair for pair in reads.overlaps()) if reads is not None else None),
        "overlaps": reads.overlaps() if reads is not None else {},
    }


def build_report(state: dict[str, Any], settings: dict[str, Any]) -> RunReport:
    """The finished run's report, from the graph state and the run's settings."""
    return RunReport.model_validate(_report_fields(state, settings))


def _report_fields(state: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
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
            "cross_fit": r.get("cross_fit"),
        }
        for r in state.get("rounds") or []
    ]
    return {
        "model": {**info, "input_shape": state.get("input_shape")},
        "dataset": {
            "spec": state.get("dataset"),
            "split": state.get("dataset_split"),
            "label_match": state.get("label_match"),
            **data_split(state, settings),
        },
        "baseline": metrics_view(state.get("baseline")),
        "pruned": metrics_view(state.get("pruned")),
        "quantized": metrics_view(state.get("quantized")),
        "quantized_original": metrics_view(state.get("quantized_original")),
        "deployment": state.get("deployment"),
        "confirmation": state.get("confirmation"),
        "speedup": state.get("speedup"),
        "original_deployment": state.get("original_deployment"),
        "accuracy_budget": state.get("accuracy_budget"),
        "rounds": rounds,
        "plan": {
            "source": (state.get("plan") or {}).get("source"),
            **((state.get("plan") or {}).get("plan") or {}),
            "planner_state": (state.get("plan") or {}).get("planner_state"),
        },
        "profile": {  # a sensitivity profile not measured leaves no key
            k: v
            for k, v in {
                "path": state.get("profile_path"),
                **(state.get("profile_summary") or {}),
                **_sensitivity(state.get("profile_path")),
            }.items()
            if k != "sensitivity" or v is not None
        },
        "untrained": info.get("untrained", False),
        "notes": state.get("notes") or [],
        "settings": settings,
        "artifacts": artifact_inventory(Path(state["run_dir"])),
    }


def _sensitivity(profile_path: str | None) -> dict[str, Any]:
    """``{"sensitivity": ..., "int8_sensitivity": ..., "int8_not_measured": ...}`` from the run's ``profile.json``,
    those it holds."""
    from tools.store.files import read_json

    if not profile_path or not Path(profile_path).is_file():
        return {}
    profile = read_json(Path(profile_path))
    found: dict[str, Any] = {}
    if profile.get("sensitivity") is not None:
        found["sensitivity"] = SensitivityProfile.model_validate(profile["sensitivity"]).model_dump(mode="json")
    if profile.get("int8_sensitivity") is not None:
        found["int8_sensitivity"] = Int8Sensitivity.model_validate(profile["int8_sensitivity"]).model_dump(mode="json")
    if profile.get("int8_not_measured"):
        found["int8_not_measured"] = str(profile["int8_not_measured"])
    return found


def report_json(report: RunReport) -> dict[str, Any]:
    """What ``report.json`` holds: exactly the keys :func:`build_report` set, as JSON values."""
    return report.model_dump(mode="json", exclude_unset=True)


def render_markdown(report: RunReport | dict[str, Any]) -> str:
    """``report.md``: the summary table, the plan, the rounds, the planner's decisions, the profile and notes."""
    report = RunReport.model_validate(report)
    lines = _header_lines(report) + _summary_lines(report) + _plan_lines(report) + _round_lines(report)
    full = report.baseline.samples if report.baseline else 0
    halves = {st.samples for r in report.rounds if r.cross_fit for st in r.cross_fit.students if st.samples}
    lines += _deployment_lines(report.deployment, full, halves)
    lines += int8_lines(report)
    lines += speedup_lines(report.speedup)
    lines += _planner_decisions(report)
    lines += time_lines(report.time_spent)
    lines += _profile_lines(report)
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    if report.artifacts:
        lines += ["", "## Artifacts", "", "| file | size (MB) | SHA-256 |", "|---|---|---|"]
        lines += [f"| `{a['path']}` | {a['size_mb']:.3f} | `{a['sha256'][:16]}…` |" for a in report.artifacts]
    return "\n".join(lines) + "\n"


def _header_lines(report: RunReport) -> list[str]:
    """The title and the run's first lines: the model, its input, the data and its split, what ships."""
    model = report.model
    lines = [
        f"# ProfilingAgent report: {model['spec']}",
        "",
        f"- model class: `{model['model_class']}` (family `{model['family']}`, source {model['source']})",
        f"- input shape: {shape_text(model.get('input_shape'))}",
        f"- dataset: {report.dataset['spec'] or 'none (latency and memory only)'}",
    ]
    split = split_text(report.dataset)
    if split:
        lines.append(f"- data split: {split}")
    if report.untrained:
        lines.append("- **UNTRAINED model (random weights): accuracy is not meaningful and reported as n/a.**")
    lines += [f"- **budget**: {note}" for note in report.notes if is_budget_note(note)]
    lines += [f"- **counts**: {note}" for note in report.notes if is_count_note(note)]
    if (report.dataset.get("label_match") or {}).get("unlabelled"):
        lines.append(
            "- **no labels**: each image's target is the original's top-1 answer, so 'accuracy' is the agreement with "
            "the original (its own is 100 %) and a drop is the share of answers changed, which bounds the accuracy "
            "drop on labelled images of this kind"
        )
    confirmed = confirmed_text(report)
    if confirmed:
        lines.append(f"- **what ships**: {confirmed}")
    return lines


def _summary_lines(report: RunReport) -> list[str]:
    """The summary table: the original, the best pruned model and what ships, on the choose images."""
    base = report.baseline
    base_latency = base.latency_s if base else None
    base_memory = base.memory_mb if base else None
    lines = [
        "",
        "## Summary",
        "",
        "Figures on the choose images, which made every choice; the shipped build's figure on images nothing chose "
        "on is the confirmation's (above).",
        "",
        "| model | accuracy | Δacc (pts, 95 % CI) | agreement | params | MACs | latency (batch 1) | speed-up | "
        "memory (MB) | memory saved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, label, m in named_entries(report):
        lines.append(
            f"| {label} | {accuracy_pct(m.accuracy, 'n/a (untrained)')} | "
            f"{change_ci(m.accuracy_drop_points, m.paired)} | {agreement(m.paired)} | "
            f"{millions(m.params)} | {millions(m.macs, digits=1)} | {millis(m.latency_s)} | "
            f"{speedup(base_latency, m.latency_s)} | {m.memory_mb:.2f} | "
            f"{percent_less(m.memory_mb, base_memory, missing='0.0%')} |"
        )
    if report.pruned is not None and report.pruned.within_budget is False:
        lines += [
            "",
            "**No pruned candidate stayed within the accuracy budget: 'best pruned' is the original.**",
        ]
    if report.rounds and report.dataset.get("spec"):
        lines += ["", selection_text(report)]
    return lines


def _plan_lines(report: RunReport) -> list[str]:
    """The analysis agent's plan, one line a recommendation."""
    lines = ["", "## Plan (analysis agent)", "", f"source: {report.plan.source}", ""]
    for rec in report.plan.pruning_recommendations:
        lines.append(f"- prune `{rec.layer}` ({rec.pruning_type}, ratio {rec.pruning_ratio}): {rec.justification}")
    for q in report.plan.quantization_recommendations:
        lines.append(f"- quantize `{q.layer}` ({q.quantization_type} {q.dtype}): {q.justification}")
    return lines


def _round_lines(report: RunReport) -> list[str]:
    """The pruning rounds' table, and which evaluations stopped early."""
    lines: list[str] = []
    if report.rounds:
        lines += [
            "",
            "## Pruning rounds",
            "",
            "Answers changed: the share of images whose top-1 answer the plan's damage model predicted would change "
            "against the original, and the share that did on the evaluation images.",
            "",
            "| round | source | accuracy | Δacc (pts, 95 % CI) | agreement | answers changed (predicted → measured) "
            "| params | latency | within budget | recovery | plan |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report.rounds:
            plan = ", ".join(f"{p.pruning_type} {p.layer} {p.pruning_ratio}" for p in r.plan.pruning_recommendations)
            lines.append(
                f"| {r.round} | {r.source} | {accuracy_pct(r.metrics.accuracy, 'n/a (untrained)')} | "
                f"{change_ci(r.accuracy_drop_points, r.metrics.paired)} | {agreement(r.metrics.paired)} | "
                f"{damage_text(r.planner_state, r.metrics.paired)} | "
                f"{millions(r.metrics.params)} | "
                f"{millis(r.metrics.latency_s)} | {'yes' if r.within_budget else 'NO'} | "
                f"{recovery_text(r.prune_report)} | {plan} |"
            )
    full = report.baseline.samples if report.baseline else 0
    stopped = stopped_text([(f"round {r.round}", r.metrics.paired) for r in report.rounds], full)
    return lines + (["", stopped] if stopped else [])


def _profile_lines(report: RunReport) -> list[str]:
    """The profile's most expensive layer groups and the sensitivity profile."""
    lines: list[str] = []
    if report.profile.get("top_groups"):
        lines += [
            "",
            "## Profile: most expensive layer groups",
            "",
            "| layer group | latency share | MACs share |",
            "|---|---|---|",
        ]
        for g in report.profile["top_groups"]:
            lines.append(f"| `{g['pattern']}` | {100 * g['latency_share']:.1f}% | {100 * g['macs_share']:.1f}% |")
    sensitivity = as_profile(report.profile.get("sensitivity"))
    if sensitivity is not None:
        lines += markdown_lines(sensitivity, report.profile.get("total_params"))
    return lines


def _deployment_lines(deployment: dict[str, Any] | None, images: int = 0, halves: set[int] | None = None) -> list[str]:
    """The runtime table: every runtime and precision measured for deployment, and the one chosen; ``images``: the
    evaluation images a candidate not stopped early is judged on (``halves``: a distilled round's student's)."""
    if not deployment:
        return []
    lines = [
        "",
        "## Deployment: runtimes measured side by side",
        "",
        f"Deployed: **{deployment['chosen']}**{_built_from(deployment)} — {deployment['why']}.",
        "",
        "| backend | runtime | precision | latency (batch 1, interleaved) | throughput | memory | accuracy | "
        "Δacc (pts, 95 % CI) | within budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in deployment.get("candidates") or []:
        if c.get("error") or c.get("skipped"):
            failed = f"could not run: {c['error']}" if c.get("error") else f"not built: {c['skipped']}"
            lines.append(f"| {candidate_label(c)} | {c['runtime']} | {c['precision']} | {failed} |||||")
            continue
        mark = " (deployed)" if is_chosen(c, deployment) else ""
        throughput = f"{c['throughput_ips']:.0f} img/s" if c.get("throughput_ips") else "-"
        memory = f"{c['memory_mb']:.2f} MB" if c.get("memory_mb") is not None else "-"
        paired = PairedAccuracy.model_validate(c["paired"]) if c.get("paired") else None
        verdict = "yes" if c.get("within_budget") else "NO"
        if c.get("cross_fitted"):  # a student's build, judged with the other student's on every image
            verdict += f" (judged with the other student's build on every image: {change_ci(None, c['cross_fitted'])})"
        elif c.get("half_luck_points"):  # a student's build, judged on its half less the student's lead there
            verdict += f" (judged {c['half_luck_points']:.2f} lower: the student's lead on this half)"
        if (c.get("budget_z") or 1.0) > 1.0:  # one of several tries: the standard errors its drop was held to
            verdict += f" (z {c['budget_z']:.2f})"
        lines.append(
            f"| {candidate_label(c)}{mark} | {c['runtime']} | {c['precision']} | {millis(c.get('latency_s'))} | "
            f"{throughput} | {memory} | {accuracy_pct(c.get('accuracy'))} | "
            f"{change_ci(c.get('accuracy_drop_points'), paired)} | {verdict} |"
        )
    rows = [(candidate_label(c), c.get("paired")) for c in deployment.get("candidates") or []]
    stopped = stopped_text(rows, images, halves)
    lines += ["", stopped] if stopped else []
    twins = float_twins_text(deployment.get("candidates") or [])
    lines += ["", twins] if twins else []
    tries = tries_text(deployment)
    lines += ["", tries] if tries else []
    steps = deployment.get("steps") or []
    if steps:  # the decision's rules that changed what ships, in order (tools.deploy.decide.STEPS)
        lines += ["", "How the choice was made:", ""]
        lines += [f"{i}. **{step['name']}**: {_step_label(step)}" for i, step in enumerate(steps, 1)]
    original = deployment.get("original_latency_s")
    if original:
        lines += ["", f"The original FP32 PyTorch model in the same comparison: {millis(original)}."]
    if deployment.get("calibration"):
        lines += [f"Static int8 candidates were calibrated on {deployment['calibration']}."]
    return lines


def _step_label(step: dict[str, Any]) -> str:
    """``openvino-int8 (original)``: what a decision step left chosen."""
    return candidate_label({"backend": step["chosen"], "source": step.get("source")})


def _built_from(deployment: dict[str, Any]) -> str:
    return f" (built from {deployment['source']})" if deployment.get("source") else ""


def speedup_lines(speedup: dict[str, Any] | None) -> list[str]:
    """The deployed model's speed-up over the original FP32 PyTorch model, step by step (one timing run)."""
    if not speedup:
        return []
    from tools.deploy.speedup import SpeedupFactors

    factors = SpeedupFactors.model_validate(speedup)
    return [
        "",
        "## Speed-up, decomposed",
        "",
        f"The deployed model ({factors.backend}: {factors.runtime}, {factors.precision}) against the original FP32 "
        "PyTorch model at batch 1, all four models timed interleaved in one run; the factors multiply to the total.",
        "",
    ] + [f"- {line}" for line in factors.lines()]


def _planner_decisions(report: RunReport) -> list[str]:
    """Which planner wrote each plan, and every rejected plan with its reasons (LLM planner)."""
    steps = [("analysis", report.plan.source, report.plan.planner_state or {})]
    steps += [(f"round {r.round}", r.source, r.planner_state or {}) for r in report.rounds]
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


def write_report_files(
    report: RunReport | dict[str, Any],
    json_path: Path,
    md_path: Path,
    times: tuple[Sequence[NodeTime], float | None] | None = None,
) -> dict[str, Any]:
    """Write ``report.md``, ``report.html`` next to it, and ``report.json``, each atomically; returns the JSON.
    ``times``: the nodes' times and when the run started, for the time table (:mod:`tools.reporting.time_table`),
    made once the HTML page's charts are drawn, so that it counts them."""
    from tools.reporting.html import load_profile, render_html, with_time_section
    from tools.store.files import atomic_write_json, atomic_write_text

    report = RunReport.model_validate(report)
    page = render_html(report.model_copy(update={"time_spent": None}), load_profile(report))
    if times is not None:
        report = report.model_copy(update={"time_spent": time_spent(*times)})
    atomic_write_text(md_path.with_name("report.html"), with_time_section(page, report.time_spent))
    atomic_write_text(md_path, render_markdown(report))
    written = report_json(report)
    atomic_write_json(json_path, written)  # last: a run that has a report.json has finished
    return written


class LlmComparisonRow(TypedDict):
    """One LLM's line of ``compare.json``: its best pruned model against the original, and how its plans went."""

    llm: str
    delta_accuracy_points: float | None
    original_params: int
    pruned_params: int
    within_budget: bool | None
    round_sources: dict[str, int]
    rejected_plans: int


class LlmComparison(TypedDict):
    """``compare.json``: the model and dataset every LLM planned for, one row per LLM."""

    model: str
    dataset: str | None
    rows: list[LlmComparisonRow]


def llm_comparison_rows(reports: Mapping[str, RunReport | dict[str, Any]]) -> list[LlmComparisonRow]:
    """One row per LLM: ΔAccuracy of its best pruned model, original and pruned parameters, plan sources."""
    rows: list[LlmComparisonRow] = []
    for name, given in reports.items():
        report = RunReport.model_validate(given)
        base = report.baseline
        if base is None:
            raise ValueError(f"the report of {name} has no baseline")
        pruned = report.pruned or base
        sources: dict[str, int] = {}
        rejected = 0
        for r in report.rounds:
            sources[r.source] = sources.get(r.source, 0) + 1
            rejected += len(r.planner_state.get("rejected", []))
        drop = None
        if base.accuracy is not None and pruned.accuracy is not None:
            drop = round(100 * (pruned.accuracy - base.accuracy), 2)
        rows.append(
            {
                "llm": name,
                "delta_accuracy_points": drop,
                "original_params": base.params,
                "pruned_params": pruned.params,
                "within_budget": pruned.within_budget,
                "round_sources": sources,
                "rejected_plans": rejected,
            }
        )
    return rows


def render_llm_comparison(result: LlmComparison) -> str:
    lines = [
        f"# LLM comparison: {result['model']} on {result['dataset']}",
        "",
        "| LLM | ΔAccuracy (pts) | original params (M) | pruned params (M) | within budget | plans | rejected |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        sources = ", ".join(f"{k}: {v}" for k, v in row["round_sources"].items())
        lines.append(
            f"| {row['llm']} | {signed_points(row['delta_accuracy_points'])} | "
            f"{millions(row['original_params'], unit='')} | {millions(row['pruned_params'], unit='')} | "
            f"{'yes' if row['within_budget'] else 'no'} | {sources} | {row['rejected_plans']} |"
        )
    return "\n".join(lines) + "\n"
