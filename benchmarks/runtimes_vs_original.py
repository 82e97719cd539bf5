"""A run's deployed model against other runtimes' int8 of the original, and where its speed-up comes from.

    python benchmarks/runtimes_vs_original.py RUN_DIR [RUN_DIR ...] --data HALF_B [--calibration HALF_A] [--block 20]

For each finished run, in one process at batch 1 and ``--threads`` (default 1) threads:

- builds, from the run's saved original, ONNX Runtime's dynamic int8 and OpenVINO's int8 (NNCF, calibrated)
  of the original (the baselines of issue 10), its OpenVINO IR run with OpenVINO's default precision too (bf16 on
  CPUs with AMX-BF16 or AVX512-BF16: what a user gets there from OpenVINO without asking), and the original in the
  deployed runtime at FP32 and at the deployed precision (``tools.stages.ops.quantize``, into ``--out``; static int8 is
  calibrated on the run's own calibration images, taken from ``--calibration``, by default the run's dataset);
  the baselines are exported as the runtimes' own conversion exports a model (no export rewrite of the tool's,
  ``tools.deploy.export_form``), the original in the deployed runtime the way the tool deploys;
- times them with the original FP32 PyTorch model, the best pruned model and the deployed model, interleaved
  in a seeded random order after warm-up (``tools.evaluation.cost.compare_latencies``, medians); each call
  follows another model's, cache-cold among a dozen models, or with ``--block 20`` twenty calls of a model in a
  row (warm, as a service runs one model; the order of the blocks still interleaved);
- evaluates each on every image of ``--data`` (images the run never saw), paired with the original;
- splits the deployed model's speed-up over the original into runtime x precision x pruning
  (``tools.deploy.speedup.SpeedupFactors``): all four latencies come from the same timing run.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from figure_common import REPO, Predictions, RunInfo, UnseenData, fail, machine_line, pct, points, read_run

from tools import load_compressed
from tools.artifacts.io import load_original
from tools.deploy.config import QuantizationConfig
from tools.deploy.cpu import detect_cpu
from tools.deploy.export_form import plain_export
from tools.deploy.onnxruntime.session import OrtModel
from tools.deploy.registry import FLOAT, float_reference_of, runtime_and_precision
from tools.deploy.speedup import SpeedupFactors
from tools.evaluation.cost import compare_latencies
from tools.models.base import example_input
from tools.schemas import QuantizationRecommendation
from tools.stages import ops

DEFAULT_DATA = REPO / "runs" / "figures" / "halves" / "b"
DEFAULT_OUT = REPO / "runs" / "figures" / "runtimes-vs-original"
#: The runtimes' own builds of the original that the deployed model is compared with: what a user gets from each
#: runtime (FP32, its int8) without this tool.
BASELINES = {
    "onnxruntime-fp32": "ORT FP32 of the original",
    "onnxruntime": "ORT dynamic int8 of the original",
    "openvino": "OpenVINO FP32 of the original",
    "openvino-int8": "OpenVINO int8 of the original",
}
#: NNCF's int8 of the original with NNCF's defaults, one call (``nncf.quantize(model, dataset)``).
NNCF_DEFAULTS = "OpenVINO int8 (NNCF defaults) of the original"
#: The original's IR compiled with OpenVINO's own defaults (``core.compile_model(xml, "CPU")``, no precision hint):
#: bf16 on CPUs that compute it natively (AMX-BF16, AVX512-BF16), FP32 elsewhere.
OPENVINO_DEFAULT = "OpenVINO default precision of the original"
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
    """What the run calibrated static int8 on (``tools.stages.deployment.calibration_images``): its own calibration
    images (same dataset, sizes and seed; ``calibration`` overrides the dataset, e.g. when it was moved), or,
    for a run without data, the same seeded synthetic inputs."""
    ctx = run.context
    spec = ops.EvalSpec(
        dataset=calibration or run.dataset,
        samples=int(ctx.get("eval_samples", 500)) or ops.auto_eval_samples(run.report.profile.get("total_macs")),
        calibration_samples=int(ctx.get("calibration_samples", 256)),
        confirm_samples=int(ctx.get("confirm_samples", ctx.get("holdout_samples", 0))),
        seed=int(ctx.get("seed", 0)),
        progress=False,
    )
    return ops.calibration_images(run.original, run.shape, spec)


def plan_recommendations(run: RunInfo) -> list[QuantizationRecommendation]:
    return list(run.report.plan.quantization_recommendations) or ALL_LAYERS


ORIGINAL = "original (PyTorch FP32)"
PRUNED = "pruned (PyTorch FP32)"
RUNTIME_FP32 = "original, deployed runtime at FP32"
RUNTIME_ORIGINAL = "original, deployed runtime and precision"


def build_original(
    run: RunInfo,
    backend: str,
    recs: list[QuantizationRecommendation],
    out: Path,
    images: torch.Tensor,
    *,
    plain: bool = False,
) -> Path | str:
    """The original model in ``backend`` (built once into ``out``); the reason as a string when it cannot be.
    ``plain``: exported as the runtime's own conversion exports it (``tools.deploy.export_form.plain_export``), as a
    user gets it without this tool; otherwise the way the tool deploys (its export form)."""
    if backend == FLOAT:
        return run.original
    whole = [(r.layer, r.dtype) for r in recs] == [(r.layer, r.dtype) for r in ALL_LAYERS]
    target = out / ((backend if whole else f"{backend}-plan") + ("-plain" if plain else ""))
    config = QuantizationConfig(backend=backend)
    try:
        with plain_export() if plain else nullcontext():
            ops.quantize(run.original, run.original, recs, target, config, shape=run.shape, calibration=images)
    except Exception as exc:  # a runtime this machine lacks is reported, not fatal
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return target


def build_nncf_defaults(run: RunInfo, out: Path, images: torch.Tensor) -> Path | str:
    """The original through ``nncf.quantize(model, dataset)`` with NNCF's defaults (built once into ``out``), as a
    user gets OpenVINO int8 in one call: ``out/model.xml``; the reason as a string when it cannot be built."""
    target = out / "openvino-int8-nncf-defaults-plain"
    if (target / "model.xml").is_file():
        return target
    try:
        import nncf

        from tools.deploy.openvino.convert import convert_openvino, save_openvino
        from tools.deploy.openvino.quantize import calibration_items

        with plain_export():
            converted = convert_openvino(load_original(run.original).model.eval(), images[:1])
        quantized = nncf.quantize(converted, nncf.Dataset(calibration_items(images)), subset_size=len(images))
        save_openvino(quantized, target / "model.xml")
    except Exception as exc:
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
    wanted: list[tuple[str, str, list[QuantizationRecommendation], bool]] = [
        (RUNTIME_FP32, float_reference_of(deployed_backend), ALL_LAYERS, False),
        (RUNTIME_ORIGINAL, deployed_backend, plan_recommendations(run), False),
        *((label, backend, ALL_LAYERS, True) for backend, label in BASELINES.items()),
    ]
    missing: dict[str, str] = {}
    for label, backend, recs, plain in wanted:
        if label == RUNTIME_ORIGINAL and source.resolve() == run.original.resolve():
            models.append(Timed(label, deployed, backend))  # nothing was pruned: the deployed model is the original
            continue
        built = build_original(run, backend, recs, out, images, plain=plain)
        if isinstance(built, str):
            missing[label] = f"{backend}: {built}"
        else:
            models.append(Timed(label, built, backend))
    openvino_fp32 = next((m for m in models if m.label == BASELINES["openvino"]), None)
    if openvino_fp32 is not None:  # the same IR; its own key (the file, not the directory): timed apart
        default = "openvino-bf16" if detect_cpu().bf16 else "openvino"  # what OpenVINO picks on this CPU
        models.append(Timed(OPENVINO_DEFAULT, openvino_fp32.artifact / "model.xml", default))
    defaults = build_nncf_defaults(run, out, images)
    if isinstance(defaults, str):
        missing[NNCF_DEFAULTS] = f"nncf.quantize: {defaults}"
    else:
        models.append(Timed(NNCF_DEFAULTS, defaults, "openvino-int8"))
    return models, missing, deployed_backend


def load_timed(m: Timed) -> Any:
    """How each model runs: the tool's artifacts as saved; ONNX Runtime's int8 of the original as a user gets it (one
    session with the dynamic batch; the tool's own ONNX Runtime artifacts fix the batch per session, see
    ``tools.deploy.onnxruntime.session.OrtModel``); NNCF's defaults as an OpenVINO IR."""
    if m.label == BASELINES["onnxruntime"]:
        return OrtModel(m.artifact / "model.onnx", threads=torch.get_num_threads())
    from tools.deploy.openvino.model import OpenVinoModel

    if m.label == NNCF_DEFAULTS:
        return OpenVinoModel(m.artifact / "model.xml", threads=torch.get_num_threads())
    if m.label == OPENVINO_DEFAULT:  # f32 where this CPU, as the tool sees it, has no bf16: under
        # ONEDNN_MAX_CPU_ISA=AVX2 on an AMX CPU OpenVINO's own pick (bf16) has no kernels and cannot run
        precision = None if detect_cpu().bf16 else "f32"
        return OpenVinoModel(m.artifact, threads=torch.get_num_threads(), precision=precision)
    return load_compressed(m.artifact)


def linear_only_note(run: RunInfo) -> str:
    """For a model whose Linear layers do little of its work (a CNN): ONNX Runtime's dynamic int8 quantizes only
    those, and the tool itself does not build it (``tools.stages.not_built.MIN_LINEAR_SHARE``): said beside its row."""
    from torch import nn

    from tools.artifacts.io import load_module
    from tools.profiling.static import mac_shares
    from tools.stages.not_built import MIN_LINEAR_SHARE

    share = mac_shares(load_module(run.original), example_input(run.shape)).get(nn.Linear, 1.0)
    if share >= MIN_LINEAR_SHARE:
        return ""
    return (
        f"quantizes only Linear layers, {100 * share:.2g} % of this model's MACs: no faster than float, which the "
        "tool does not build for it (a user gets it in one command)"
    )


def alternatives(times: dict[str, float], key: dict[str, str], deployed_s: float) -> dict[str, Any]:
    """The deployed model against what a user gets from each runtime for the original: the faster FP32 runtime
    (ONNX Runtime, OpenVINO), ONNX Runtime's dynamic int8, OpenVINO's int8 (the faster of the tool's build and
    NNCF's defaults), OpenVINO with its default precision (bf16 where the CPU computes it), and the fastest of them
    all (ratios > 1: the deployed model is faster)."""

    def fastest(labels: list[str]) -> tuple[str, float] | None:
        found = [(label, times[key[label]]) for label in labels if label in key]
        return min(found, key=lambda item: item[1]) if found else None

    groups = {
        "fp32_runtime": [BASELINES["onnxruntime-fp32"], BASELINES["openvino"]],
        "ort_dynamic_int8": [BASELINES["onnxruntime"]],
        "openvino_int8": [BASELINES["openvino-int8"], NNCF_DEFAULTS],
        "openvino_default": [OPENVINO_DEFAULT],
        "any": [*BASELINES.values(), NNCF_DEFAULTS, OPENVINO_DEFAULT],
    }
    out: dict[str, Any] = {}
    for name, labels in groups.items():
        best = fastest(labels)
        if best is not None:
            out[name] = {"label": best[0], "latency_s": best[1], "deployed_speedup": best[1] / deployed_s}
    return out


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
    run: RunInfo,
    data_spec: str,
    calibration: str | None,
    out: Path,
    *,
    warmup: int,
    repeats: int,
    batch_size: int,
    batches: list[int],
    block: int = 1,
) -> dict[str, Any]:
    print(f"{run.run_dir} ({Path(str(run.report.model.get('spec', ''))).name})")
    images, calibrated_on = calibration_images(run, calibration)
    models, missing, backend = models_of(run, out / run.name, images)
    # one timing run: every distinct artifact once, interleaved (keys are resolved paths, so that two labels
    # naming the same artifact are one measurement and SpeedupFactors says so)
    key = {m.label: str(m.artifact.resolve()) for m in models}
    loaded = {key[m.label]: load_timed(m) for m in models}
    times = compare_latencies(loaded, example_input(run.shape, seed=0), warmup=warmup, repeats=repeats, block=block)
    batch_times = {
        batch: compare_latencies(
            loaded, example_input(run.shape, batch=batch, seed=0), warmup=2, repeats=max(10, repeats // 10)
        )
        for batch in batches
        if batch > 1
    }
    data = UnseenData(data_spec, run, batch_size=batch_size)
    predictions: dict[str, Predictions] = {path: data.predict(model) for path, model in loaded.items()}
    original = predictions[key[ORIGINAL]]
    deployed_s = times[key[deployed_label(backend)]]
    calls = f"{repeats} interleaved calls" if block == 1 else f"{repeats} interleaved blocks of {block} calls"
    print(f"  batch 1, {warmup} warm-up + {calls} each; accuracy on {data.samples} unseen images")
    print(f"  static int8 of the original calibrated on {calibrated_on}")
    extra = "".join(f" {f'b{b} ms':>9s} {'ratio':>6s}" for b in batch_times)
    print(f"  {'model':46s} {'runtime':38s} {'ms':>8s} {'deployed is':>12s}{extra}  accuracy, Δ vs original [95 %]")
    rows = []
    for m in models:
        seconds, result = times[key[m.label]], predictions[key[m.label]]
        paired = result.against(original)
        accuracy = pct(result.accuracy) + ("" if m.label == ORIGINAL else f"  Δ {points(paired)}")
        at_batch = {b: t[key[m.label]] for b, t in batch_times.items()}
        cells = "".join(
            f" {1e3 * t:9.2f} {t / batch_times[b][key[deployed_label(backend)]]:5.2f}x" for b, t in at_batch.items()
        )
        print(f"  {m.label:46s} {m.runtime:38s} {1e3 * seconds:8.3f} {seconds / deployed_s:11.2f}x{cells}  {accuracy}")
        rows.append(
            {"label": m.label, "backend": m.backend, "artifact": str(m.artifact), "latency_s": seconds}
            | {"latency_s_at_batch": at_batch, "accuracy": result.accuracy, "paired": paired.model_dump()}
        )
    versus = alternatives(times, key, deployed_s)
    for name, best in versus.items():
        ms, ratio = 1e3 * best["latency_s"], best["deployed_speedup"]
        print(f"  vs {name:17s}: {best['label']} {ms:.3f} ms -> deployed {ratio:.2f}x")
    for label, why in missing.items():
        print(f"  {label:42s} not built ({why})")
    pointless = linear_only_note(run)
    if pointless:
        print(f"  {BASELINES['onnxruntime']}: {pointless}")
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
        "alternatives": versus,
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
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="batch-1 calls of a model in a row per repetition (default 1: every call cache-cold among the models; "
        "20: warm, as a service runs one model)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="evaluation batch (the run's default, 32)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="timed batch sizes (1 always)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0 or args.batch_size < 1 or args.block < 1:
        raise fail("--threads, --repeats, --block and --batch-size must be >= 1 and --warmup >= 0")
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
            batches=args.batches,
            block=args.block,
        )
        for run_dir in args.run_dirs
    ]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
