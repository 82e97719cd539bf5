"""``profiling-agent bench``: the agent's pipeline and the paper's baselines, side by side, in one process.

For each model: the agent's full run (profile-guided pruning rounds, then dynamic quantization), the
uniform structured-pruning baselines, and ONNX Runtime's dynamic quantization of the original. The
uniform baselines prune every prunable layer at one ratio (fixed ratios, plus the ratio that matches the
agent's parameter count) with L1, L2 and random importance -- and the run's own importance where it is
another one (``act``) -- each twice: without recovery, as in the paper, and with the run's training-free
recovery on the run's calibration images. So at the agent's size the tables separate what recovery buys
(uniform without vs with recovery) from what the planner buys (uniform with recovery vs the agent).

Every model is evaluated on the agent run's evaluation images (the same seeded part of the data, disjoint
from its calibration images), paired with the original where ``ops.evaluate`` pairs; batch-1 latencies
are measured interleaved, in this one process, with warm-up and repetitions, and reported as medians, so
that ratios hold on a noisy machine.

Writes, in the output directory: ``bench.json``, ``table1.md``/``.csv`` (pruning baselines vs the agent),
``table1-matched.md``/``.csv`` (the same at the agent's parameter count, one line per model),
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
from pydantic import BaseModel, Field, JsonValue

from agents.context import Context
from agents.evaluation import eval_spec
from agents.state import State
from graph.runner import RunError, UpdateHook, finished_report, resume_run, start_run
from tools.artifacts.hashes import recipe_hash, stored_recipe_hash
from tools.artifacts.io import load_compressed, load_original
from tools.compression.baselines import matched_ratio, uniform_plan
from tools.compression.recipes import PruningConfig, RecoveryConfig
from tools.deploy.registry import (
    BENCH_BUILT_BASELINES,
    BENCH_EXPORTED_BASELINES,
    FLOAT,
    float_reference_of,
    runtime_and_precision,
)
from tools.schemas import InputShape, Metrics, PairedAccuracy, ProfileSummary, QuantizationRecommendation, RunReport
from tools.stages import ops
from tools.store.files import atomic_write_json, read_json
from tools.store.run_paths import RunPaths
from tools.text import slug

logger = logging.getLogger(__name__)

CRITERIA = ("l1", "l2", "random")
DEFAULT_RATIOS = (0.01, 0.1, 0.2)


#: Settings a run written before the calibration split had (its evaluation images are the first part).
_OLD_RUN_SETTINGS = {"calibration_samples": 0, "confirm_samples": 0, "finetune_samples": 0, "recovery": "none"}


class BenchRow(BaseModel):
    """One method on one model: accuracy a fraction (None when not meaningful), sizes in 10^6 bytes.

    ``method`` is ``original``, ``agent-prune``, ``agent-quant``, ``agent-prune+quant``, ``uniform`` or one of the
    baselines of :data:`tools.deploy.registry.BENCH_BASELINES`; ``importance`` and ``recovery`` say how a pruned
    model was pruned and repaired (``finetune_steps``: distillation steps after recovery, the agent's only);
    ``paired``: its accuracy against the original's on the same images, where measured.
    """

    model: str
    method: str
    importance: str | None = None
    recovery: str = "none"
    finetune_steps: int = 0
    ratio: float | None = None
    matched: bool = False
    accuracy: float | None
    params: int
    latency_s: float
    memory_mb: float
    artifact: str
    paired: PairedAccuracy | None = None
    runtime: str = Field(
        default=runtime_and_precision(FLOAT)[0], description="pytorch, onnxruntime or openvino: what runs the artifact."
    )
    precision: str = "fp32"


class _ModelBench:
    """Everything measured for one model, in its run directory."""

    def __init__(self, spec: str, *, dataset: str | None, split: str | None, out_dir: Path, ctx: Context) -> None:
        self.spec, self.dataset, self.split, self.ctx = spec, dataset, split, ctx
        self.run_dir = out_dir / "runs" / slug(spec)

    def agent_report(self, model_options: dict[str, JsonValue] | None, on_update: UpdateHook | None) -> RunReport:
        ctx = replace(self.ctx, quantize=True, prune=True, approve_plan=False)
        inputs = {"model": self.spec, "dataset": self.dataset, "dataset_split": self.split}
        self.run_dir = _cached_run_dir(self.run_dir, {**inputs, "model_options": model_options}, ctx)
        ctx = replace(ctx, run_dir=str(self.run_dir))
        paths = RunPaths(self.run_dir)
        if paths.report_json.exists():
            return RunReport.model_validate(finished_report(self.run_dir))
        if paths.settings.exists():
            result = resume_run(self.run_dir, on_update=on_update)
        else:
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
        self, ratios: list[float], model_options: dict[str, JsonValue] | None, on_update: UpdateHook | None
    ) -> list[BenchRow]:
        report = self.agent_report(model_options, on_update)
        self.original = RunPaths(self.run_dir).original
        self.shape = InputShape.model_validate(report.model["input_shape"])
        # the agent run's own settings: its evaluation images, calibration images, importance and recovery
        self.run_ctx = Context.from_dict({**_OLD_RUN_SETTINGS, **report.settings}) if report.settings else self.ctx
        profile = {k: v for k, v in report.profile.items() if k != "sensitivity"}  # the report's is the whole profile
        data = State(
            model=str(report.model.get("spec") or ""),
            dataset=self.dataset,
            dataset_split=self.split,
            label_match=report.dataset["label_match"],
            # its MACs decide an automatic evaluation size
            profile_summary=ProfileSummary.model_validate(profile) if "total_macs" in profile else None,
        )
        self.eval_spec = eval_spec(data, self.run_ctx).model_copy(
            update={
                "batch_size": self.ctx.batch_size,
                "device": self.ctx.device,
                "progress": self.ctx.progress,
                "stop_beyond_points": None,  # a benchmark measures every method on every image
            }
        )
        if report.baseline is None or report.pruned is None:
            raise RunError(f"the agent's run in {self.run_dir} has no original or pruned model to compare")
        self.data_parts = ops.part_sizes(self.eval_spec) if self.dataset else {}
        agent = {
            "importance": self.run_ctx.importance,
            "recovery": self._recovery_of(report),
            "finetune_steps": _distilled_steps(report),
        }
        named: tuple[tuple[str, Metrics | None, dict[str, Any]], ...] = (
            ("original", report.baseline, {}),
            ("agent-prune", report.pruned, agent),
            ("agent-quant", report.quantized_original, {}),  # the original, quantized: nothing pruned
            ("agent-prune+quant", report.quantized, agent),
        )
        rows = [self._row(name, entry, **{**how, **_runtime_of(entry)}) for name, entry, how in named if entry]
        rows += self._pruning_baselines(ratios, report.pruned.params)
        rows += self._exported_baselines(report.baseline.params)
        rows += self._built_baselines(report.baseline.params)
        return self._interleaved_latency(rows)

    def _built_baselines(self, params: int) -> list[BenchRow]:
        """The registry's builds of the original (:data:`~tools.deploy.registry.BENCH_BUILT_BASELINES`: OpenVINO FP32
        and int8 (NNCF), ONNX Runtime static int8), calibrated on the run's images."""
        from tools.deploy.config import QuantizationConfig
        from tools.deploy.registry import available

        calibration = ops.calibration_batch(self.original, self.shape, self.eval_spec)
        if calibration is None:
            return []  # no data: nothing to calibrate on
        recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="the original, all layers")]
        rows = []
        for method, backend in BENCH_BUILT_BASELINES.items():
            if not available(backend):
                continue
            out = self.run_dir / "baselines" / f"{backend}-original"
            config = QuantizationConfig(backend=backend)
            ops.quantize(
                self.original, self.original, recs, out, config, shape=self.shape, calibration=calibration.images
            )
            metrics = ops.evaluate(out, self.original, self.shape, self.eval_spec, desc=f"{backend} of the original")
            measured = {"accuracy": metrics.accuracy, "paired": metrics.paired, "memory_mb": metrics.memory_mb}
            rows.append(self._baseline_row(method, backend, params, artifact=str(out), **measured))
        return rows

    def _baseline_row(self, method: str, deployment: str, params: int, **measured: Any) -> BenchRow:
        """A baseline of the original in ``deployment``'s runtime and precision, as measured (its latency is timed
        later, with every row)."""
        runtime, precision = runtime_and_precision(deployment)
        return BenchRow(
            model=self.spec,
            method=method,
            runtime=runtime,
            precision=precision,
            params=params,
            latency_s=0.0,
            **measured,
        )

    def _recovery_of(self, report: RunReport) -> str:
        """The recovery the agent's pruned models went through: none without calibration images."""
        method = self.run_ctx.recovery
        if method != "none" and (report.dataset.get("spec") is None or self.run_ctx.calibration_samples < 1):
            return "none"
        return method

    def _row(
        self,
        method: str,
        metrics: Metrics | dict[str, Any],
        ratio: float | None = None,
        matched: bool = False,
        **how: Any,
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
            paired=m.paired,
            **how,
        )

    def _pruning_baselines(self, ratios: list[float], agent_params: int) -> list[BenchRow]:
        """Uniform pruning at each ratio and at the agent's size: per criterion, without and with recovery."""
        prunable = ops.prunable(self.original, self.shape, self.run_dir / "profile")
        matched = matched_ratio(lambda: load_original(self.original).model, self.shape, prunable, agent_params)
        calibration = ops.calibration_batch(self.original, self.shape, self.eval_spec)
        criteria = list(CRITERIA)
        if self.run_ctx.importance not in criteria and calibration is not None:
            criteria.append(self.run_ctx.importance)  # the agent's importance, uniformly applied
        recoveries = ["none"]
        if self.run_ctx.recovery != "none":
            if calibration is None:
                logger.warning("bench: no calibration images: the uniform baselines run without recovery only")
            else:
                recoveries.append(self.run_ctx.recovery)
        rows = []
        for criterion in criteria:
            for recovery in recoveries:
                for ratio in sorted({*ratios, matched}):
                    metrics = self._baseline(criterion, recovery, ratio, prunable, calibration)
                    how = {"importance": criterion, "recovery": recovery}
                    rows.append(self._row("uniform", metrics, ratio, matched=ratio == matched, **how))
        return rows

    def _baseline(
        self,
        criterion: str,
        recovery: str,
        ratio: float,
        prunable: dict[str, Any],
        calibration: ops.Calibration | None,
    ) -> Metrics:
        """One uniform baseline, pruned (and repaired) once and evaluated on the run's evaluation images."""
        name = f"{criterion}-{ratio:g}" if recovery == "none" else f"{criterion}-{recovery}-{ratio:g}"
        out = self.run_dir / "baselines" / name
        metrics_file = out / "metrics.json"
        images = self.eval_spec.model_dump(include={"dataset", "split", "samples", "calibration_samples", "seed"})
        ops.prune(  # reuses the model when its recipe hash matches, rebuilds it otherwise
            self.original,
            uniform_plan(ratio, prunable),
            self.shape,
            out / "model",
            PruningConfig(importance=criterion, seed=self.run_ctx.seed, round_to=0, head_round_to=0),  # exact ratios
            recovery=RecoveryConfig.model_validate({"method": recovery}),
            calibration=calibration,
        )
        # metrics are reused for the same evaluation images and the same model (its recipe hash), else measured
        settings = {"eval": images, "recipe_hash": stored_recipe_hash(out / "model")}
        if metrics_file.is_file():
            saved = read_json(metrics_file)
            if {key: saved.get(key) for key in settings} == settings:
                return Metrics.model_validate(saved)
        label = f"{criterion} {ratio:g}" + ("" if recovery == "none" else f" +{recovery}")
        metrics = ops.evaluate(out / "model", self.original, self.shape, self.eval_spec, label)
        atomic_write_json(metrics_file, {**metrics.model_dump(mode="json"), **settings})
        return metrics

    def _exported_baselines(self, params: int) -> list[BenchRow]:
        """ONNX Runtime's dynamic int8 of the original (the paper's baseline) and the FP32 export it came from: the
        rows of :data:`~tools.deploy.registry.BENCH_EXPORTED_BASELINES`."""
        from tools.deploy.onnxruntime.session import onnx_baseline

        # one runtime's export and its quantization, written in a folder named after that runtime
        (folder,) = {runtime_and_precision(name)[0] for name in BENCH_EXPORTED_BASELINES.values()}
        model = load_original(self.original).model
        base = onnx_baseline(
            model,
            ops.example_input(self.shape),
            self.run_dir / folder,
            threads=self.ctx.threads or torch.get_num_threads(),
        )
        rows = []
        for method, name in BENCH_EXPORTED_BASELINES.items():
            fp32 = float_reference_of(name) == name  # the export itself; else its quantization
            path, size, session = (
                (base.fp32_path, base.fp32_size_mb, base.fp32_model)
                if fp32
                else (base.quantized_path, base.quantized_size_mb, base.quantized_model)
            )
            accuracy = self.evaluate(session(), method)
            rows.append(self._baseline_row(method, name, params, accuracy=accuracy, memory_mb=size, artifact=path))
        return rows

    def _interleaved_latency(self, rows: list[BenchRow]) -> list[BenchRow]:
        from tools.deploy.onnxruntime.session import OrtModel
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


def _runtime_of(entry: Metrics | None) -> dict[str, str]:
    """The runtime and precision a run's model entry was deployed with (PyTorch FP32 when it says nothing)."""
    extra = (entry.model_extra or {}) if entry is not None else {}
    runtime, precision = runtime_and_precision(str(extra.get("backend") or FLOAT), runtime_and_precision(FLOAT))
    return {"runtime": str(extra.get("runtime") or runtime), "precision": str(extra.get("precision") or precision)}


def _run_settings(inputs: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """What decides an agent run's results: its inputs and settings, less where it is written and progress bars."""
    settings = Context.from_dict(context).to_dict()
    for key in ("run_dir", "progress"):
        settings.pop(key, None)
    return {"input": {k: v for k, v in inputs.items() if v is not None}, "context": settings}


def _cached_run_dir(plain: Path, inputs: dict[str, Any], ctx: Context) -> Path:
    """Where the agent run with these settings is kept: ``runs/<model>`` unless that holds a run made with other
    settings, then ``runs/<model>-<settings hash>``. A run is reused (or resumed) only where its settings match."""
    wanted = _run_settings(inputs, ctx.to_dict())
    keyed = plain.with_name(f"{plain.name}-{recipe_hash(wanted)[:10]}")
    free = None
    for candidate in (plain, keyed):
        saved = RunPaths(candidate).settings
        if not saved.is_file():
            free = free or candidate
            continue
        stored = read_json(saved)
        if _run_settings(stored.get("input") or {}, stored.get("context") or {}) == wanted:
            return candidate
        logger.info("bench: %s holds a run with other settings: not reused", candidate)
    if free is None:
        raise RunError(f"bench: {plain} and {keyed} hold runs with other settings: remove one or choose another --out")
    return free


def run_bench(
    models: list[str],
    *,
    dataset: str | None,
    out_dir: Path,
    ctx: Context,
    split: str | None = None,
    ratios: list[float] | None = None,
    model_options: dict[str, JsonValue] | None = None,
    on_update: UpdateHook | None = None,
) -> dict[str, Any]:
    """Bench every model; write bench.json, the tables (Markdown and CSV) and the plots into ``out_dir``."""
    from tools.reporting.bench_tables import write_bench_outputs

    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ops.set_threads(ctx.threads)
    rows: list[BenchRow] = []
    parts: dict[str, dict[str, int]] = {}
    for spec in models:
        logger.info("bench: %s", spec)
        bench = _ModelBench(spec, dataset=dataset, split=split, out_dir=out_dir, ctx=ctx)
        options = model_options if model_options and ":" in spec else None
        rows += bench.run(list(ratios or DEFAULT_RATIOS), options, on_update)
        parts[spec] = bench.data_parts
    result = {
        "dataset": dataset,
        # --eval-samples 0: each run's automatic size (data_parts has every model's)
        "eval_samples": ctx.eval_samples or max((p.get("evaluation", 0) for p in parts.values()), default=0),
        "calibration_samples": ctx.calibration_samples,
        "importance": ctx.importance,
        "recovery": ctx.recovery,
        "threads": torch.get_num_threads(),
        "latency": f"batch 1, median of {ctx.latency_repeats} interleaved repetitions after 3 warm-up runs",
        "models": {spec: [r.model_dump() for r in rows if r.model == spec] for spec in models},
        "data_parts": parts,  # rows of each disjoint part of the data, as in each agent run
    }
    write_bench_outputs(result, out_dir)
    return result


def _distilled_steps(report: RunReport) -> int:
    """Distillation steps the agent's kept round went through (0: none, or no round kept)."""
    kept = report.pruned.round if report.pruned is not None else None
    for record in report.rounds:
        if record.round == kept:
            return int(((record.prune_report or {}).get("finetune") or {}).get("steps") or 0)
    return 0
