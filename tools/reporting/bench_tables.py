"""The benchmark's tables (shaped like the paper's Tables 1, 3 and 4) and plots, from ``bench.json`` rows.

ΔAccuracy is in points against the original on the same images, with its 95 % interval where the rows
are paired; memory in 10^6 bytes as saved for deployment; latency at batch 1 (medians of interleaved
repetitions); the speed gain against ONNX Runtime is ONNX Runtime's time over ours. Table 1 lists every
uniform baseline twice, without recovery and with the run's recovery; ``table1-matched`` condenses it to
the agent's parameter count, one line per model.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from tools.deploy.registry import BENCH_BASELINES, DEPLOYMENTS, FLOAT
from tools.reporting.format import accuracy_pct, millions, millis, percent_less, signed_points, times
from tools.reporting.paired_text import change_ci
from tools.store.files import atomic_write_json, atomic_write_text

Row = dict[str, Any]
Table = tuple[list[str], list[list[str]]]


def _by_method(rows: list[Row]) -> dict[str, Row]:
    return {r["method"]: r for r in rows if r["ratio"] is None}


def _delta(row: Row, base: Row) -> str:
    if row["accuracy"] is None or base["accuracy"] is None:
        return signed_points(None)
    return signed_points(100 * (row["accuracy"] - base["accuracy"]))


#: The data-free criteria of the paper's baselines (the run's own importance may be benched besides).
PAPER_CRITERIA = ("l1", "l2", "random")


def _change(row: Row, base: Row) -> float | None:
    """Accuracy change against the original in points: the paired difference where there is one."""
    if row.get("paired"):
        return float(row["paired"]["delta_points"])
    if row["accuracy"] is None or base["accuracy"] is None:
        return None
    return 100 * (row["accuracy"] - base["accuracy"])


def _change_text(row: Row, base: Row) -> str:
    change = _change(row, base)
    if change is None:
        return signed_points(None)
    return change_ci(-change, row.get("paired"))


def _recovery_text(row: Row) -> str:
    recovery = row.get("recovery") or "none"
    steps = row.get("finetune_steps") or 0
    return f"{recovery} + KD {steps} steps" if steps else recovery


def _params_change(row: Row, base: Row) -> str:
    return f"{100 * (row['params'] / base['params'] - 1):+.1f}%" if base["params"] else "-"


def table1(model: str, rows: list[Row]) -> Table:
    """Uniform pruning at each ratio (and at the agent's parameter count), without and with recovery, vs the
    agent."""
    base = _by_method(rows)["original"]
    header = [
        "model",
        "method",
        "importance",
        "recovery",
        "ratio",
        "params (M)",
        "Δparams",
        "accuracy",
        "ΔAccuracy (pts) [95% CI]",
        "latency (ms)",
    ]
    body = []
    for r in rows:
        if r["method"] not in ("uniform", "agent-prune", "original"):
            continue
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:g}" + (" (matched)" if r.get("matched") else "")
        body.append(
            [
                model,
                r["method"],
                r.get("importance") or "-",
                _recovery_text(r) if r["method"] != "original" else "-",
                ratio,
                millions(r["params"], unit=""),
                _params_change(r, base),
                accuracy_pct(r["accuracy"]),
                _change_text(r, base),
                millis(r["latency_s"], unit=""),
            ]
        )
    return header, body


def _best(rows: list[Row], base: Row) -> Row | None:
    scored = [r for r in rows if _change(r, base) is not None]
    return max(scored, key=lambda r: _change(r, base) or 0.0) if scored else None


def table1_matched(model: str, rows: list[Row]) -> Table:
    """At the agent's parameter count: the agent against the best uniform criterion without recovery (what
    the paper compares), the best with the run's recovery, and the run's own importance with recovery; the
    gaps say what the planner buys beyond recovery and beyond both. When the agent's round was distilled and no
    uniform baseline was, the gap columns are named "planner + distillation": the planner alone did not buy them."""
    methods = _by_method(rows)
    base, agent = methods["original"], methods.get("agent-prune")
    matched = [r for r in rows if r["method"] == "uniform" and r.get("matched")]
    paper = [r for r in matched if r.get("importance") in PAPER_CRITERIA]
    plain = _best([r for r in paper if r.get("recovery") == "none"], base)
    repaired = _best([r for r in paper if r.get("recovery") != "none"], base)
    own = _best([r for r in matched if r.get("importance") not in PAPER_CRITERIA and r.get("recovery") != "none"], base)
    # a distilled agent round against undistilled uniform baselines: the gap is the planner's and distillation's
    distilled = (
        agent is not None and bool(agent.get("finetune_steps")) and not any(r.get("finetune_steps") for r in matched)
    )
    gainer = "planner + distillation" if distilled else "agent"
    header = [
        "model",
        "params removed",
        "agent",
        "best uniform, no recovery",
        "best uniform + recovery",
        "uniform, agent's importance + recovery",
        f"{gainer} − best no recovery (pts)",
        f"{gainer} − best + recovery (pts)",
    ]
    if agent is None:
        return header, []

    def cell(r: Row | None, with_name: bool = True) -> str:
        if r is None:
            return "-"
        name = f"{r.get('importance')}, {_recovery_text(r)}: " if with_name else ""
        return name + _change_text(r, base)

    def gap(r: Row | None) -> str:
        a, b = _change(agent, base), None if r is None else _change(r, base)
        return signed_points(None if a is None or b is None else a - b, missing="-")

    removed = percent_less(agent["params"], base["params"])
    uniform = next((r for r in (plain, repaired, own) if r is not None), None)
    if uniform is not None and abs(uniform["params"] - agent["params"]) > 0.02 * base["params"]:
        # the agent narrows heads, which no uniform ratio does: at its size the uniform models may be out of reach
        removed += f" (uniform: {percent_less(uniform['params'], base['params'])}, the closest it reaches)"
    body = [
        [
            model,
            removed,
            f"{agent.get('importance')}, {_recovery_text(agent)}: {_change_text(agent, base)}",
            cell(plain),
            cell(repaired),
            cell(own),
            gap(plain),
            gap(repaired),
        ]
    ]
    return header, body


#: The runtime and precision of a row that names none: the float model's (PyTorch FP32).
_FLOAT_RUNTIME, _FLOAT_PRECISION = DEPLOYMENTS[FLOAT].runtime, DEPLOYMENTS[FLOAT].precision
#: The runtime of each of the bench's baselines.
_BASELINE_RUNTIMES: dict[str, str] = {method: DEPLOYMENTS[name].runtime for method, name in BENCH_BASELINES.items()}
#: The FP32 row of each runtime: the reference that separates the runtime's gain from the precision's (the original
#: for PyTorch; for another runtime, the baseline deployed as its runtime's float reference).
FP32_ROWS: dict[str, str] = {
    _FLOAT_RUNTIME: "original",
    **{
        _BASELINE_RUNTIMES[method]: method
        for method, name in BENCH_BASELINES.items()
        if DEPLOYMENTS[name].float_reference == name
    },
}
#: The paper's baseline (ONNX Runtime's dynamic int8 of the original) and OpenVINO's int8: table 3's speed gains.
_PAPER_BASELINE, _OPENVINO_INT8 = "onnxruntime-quant", "openvino-int8-quant"


def speedup_factors(row: Row, methods: dict[str, Row]) -> dict[str, float | None]:
    """``row``'s speed-up over the original FP32 PyTorch model as runtime x precision x pruning.

    runtime: PyTorch FP32 -> the row's runtime at FP32 (the original in both); precision: that -> the row's
    precision (the original); pruning: the original -> the pruned model at the row's runtime and precision
    (``agent-prune+quant`` against ``agent-quant``, the same backend on the original; 1 for the others).
    A factor whose reference row is missing is None. All latencies come from the one interleaved timing run.
    """
    base = methods["original"]
    fp32 = methods.get(FP32_ROWS.get(row.get("runtime") or _FLOAT_RUNTIME, "original"))
    unpruned = methods.get("agent-quant") if row["method"] == "agent-prune+quant" else row

    def ratio(before: Row | None, after: Row | None) -> float | None:
        if before is None or after is None or not before["latency_s"] or not after["latency_s"]:
            return None
        return float(before["latency_s"]) / float(after["latency_s"])

    return {
        "runtime": ratio(base, fp32),
        "precision": ratio(fp32, unpruned),
        "pruning": ratio(unpruned, row),
        "total": ratio(base, row),
    }


def _factor(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table3_methods() -> list[str]:
    """Table 3's rows in order: each runtime's FP32 baseline, the agent's quantized original, the other baselines
    runtime by runtime, the agent's quantized pruned model."""
    fp32 = set(FP32_ROWS.values())
    runtimes = list(dict.fromkeys(_BASELINE_RUNTIMES.values()))
    quantized = sorted(
        (m for m in BENCH_BASELINES if m not in fp32), key=lambda m: runtimes.index(_BASELINE_RUNTIMES[m])
    )
    return [*(m for m in BENCH_BASELINES if m in fp32), "agent-quant", *quantized, "agent-prune+quant"]


def _table3_note(name: str, row: Row) -> str:
    """Where the agent deployed the original as the paper's baseline does: what still tells them apart."""
    same_runtime = row.get("runtime") == _BASELINE_RUNTIMES[_PAPER_BASELINE]
    if name == "agent-quant" and same_runtime and "dynamic" in str(row.get("precision")):
        return f"same export and quantize_dynamic as {_PAPER_BASELINE}; sessions with a fixed batch"
    return ""


def table3(model: str, rows: list[Row]) -> Table:
    """Quantization and runtimes: the agent's (of the original, and of its pruned model) vs ONNX Runtime's and
    OpenVINO's, each speed-up split into runtime x precision x pruning."""
    methods = _by_method(rows)
    base, ort, ov = methods["original"], methods.get(_PAPER_BASELINE), methods.get(_OPENVINO_INT8)
    header = [
        "model",
        "method",
        "runtime, precision",
        "ΔAccuracy (pts)",
        "memory (MB)",
        "memory reduction",
        "time before → after (ms)",
        "speed-up vs FP32",
        "= runtime",
        "x precision",
        "x pruning",
        "speed gain vs ONNX Runtime",
        "speed gain vs OpenVINO int8",
        "note",
    ]
    body = []
    for name in _table3_methods():
        r = methods.get(name)
        if r is None:
            continue
        gain = times(ort["latency_s"], r["latency_s"]) if ort and r["latency_s"] else "-"
        gain_ov = times(ov["latency_s"], r["latency_s"]) if ov and r["latency_s"] else "-"
        factors = speedup_factors(r, methods)
        body.append(
            [
                model,
                name,
                f"{r.get('runtime') or _FLOAT_RUNTIME}, {r.get('precision') or _FLOAT_PRECISION}",
                _delta(r, base),
                f"{r['memory_mb']:.2f}",
                percent_less(r["memory_mb"], base["memory_mb"]),
                f"{millis(base['latency_s'], unit='')} → {millis(r['latency_s'], unit='')}",
                times(base["latency_s"], r["latency_s"]),
                _factor(factors["runtime"]),
                _factor(factors["precision"]),
                _factor(factors["pruning"]),
                gain,
                gain_ov,
                _table3_note(name, r),
            ]
        )
    return header, body


def table4(model: str, rows: list[Row]) -> Table:
    """Pruning vs quantization (and both) against the original model."""
    methods = _by_method(rows)
    base = methods["original"]
    header = ["model", "technique", "Top-1 before → after", "memory reduction", "parameter reduction", "speed-up"]
    body = []
    for label, name in (
        ("pruning", "agent-prune"),
        ("quantization", "agent-quant"),
        ("pruning + quantization", "agent-prune+quant"),
    ):
        r = methods.get(name)
        if r is None:
            continue
        body.append(
            [
                model,
                label,
                f"{accuracy_pct(base['accuracy'])} → {accuracy_pct(r['accuracy'])}",
                percent_less(r["memory_mb"], base["memory_mb"]),
                percent_less(r["params"], base["params"]),
                times(base["latency_s"], r["latency_s"]),
            ]
        )
    return header, body


def _markdown(title: str, table: Table, note: str) -> str:
    header, body = table
    lines = [f"# {title}", "", note, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def _csv(table: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(table[0])
    writer.writerows(table[1])
    return buffer.getvalue()


def _series(row: Row) -> str:
    """A row's series in the plot: uniform rows by criterion, with or without recovery; others by method."""
    if row["method"] != "uniform":
        return str(row["method"])
    recovery = row.get("recovery") or "none"
    return f"uniform {row.get('importance')}" + ("" if recovery == "none" else f" + {recovery}")


def tradeoff_plot(model: str, rows: list[Row]) -> bytes:
    """Accuracy against parameters and against latency, every method on the same axes: a uniform criterion
    keeps its colour, hollow without recovery and filled with it."""
    from tools.reporting.charts import PALETTE, Panel, Point, SeriesStyle, scatter_panels

    def note(r: Row) -> str:
        return "" if r["ratio"] is None else f"{r['ratio']:g}"

    has_accuracy = all(r["accuracy"] is not None for r in rows)
    y = (lambda r: 100 * r["accuracy"]) if has_accuracy else (lambda r: r["memory_mb"])
    ylabel = "top-1 accuracy (%)" if has_accuracy else "memory (MB)"
    series = list(dict.fromkeys(_series(r) for r in rows))
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(dict.fromkeys(str(r["method"]) for r in rows))}
    criteria = list(dict.fromkeys(str(r.get("importance")) for r in rows if r["method"] == "uniform"))
    styles: dict[str, SeriesStyle] = {}
    for r in rows:
        name = _series(r)
        if r["method"] == "uniform":
            colour = PALETTE[(len(colours) + criteria.index(str(r.get("importance")))) % len(PALETTE)]
            styles[name] = SeriesStyle(marker="s", color=colour, filled=(r.get("recovery") or "none") != "none")
        else:
            styles[name] = SeriesStyle(color=colours[str(r["method"])])
    panels = [
        Panel(
            points=[Point(r["params"] / 1e6, y(r), _series(r), note(r)) for r in rows],
            xlabel="parameters (M)",
            ylabel=ylabel,
        ),
        Panel(
            points=[Point(1000 * r["latency_s"], y(r), _series(r), note(r)) for r in rows],
            xlabel="latency, batch 1 (ms)",
            ylabel=ylabel,
        ),
    ]
    title = f"{model}: " + ("accuracy against size and speed" if has_accuracy else "untrained: memory against size")
    return scatter_panels(panels, title=title, styles={k: styles[k] for k in series})


def write_bench_outputs(result: dict[str, Any], out_dir: Path) -> None:
    from tools.reporting.plots import save_png

    recovery = result.get("recovery", "none")
    notes = {
        "table1": "Structured pruning: uniform baselines (every prunable layer at one ratio; 'matched' = the ratio "
        "giving the agent's parameter count) with each importance criterion, without recovery (as in the paper) and "
        f"with the run's training-free recovery ({recovery}, on the run's calibration images), vs the agent's best "
        "pruned model (its importance and recovery, and distillation where it had --finetune-steps). ΔAccuracy: "
        "against the original on the same images, with the 95 % interval of the paired difference where measured.",
        "table1-matched": "At the agent's parameter count: the agent vs the best uniform baseline without recovery "
        "(what recovery and the planner buy together), with the run's recovery (what the planner buys), and with "
        "the agent's own importance and recovery. Gaps in points: positive = the agent keeps more accuracy.",
        "table3": "Deployment: the agent's deployed runtime and precision on the original model (agent-quant) and on "
        "its pruned model (agent-prune+quant) vs ONNX Runtime dynamic int8, ONNX Runtime static int8 and OpenVINO "
        "int8 (NNCF) of the original, with the FP32 models of each runtime. Each speed-up over PyTorch FP32 is split "
        "into runtime (PyTorch FP32 → the runtime's FP32 of the original), precision (→ the row's precision, "
        "original) and pruning (→ the pruned model, same runtime and precision); all from one interleaved timing "
        "run, so the factors multiply to the speed-up. Speed gain vs ONNX Runtime = ONNX Runtime's time / ours.",
        "table4": "Pruning vs quantization against the original model.",
    }
    builders = {"table1": table1, "table1-matched": table1_matched, "table3": table3, "table4": table4}
    titles = {"table1-matched": "Table 1 at the agent's parameter count"}
    for name, build in builders.items():
        header: list[str] = []
        body: list[list[str]] = []
        for model, rows in result["models"].items():
            header, part = build(model, rows)
            body += part
        calibration = result.get("calibration_samples")
        data = (
            f"{result['eval_samples']} evaluation samples of {result['dataset']}"
            + (f" (disjoint from the {calibration} calibration images)" if calibration else "")
            if result["dataset"]
            else "no dataset (untrained models: latency and memory only)"
        )
        note = f"{notes[name]} {data}; {result['latency']}; {result['threads']} threads."
        title = titles.get(name, name.replace("table", "Table "))
        atomic_write_text(out_dir / f"{name}.md", _markdown(title, (header, body), note))
        atomic_write_text(out_dir / f"{name}.csv", _csv((header, body)))
    for model, rows in result["models"].items():
        save_png(tradeoff_plot(model, rows), out_dir / f"{Path(model).name or 'model'}-tradeoffs.png")
    atomic_write_json(out_dir / "bench.json", result)
