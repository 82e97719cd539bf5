"""``profiling-agent bench``: the agent's pipeline and the paper's baselines, side by side, in one process.

For each model: the agent's full run (profile-guided pruning rounds, then dynamic quantization), the
uniform structured-pruning baselines (L1, L2, random importance at fixed ratios, plus the ratio that
matches the agent's parameter count), and ONNX Runtime's dynamic quantization of the original. Every
model is evaluated on the same seeded subset; batch-1 latencies are measured interleaved, in this one
process, with warm-up and repetitions, and reported as medians, so that ratios hold on a noisy machine.

Writes, in the output directory: ``bench.json``, ``table1.md``/``.csv`` (pruning baselines vs the agent),
``table3.md``/``.csv`` (quantization vs ONNX Runtime), ``table4.md``/``.csv`` (pruning vs quantization)
and ``<model>-tradeoffs.png`` plots. Runs are kept in ``runs/<model>`` and reused when present.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from graph.context import Context
from graph.runner import RunError, UpdateHook, finished_report, resume_run, start_run
from tools import ops
from tools.compression.baselines import matched_ratio, uniform_plan
from tools.compression.recipes import PruningConfig
from tools.schemas import InputShape, Metrics, RunReport
from tools.store.artifacts import is_complete, load_compressed, load_original
from tools.store.files import atomic_write_json, read_json
from tools.store.run_paths import RunPaths
from tools.text import slug

logger = logging.getLogger(__name__)

CRITERIA = ("l1", "l2", "random")
DEFAULT_RATIOS = (0.01, 0.1, 0.2)


class BenchRow(BaseModel):
    """One method on one model: accuracy a fraction (None when not meaningful), sizes in 10^6 bytes."""

    model: str
    method: str
    ratio: float | None = None
    matched: bool = False
    accuracy: float | None
    params: int
    latency_s: float
    memory_mb: float
    artifact: str


class _ModelBench:
    """Everything measured for one model, in its run directory."""

    def __init__(self, spec: str, *, dataset: str | None, split: str | None, out_dir: Path, ctx: Context) -> None:
        self.spec, self.dataset, self.split, self.ctx = spec, dataset, split, ctx
        self.run_dir = out_dir / "runs" / slug(spec)

    def agent_report(self, model_options: dict[str, Any] | None, on_update: UpdateHook | None) -> RunReport:
        paths = RunPaths(self.run_dir)
        if paths.report_json.exists():
            return RunReport.model_validate(finished_report(self.run_dir))
        if paths.settings.exists():
            result = resume_run(self.run_dir, on_update=on_update)
        else:
            ctx = replace(self.ctx, run_dir=str(self.run_dir), quantize=True, prune=True, approve_plan=False)
            result = start_run(
                self.spec,
                dataset=self.dataset,
                split=self.split,
                ctx=ctx,
                on_update=on_update,
                model_options=model_options,
            )
        if result.report is None:
            raise RunError(f"the agent's run in {self.run_dir} is paused for approval: resume it first")
        return RunReport.model_validate(result.report)

    def evaluate(self, model: Callable[[torch.Tensor], Any], desc: str) -> float | None:
        return ops.accuracy_of(model, self.original, self.shape, self.eval_spec, desc)[0]

    def run(
        self, ratios: list[float], model_options: dict[str, Any] | None, on_update: UpdateHook | None
    ) -> list[BenchRow]:
        report = self.agent_report(model_options, on_update)
        self.original = RunPaths(self.run_dir).original
        self.shape = InputShape.model_validate(report.model["input_shape"])
        self.eval_spec = ops.EvalSpec(
            dataset=self.dataset,
            split=self.split,
            label_match=report.dataset["label_match"],
            samples=self.ctx.eval_samples,
            seed=self.ctx.seed,
            batch_size=self.ctx.batch_size,
            progress=self.ctx.progress,
        )
        if report.baseline is None or report.pruned is None:
            raise RunError(f"the agent's run in {self.run_dir} has no original or pruned model to compare")
        rows = [
            self._row(name, entry)
            for name, entry in (
                ("original", report.baseline),
                ("agent-prune", report.pruned),
                ("agent-quant", report.quantized_original),
                ("agent-prune+quant", report.quantized),
            )
            if entry is not None
        ]
        rows += self._pruning_baselines(ratios, report.pruned.params)
        rows.append(self._onnxruntime(report.baseline.params))
        return self._interleaved_latency(rows)

    def _row(
        self, method: str, metrics: Metrics | dict[str, Any], ratio: float | None = None, matched: bool = False
    ) -> BenchRow:
        m = Metrics.model_validate(metrics)
        return BenchRow(
            model=self.spec,
            method=method,
            ratio=ratio,
            matched=matched,
            accuracy=m.accuracy,
            params=m.params,
            latency_s=m.latency_s,
            memory_mb=m.memory_mb,
            artifact=str(m.artifact),
        )

    def _pruning_baselines(self, ratios: list[float], agent_params: int) -> list[BenchRow]:
        prunable = ops.prunable(self.original, self.shape, self.run_dir / "profile")
        matched = matched_ratio(self.original, self.shape, prunable, agent_params)
        rows = []
        for criterion in CRITERIA:
            for ratio in [*ratios, matched]:
                out = self.run_dir / "baselines" / f"{criterion}-{ratio:g}"
                metrics_file = out / "metrics.json"
                if not metrics_file.is_file() or not is_complete(out / "model"):
                    ops.prune(
                        self.original,
                        uniform_plan(ratio, prunable),
                        self.shape,
                        out / "model",
                        PruningConfig(importance=criterion, seed=self.ctx.seed),
                    )
                    metrics = ops.evaluate(
                        out / "model", self.original, self.shape, self.eval_spec, f"{criterion} {ratio:g}"
                    )
                    atomic_write_json(metrics_file, metrics.model_dump())
                rows.append(self._row(criterion, read_json(metrics_file), ratio, matched=ratio == matched))
        return rows

    def _onnxruntime(self, params: int) -> BenchRow:
        from tools.deploy.onnxruntime import onnx_baseline

        model = load_original(self.original).model
        base = onnx_baseline(
            model,
            ops.example_input(self.shape),
            self.run_dir / "onnxruntime",
            threads=self.ctx.threads or torch.get_num_threads(),
        )
        accuracy = self.evaluate(base.quantized_model(), "onnxruntime int8")
        return BenchRow(
            model=self.spec,
            method="onnxruntime-quant",
            accuracy=accuracy,
            params=params,
            latency_s=0.0,
            memory_mb=base.quantized_size_mb,
            artifact=base.quantized_path,
        )

    def _interleaved_latency(self, rows: list[BenchRow]) -> list[BenchRow]:
        from tools.deploy.onnxruntime import OrtModel
        from tools.evaluation.cost import compare_latencies

        models: dict[str, Callable[[torch.Tensor], Any]] = {}
        for row in rows:
            if row.artifact not in models:
                models[row.artifact] = (
                    OrtModel(row.artifact, threads=self.ctx.threads or None)
                    if row.artifact.endswith(".onnx")
                    else load_compressed(row.artifact)
                )
        times = compare_latencies(
            models, ops.example_input(self.shape, seed=self.ctx.seed), warmup=3, repeats=self.ctx.latency_repeats
        )
        return [row.model_copy(update={"latency_s": times[row.artifact]}) for row in rows]


def run_bench(
    models: list[str],
    *,
    dataset: str | None,
    out_dir: Path,
    ctx: Context,
    split: str | None = None,
    ratios: list[float] | None = None,
    model_options: dict[str, Any] | None = None,
    on_update: UpdateHook | None = None,
) -> dict[str, Any]:
    """Bench every model; write bench.json, the tables (Markdown and CSV) and the plots into ``out_dir``."""
    from tools.reporting.bench_tables import write_bench_outputs

    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ops.set_threads(ctx.threads)
    rows: list[BenchRow] = []
    for spec in models:
        logger.info("bench: %s", spec)
        bench = _ModelBench(spec, dataset=dataset, split=split, out_dir=out_dir, ctx=ctx)
        options = model_options if model_options and ":" in spec else None
        rows += bench.run(list(ratios or DEFAULT_RATIOS), options, on_update)
    result = {
        "dataset": dataset,
        "eval_samples": ctx.eval_samples,
        "threads": torch.get_num_threads(),
        "latency": f"batch 1, median of {ctx.latency_repeats} interleaved repetitions after 3 warm-up runs",
        "models": {spec: [r.model_dump() for r in rows if r.model == spec] for spec in models},
    }
    write_bench_outputs(result, out_dir)
    return result
