"""Which int8 settings hold accuracy on which CPU kind: the same int8 files, evaluated on this CPU (and emulated).

    python benchmarks/int8_settings.py build --model ../shared/models/cifar10-vit-tiny --out runs/int8-settings/vit
    python benchmarks/int8_settings.py eval runs/int8-settings/vit [--images 2000]
    qemu-x86_64 -cpu EPYC-Milan .venv/bin/python benchmarks/int8_settings.py eval runs/int8-settings/vit --images 1000

``build`` exports the original once and writes its int8 variants with the tool's own functions: ONNX Runtime static
int8 (QDQ, the tool's presets) with 8-bit and 7-bit (``reduce_range``) weights, ONNX Runtime dynamic int8 with 8-bit
and 7-bit weights, and OpenVINO int8 (NNCF, the tool's presets) with the overflow fix on no layer, the first layer
(NNCF's default) and every layer; calibration on the first 256 images of a seeded shuffle of the dataset, evaluation
on the next ones (stored preprocessed beside the files). Files are machine-independent. ``eval`` runs every variant
on this CPU and prints the top-1 agreement with the FP32 model and the accuracy change, with the CPU it ran on
(:func:`tools.deploy.cpu.detect_cpu`): run it natively, and under QEMU's user-mode emulator as a CPU of the other
kind (``-cpu EPYC-Milan``: AMD Zen 3, AVX2, no VNNI), whose ``cpuid`` the runtimes read.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from figure_common import fail

from tools.artifacts.io import load_original, save_original
from tools.compression.heads import has_attention
from tools.deploy.cpu import detect_cpu
from tools.deploy.onnxruntime.export import export_onnx, preprocess_onnx
from tools.deploy.onnxruntime.quantize import quantize_onnx, static_quantize_onnx
from tools.deploy.openvino.convert import convert_openvino, save_openvino
from tools.deploy.openvino.quantize import quantize_openvino
from tools.evaluation.datasets import load_eval_dataset
from tools.evaluation.labels import match_labels
from tools.models.sources import acquire_model
from tools.stages.ops import preprocess_of, resolve_input_shape

CALIBRATION = 256
FIXES = ("disable", "first_layer_only", "enable")


def build(model_spec: str, dataset: str, out: Path, images: int, seed: int, options: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    factory = None
    if options:  # a module:factory model, as `profiling-agent run --weights ... --labels ...` gives it
        from tools.models.specs import FactorySpec

        factory = FactorySpec.from_options(model_spec, **options).model_dump(mode="json", exclude={"factory"})
    original = save_original(acquire_model(model_spec, factory_options=factory), out / "original")
    loaded = load_original(original)
    shape = resolve_input_shape(original)
    data = load_eval_dataset(dataset, samples=None, seed=seed)
    match = match_labels(loaded.id2label, data.label_names)
    rows = [i for i, label in enumerate(data.labels) if label in match.mapping]
    random.Random(seed).shuffle(rows)
    rows = rows[: CALIBRATION + images]
    pixels = preprocess_of(original, shape)([data.images[i] for i in rows])
    targets = np.array([match.mapping[data.labels[i]] for i in rows])
    calibration, evaluation = pixels[:CALIBRATION], pixels[CALIBRATION:]
    np.save(out / "eval.npy", evaluation.numpy())
    np.save(out / "targets.npy", targets[CALIBRATION:])
    model = loaded.model.eval()
    fp32 = export_onnx(model, calibration[:1], out / "fp32.onnx")
    graph = preprocess_onnx(fp32, out / "preprocessed.onnx")
    for seven_bit in (False, True):
        name = f"{8 - seven_bit}bit"
        static_quantize_onnx(
            graph, out / f"ort-static-{name}.onnx", calibration, preprocess=False, reduce_range=seven_bit
        )
        quantize_onnx(graph, out / f"ort-dynamic-{name}.onnx", preprocess=False, reduce_range=seven_bit)
    converted = convert_openvino(model, calibration[:1])
    save_openvino(converted, out / "ov-fp32.xml")
    for fix in FIXES:
        quantized = quantize_openvino(converted, calibration, transformer=has_attention(model), overflow_fix=fix)  # type: ignore[arg-type]
        save_openvino(quantized, out / f"ov-int8-fix-{fix}.xml")
    print(f"built {out}: {len(list(out.glob('*.onnx'))) + len(list(out.glob('*.xml')))} files")


def _runner(path: Path):  # type: ignore[no-untyped-def]
    if path.suffix == ".onnx":
        from tools.deploy.onnxruntime.session import OrtModel

        return OrtModel(path, threads=torch.get_num_threads(), fixed_batch=True)
    from tools.deploy.openvino.model import OpenVinoModel

    return OpenVinoModel(path, threads=torch.get_num_threads())


def evaluate(out: Path, images: int) -> None:
    x = torch.from_numpy(np.load(out / "eval.npy"))[:images]
    y = np.load(out / "targets.npy")[:images]
    cpu = detect_cpu()
    print(f"{out} on {cpu.describe()}; {len(x)} images, {torch.get_num_threads()} thread(s)")

    def logits(path: Path) -> np.ndarray:
        model = _runner(path)
        return np.concatenate([model(x[i : i + 50]).numpy() for i in range(0, len(x), 50)])

    reference = logits(out / "fp32.onnx")
    base = float(np.mean(reference.argmax(1) == y))
    print(f"  {'FP32 (ONNX Runtime)':32s} accuracy {100 * base:6.2f} %")
    results = {}
    for path in sorted(out.glob("ort-*.onnx")) + sorted(out.glob("ov-*.xml")):
        got = logits(path)
        accuracy = float(np.mean(got.argmax(1) == y))
        agreement = float(np.mean(got.argmax(1) == reference.argmax(1)))
        results[path.stem] = {"accuracy": accuracy, "agreement": agreement}
        print(
            f"  {path.stem:32s} accuracy {100 * accuracy:6.2f} %  Δ {100 * (accuracy - base):+6.2f}  "
            f"agreement with FP32 {100 * agreement:6.2f} %"
        )
    (out / f"eval-{cpu.kind}.json").write_text(json.dumps({"cpu": cpu.model_dump(), "results": results}, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="export and write every int8 variant")
    make.add_argument("--model", required=True)
    make.add_argument("--dataset", default="../shared/data/cifar10-test")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--images", type=int, default=2000, help="evaluation images kept (after the calibration ones)")
    make.add_argument("--seed", type=int, default=0)
    for flag in ("weights", "labels", "image-size", "mean", "std"):
        make.add_argument(f"--{flag}", help="for a module:factory --model, as `profiling-agent run` takes it")
    run = sub.add_parser("eval", help="evaluate every variant on this CPU")
    run.add_argument("out", type=Path)
    run.add_argument("--images", type=int, default=2000)
    run.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "build":
        if not Path(args.dataset).exists():
            raise fail(f"{args.dataset} not found: pass --dataset (an image folder)")
        flags = ("weights", "labels", "image_size", "mean", "std")
        options = {name: getattr(args, name) for name in flags if getattr(args, name) is not None}
        build(args.model, args.dataset, args.out, args.images, args.seed, options)
    else:
        if not (args.out / "eval.npy").is_file():
            raise fail(f"{args.out} holds no build: run `build` first")
        torch.set_num_threads(args.threads)
        evaluate(args.out, args.images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
