"""The benchmark's tables (shaped like the paper's Tables 1, 3 and 4) and plots, from ``bench.json`` rows.

ΔAccuracy is in points; memory in 10^6 bytes as saved for deployment; latency at batch 1 (medians of
interleaved repetitions); the speed gain against ONNX Runtime is ONNX Runtime's time over ours.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from tools.reporting.format import accuracy_pct, millions, millis, percent_less, signed_points, times
from tools.store.files import atomic_write_json, atomic_write_text

Row = dict[str, Any]
Table = tuple[list[str], list[list[str]]]


def _by_method(rows: list[Row]) -> dict[str, Row]:
    return {r["method"]: r for r in rows if r["ratio"] is None}


def _delta(row: Row, base: Row) -> str:
    if row["accuracy"] is None or base["accuracy"] is None:
        return signed_points(None)
    return signed_points(100 * (row["accuracy"] - base["accuracy"]))


def table1(model: str, rows: list[Row]) -> Table:
    """Uniform L1/L2/random pruning at each ratio (and at the agent's parameter count) vs the agent."""
    base = _by_method(rows)["original"]
    header = ["model", "method", "ratio", "ΔAccuracy (pts)", "params (M)", "params removed"]
    body = []
    for r in rows:
        if r["method"] in ("l1", "l2", "random", "agent-prune", "original"):
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:g}" + (" (matched)" if r.get("matched") else "")
            body.append(
                [
                    model,
                    r["method"],
                    ratio,
                    _delta(r, base),
                    millions(r["params"], unit=""),
                    percent_less(r["params"], base["params"]),
                ]
            )
    return header, body


def table3(model: str, rows: list[Row]) -> Table:
    """Quantization: the agent's (of the original, and of its pruned model) vs ONNX Runtime's."""
    methods = _by_method(rows)
    base, ort = methods["original"], methods.get("onnxruntime-quant")
    header = [
        "model",
        "method",
        "ΔAccuracy (pts)",
        "memory (MB)",
        "memory reduction",
        "time before → after (ms)",
        "speed-up vs FP32",
        "speed gain vs ONNX Runtime",
    ]
    body = []
    for name in ("agent-quant", "onnxruntime-quant", "agent-prune+quant"):
        r = methods.get(name)
        if r is None:
            continue
        gain = times(ort["latency_s"], r["latency_s"]) if ort and r["latency_s"] else "-"
        body.append(
            [
                model,
                name,
                _delta(r, base),
                f"{r['memory_mb']:.2f}",
                percent_less(r["memory_mb"], base["memory_mb"]),
                f"{millis(base['latency_s'], unit='')} → {millis(r['latency_s'], unit='')}",
                times(base["latency_s"], r["latency_s"]),
                gain,
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


def tradeoff_plot(model: str, rows: list[Row]) -> bytes:
    """Accuracy against parameters and against latency, every method on the same axes."""
    from tools.reporting.charts import Panel, Point, scatter_panels

    def note(r: Row) -> str:
        return "" if r["ratio"] is None else f"{r['ratio']:g}"

    has_accuracy = all(r["accuracy"] is not None for r in rows)
    y = (lambda r: 100 * r["accuracy"]) if has_accuracy else (lambda r: r["memory_mb"])
    ylabel = "top-1 accuracy (%)" if has_accuracy else "memory (MB)"
    panels = [
        Panel(
            points=[Point(r["params"] / 1e6, y(r), r["method"], note(r)) for r in rows],
            xlabel="parameters (M)",
            ylabel=ylabel,
        ),
        Panel(
            points=[Point(1000 * r["latency_s"], y(r), r["method"], note(r)) for r in rows],
            xlabel="latency, batch 1 (ms)",
            ylabel=ylabel,
        ),
    ]
    title = f"{model}: " + ("accuracy against size and speed" if has_accuracy else "untrained: memory against size")
    return scatter_panels(panels, title=title)


def write_bench_outputs(result: dict[str, Any], out_dir: Path) -> None:
    from tools.reporting.plots import save_png

    notes = {
        "table1": "Structured pruning without fine-tuning: uniform baselines (every prunable layer at one ratio; "
        "'matched' = the ratio giving the agent's parameter count) vs the agent's best pruned model.",
        "table3": "Dynamic int8 quantization: the agent's (with its quantization backend) vs ONNX Runtime's, on the "
        "original model, plus the agent's pruned-and-quantized model. Speed gain vs ONNX Runtime = ONNX Runtime's "
        "time / ours.",
        "table4": "Pruning vs quantization against the original model.",
    }
    builders = {"table1": table1, "table3": table3, "table4": table4}
    for name, build in builders.items():
        header: list[str] = []
        body: list[list[str]] = []
        for model, rows in result["models"].items():
            header, part = build(model, rows)
            body += part
        data = (
            f"{result['eval_samples']} evaluation samples of {result['dataset']}"
            if result["dataset"]
            else "no dataset (untrained models: latency and memory only)"
        )
        note = f"{notes[name]} {data}; {result['latency']}; {result['threads']} threads."
        atomic_write_text(out_dir / f"{name}.md", _markdown(name.replace("table", "Table "), (header, body), note))
        atomic_write_text(out_dir / f"{name}.csv", _csv((header, body)))
    for model, rows in result["models"].items():
        save_png(tradeoff_plot(model, rows), out_dir / f"{Path(model).name or 'model'}-tradeoffs.png")
    atomic_write_json(out_dir / "bench.json", result)
