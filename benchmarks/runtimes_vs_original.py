"""A run's deployed model against other runtimes' int8 of the original, and where its speed-up comes from.

    python benchmarks/runtimes_vs_original.py RUN_DIR [RUN_DIR ...] --data HALF_B [--calibration HALF_A]

For each finished run, in one process at batch 1 and ``--threads`` (default 1) threads:

- builds, from the run's saved original, ONNX Runtime's dynamic int8 and OpenVINO's int8 (NNCF, calibrated)
  of the original (the baselines of issue 10), and the original in the deployed runtime at FP32 and at the
  deployed precision (``tools.ops.quantize``, into ``--out``; static int8 is calibrated on the run's own
  calibration images, taken from ``--calibration``, by default the run's dataset);
- times them with the original FP32 PyTorch model, the best pruned model and the deployed model, interleaved
  in a seeded random order after warm-up (``tools.evaluation.cost.compare_latencies``, medians);
- evaluates each on every image of ``--data`` (images the run never saw), paired with the original;
- splits the deployed model's speed-up over the original into runtime x precision x pruning
  (``tools.deploy.speedup.SpeedupFactors``): all four latencies come from the same timing run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from figure_common import REPO, Predictions, RunInfo, UnseenData, fail, machine_line, pct, points, read_run

from tools import deployment, load_compressed, ops
from tools.deploy.config import QuantizationConfig
from tools.deploy.onnxruntime.session import OrtModel
from tools.deploy.registry import FLOAT, float_reference_of, runtime_and_precision
from tools.deploy.speedup import SpeedupFactors
from tools.evaluation.cost import compare_latencies
from tools.models.base import example_input
from tools.schemas import QuantizationRecommendation

DEFAULT_DATA = REPO / "runs" / "figures" / "halves" / "b"
DEFAULT_OUT = REPO / "runs" / "figures" / "runtimes-vs-original"
#: The runtimes' own int8 of the original that the deployed model is compared with (issue 10's baselines).
BASELINES = {"onnxruntime": "ORT dynamic int8 of the original", "openvino-int8": "OpenVINO int8 of the original"}
#: Every nn.Linear / MatMul / Gemm to int8: what each runtime's quantizer does to a whole model.
ALL_LAYERS = [QuantizationRecommendation(layer="all", dtype="qint8")]


@dataclass(frozen=True)
class Timed:
    """One model in the comparison: its artifact and how it runs."""

    label: str
    artifact: Path
    backend: str

    @property
    def runtime(self) -> str:
        runtime, precision = runtime_and_precision(self.backend)
        return f"{runtime} {precision}"


def calibration_images(run: RunInfo, calibration: str | None) -> tuple[torch.Tensor, str]:
    """What the run calibrated static int8 on (``tools.deployment.calibration_images``): its own calibration
    images (same dataset, sizes and seed; ``calibration`` overrides the dataset, e.g. when it was moved), or,
    for a run without data, the same seeded synthetic inputs."""
    ctx = run.context
    spec = ops.EvalSpec(
        dataset=calibration or run.dataset,
        samples=int(ctx.get("eval_samples", 500))
        or ops.auto_eval_samples(
            run.report.profile.get("total_macs"),
            other_parts=bool(ctx.get("holdout_samples") or ctx.get("finetune_samples")),
        ),
        calibration_samples=int(ctx.get("calibration_samples", 256)),
        holdout_samples=int(ctx.get("holdout_samples", 0)),
        seed=int(ctx.get("seed", 0)),
        progress=False,
    )
    return deployment.calibration_images(run.original, run.shape, spec)


def plan_recommendations(run: RunInfo) -> list[QuantizationRecommendation]:
    return list(run.report.plan.quantization_recommendations) or ALL_LAYERS


ORIGINAL = "original (PyTorch FP32)"
PRUNED = "pruned (PyTorch FP32)"
RUNTIME_FP32 = "original, deployed runtime at FP32"
RUNTIME_ORIGINAL = "original, deployed runtime and precision"


def build_original(
    run: RunInfo, backend: str, recs: list[QuantizationRecommendation], out: Path, images: torch.Tensor
) -> Path | str:
    """The original model in ``backend`` (built once into ``out``); the reason as a string when it cannot be."""
    if backend == FLOAT:
        return run.original
    whole = [(r.layer, r.dtype) for r in recs] == [(r.layer, r.dtype) for r in ALL_LAYERS]
    target = out / (backend if whole else f"{backend}-plan")
    config = QuantizationConfig(backend=backend)
    try:
        ops.quantize(run.original, run.original, recs, target, config, shape=run.shape, calibration=images)
    except Exception as exc:  # a runtime this machine lacks is reported, not fatal
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return target


def models_of(run: RunInfo, out: Path, images: torch.Tensor) -> tuple[list[Timed], dict[str, str], str]:
    """The models to time (label, artifact, backend), what could not be built, and the deployed backend."""
    report = run.report
    if report.pruned is None or report.quantized is None or not report.quantized.artifact:
        raise fail(f"{run.run_dir}: the run has no deployed model (run it without --no-prune / --no-quantize)")
    deployed_backend = str((report.quantized.model_extra or {}).get("backend") or FLOAT)
    deployed = Path(report.quantized.artifact)
    source = Path(str((report.quantized.model_extra or {}).get("source") or report.pruned.artifact))
    models = [
        Timed(ORIGINAL, run.original, FLOAT),
        Timed(PRUNED, Path(str(report.pruned.artifact)), FLOAT),
        Timed(deployed_label(deployed_backend), deployed, deployed_backend),
    ]
    wanted: list[tuple[str, str, list[QuantizationRecommendation]]] = [
        (RUNTIME_FP32, float_reference_of(deployed_backend), ALL_LAYERS),
        (RUNTIME_ORIGINAL, deployed_backend, plan_recommendations(run)),
        *((label, backend, ALL_LAYERS) for backend, label in BASELINES.items()),
    ]
    missing: dict[str, str] = {}
    for label, backend, recs in wanted:
        if label == RUNTIME_ORIGINAL and source.resolve() == run.original.resolve():
            models.append(Timed(label, deployed, backend))  # nothing was pruned: the deployed model is the original
            continue
        built = build_original(run, backend, recs, out, images)
        if isinstance(built, str):
            missing[label] = f"{backend}: {built}"
        else:
            models.append(Timed(label, built, backend))
    return models, missing, deployed_backend


def deployed_label(backend: str) -> str:
    return f"deployed ({backend})"


def speedup_of(backend: str, times: dict[str, float], key: dict[str, str]) -> SpeedupFactors | None:
    """Runtime x precision x pruning from the one timing run (None when a reference could not be built)."""
    steps = (ORIGINAL, RUNTIME_FP32, RUNTIME_ORIGINAL, deployed_label(backend))
    if not all(step in key for step in steps):
        return None
    original, runtime_fp32, runtime_original, deployed = (key[step] for step in steps)
    return SpeedupFactors.measure(
        backend,
        times,
        original=original,
        runtime_fp32=runtime_fp32,
        runtime_original=runtime_original,
        deployed=deployed,
    )


def compare_run(
    run: RunInfo, data_spec: str, calibration: str | None, out: Path, *, warmup: int, repeats: int, batch_size: int
) -> dict[str, Any]:
    print(f"{run.run_dir} ({Path(str(run.report.model.get('spec', ''))).name})")
    images, calibrated_on = calibration_images(run, calibration)
    models, missing, backend = models_of(run, out / run.name, images)
    # one timing run: every distinct artifact once, interleaved (keys are resolved paths, so that two labels
    # naming the same artifact are one measurement and SpeedupFactors says so)
    key = {m.label: str(m.artifact.resolve()) for m in models}
    loaded = {path: load_compressed(Path(path)) for path in dict.fromkeys(key.values())}
    # ONNX Runtime's int8 of the original runs as a user gets it: one session with the dynamic batch (the tool's
    # own ONNX Runtime artifacts fix the batch per session, see tools.deploy.onnxruntime.session.OrtModel)
    for m in models:
        if m.label == BASELINES["onnxruntime"]:
            loaded[key[m.label]] = OrtModel(m.artifact / "model.onnx", threads=torch.get_num_threads())
    times = compare_latencies(loaded, example_input(run.shape, seed=0), warmup=warmup, repeats=repeats)
    data = UnseenData(data_spec, run, batch_size=batch_size)
    predictions: dict[str, Predictions] = {path: data.predict(model) for path, model in loaded.items()}
    original = predictions[key[ORIGINAL]]
    deployed_s = times[key[deployed_label(backend)]]
    print(f"  batch 1, {warmup} warm-up + {repeats} interleaved calls each; accuracy on {data.samples} unseen images")
    print(f"  static int8 of the original calibrated on {calibrated_on}")
    print(f"  {'model':42s} {'runtime':38s} {'ms':>8s} {'deployed is':>12s}  accuracy, Δ vs original [95 %]")
    rows = []
    for m in models:
        seconds, result = times[key[m.label]], predictions[key[m.label]]
        paired = result.against(original)
        accuracy = pct(result.accuracy) + ("" if m.label == ORIGINAL else f"  Δ {points(paired)}")
        print(f"  {m.label:42s} {m.runtime:38s} {1e3 * seconds:8.3f} {seconds / deployed_s:11.2f}x  {accuracy}")
        rows.append(
            {"label": m.label, "backend": m.backend, "artifact": str(m.artifact), "latency_s": seconds}
            | {"accuracy": result.accuracy, "paired": paired.model_dump()}
        )
    for label, why in missing.items():
        print(f"  {label:42s} not built ({why})")
    factors = speedup_of(backend, times, key)
    if factors is not None:
        print("  the deployed model's speed-up over the original FP32 PyTorch model:")
        for line in factors.lines():
            print(f"    {line}")
    return {
        "run_dir": str(run.run_dir),
        "deployed_backend": backend,
        "models": rows,
        "not_built": missing,
        "speedup": None if factors is None else factors.model_dump(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="finished `profiling-agent run`s")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="images the runs never saw (default: %(default)s)")
    parser.add_argument("--calibration", help="the data the run was given (default: the run's --dataset)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the original's builds go (reused)")
    parser.add_argument("--threads", type=int, default=1, help="torch, ONNX Runtime and OpenVINO threads")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=300, help="interleaved timed calls of each model")
    parser.add_argument("--batch-size", type=int, default=32, help="evaluation batch (the run's default, 32)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0 or args.batch_size < 1:
        raise fail("--threads, --repeats and --batch-size must be >= 1 and --warmup >= 0")
    ops.set_threads(args.threads)  # before any session opens: ONNX Runtime and OpenVINO take torch's count
    if not Path(args.data).exists():
        raise fail(f"{args.data} not found: make the halves with benchmarks/split_halves.py, or pass --data")
    print(machine_line(torch.get_num_threads()))
    results = [
        compare_run(
            read_run(run_dir),
            args.data,
            args.calibration,
            args.out,
            warmup=args.warmup,
            repeats=args.repeats,
            batch_size=args.batch_size,
        )
        for run_dir in args.run_dirs
    ]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
