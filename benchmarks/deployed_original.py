"""A run without pruning (``--no-prune``, e.g. ViT-B/16 or ResNet-101 with random weights): its deployed original
against what each runtime gives for the same original. Latency and memory only.

    python benchmarks/deployed_original.py RUN_DIR [--threads 1] [--repeats 40]

In one process at batch 1: the original FP32 PyTorch model, the run's deployed model, ONNX Runtime FP32 and
dynamic int8 (one session with the dynamic batch, as ONNX Runtime runs it by default), OpenVINO FP32, OpenVINO int8
(the tool's NNCF build), OpenVINO with its default precision (bf16 on CPUs with AMX-BF16 or AVX512-BF16) and
OpenVINO int8 with NNCF's defaults (``nncf.quantize(model, dataset)``), int8 calibrated
on 32 seeded synthetic inputs (what the run itself calibrates on without data), timed interleaved after warm-up;
memory is the size of each model as saved for deployment. The first line names the CPU (VNNI or not).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from figure_common import RunInfo, machine_line, read_run
from runtimes_vs_original import NNCF_DEFAULTS, OPENVINO_DEFAULT, build_nncf_defaults

from tools import load_compressed
from tools.artifacts.io import deployed_files
from tools.deploy.config import QuantizationConfig
from tools.deploy.export_form import plain_export
from tools.deploy.onnxruntime.session import OrtModel
from tools.evaluation.cost import compare_latencies, file_size_mb
from tools.models.base import example_input
from tools.schemas import InputShape, QuantizationRecommendation
from tools.stages import ops

ALL_LAYERS = [QuantizationRecommendation(layer="all", dtype="qint8")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("runs/figures/deployed-original"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = json.loads((args.run_dir / "report.json").read_text())
    original, deployed = Path(report["baseline"]["artifact"]), Path(report["quantized"]["artifact"])
    shape = InputShape.model_validate(report["model"]["input_shape"])
    calibration = torch.randn((32, *shape.as_tuple()), generator=torch.Generator().manual_seed(0))
    out = args.out / args.run_dir.name
    builds = {
        "onnxruntime-fp32": "ORT FP32 of the original",
        "onnxruntime": "ORT dynamic int8 of the original",
        "openvino": "OpenVINO FP32 of the original",
        "openvino-int8": "OpenVINO int8 of the original",
    }
    for backend in builds:  # as the runtimes' own conversion exports the model (no export rewrite of the tool's)
        config = QuantizationConfig(backend=backend)
        with plain_export():
            ops.quantize(original, original, ALL_LAYERS, out / backend, config, shape=shape, calibration=calibration)
    label = f"deployed ({report['quantized'].get('backend')})"
    paths = {"original (PyTorch FP32)": original, label: deployed}
    paths |= {name: out / backend for backend, name in builds.items()}
    models = {name: load_compressed(path) for name, path in paths.items()}
    models[builds["onnxruntime"]] = OrtModel(out / "onnxruntime" / "model.onnx", threads=args.threads)
    from tools.deploy.openvino.model import OpenVinoModel

    # the same IR with OpenVINO's own default precision (bf16 on CPUs with AMX-BF16 or AVX512-BF16)
    default_xml = out / "openvino" / "model.xml"
    models[OPENVINO_DEFAULT] = OpenVinoModel(default_xml, threads=args.threads, precision=None)
    paths[OPENVINO_DEFAULT] = out / "openvino"
    run: RunInfo = read_run(args.run_dir)
    defaults = build_nncf_defaults(run, out, calibration)
    if not isinstance(defaults, str):
        models[NNCF_DEFAULTS] = OpenVinoModel(defaults / "model.xml", threads=args.threads)
    times = compare_latencies(models, example_input(shape), warmup=3, repeats=args.repeats)
    base_mb = sum(file_size_mb(f) for f in deployed_files(original))
    print(machine_line(args.threads))
    print(f"{args.run_dir}: batch 1, {args.threads} thread(s), {args.repeats} interleaved calls each")
    if not isinstance(defaults, str):
        paths[NNCF_DEFAULTS] = defaults
    for name, path in paths.items():
        files = deployed_files(path) if (path / "artifact.json").is_file() else [path / "model.xml", path / "model.bin"]
        mb = sum(file_size_mb(f) for f in files)
        print(
            f"  {name:36s} {1e3 * times[name]:8.1f} ms  {mb:7.1f} MB ({100 * (1 - mb / base_mb):+.1f} % less)  "
            f"deployed is {times[name] / times[label]:.2f}x faster than this"
        )


if __name__ == "__main__":
    main()
