"""NNCF settings on a model of a finished run: which keep OpenVINO int8 accurate, on two halves of the data.

    python benchmarks/nncf_variants.py RUN_DIR [--model ARTIFACT] --select HALF_A --report HALF_B [--out DIR]

The model (default: the run's best pruned round, ``report.json``'s ``pruned``) is converted to OpenVINO once and
quantized by ``nncf.quantize`` on the run's own calibration images (``runtimes_vs_original.calibration_images``) with
NNCF's defaults and with one setting changed at a time: the ``mixed`` preset (asymmetric activations), no fast bias
correction, no overflow fix, quantile activation ranges. Each variant's accuracy change against the run's original is
printed on every image of both halves: settings worth a default hold on both, a difference on one half alone is noise
(5,000 CIFAR-10 images resolve about ±0.5 points for int8's few changed answers). Beside it, the share of images whose
top-1 class int8 changed against the float model it was built from, on both halves together: a measure of int8's
damage with far less noise (it found NNCF's full bias correction, ``no fast bias correction``, changing 25-58 % fewer
answers on nine CIFAR CNNs, which the accuracy changes alone did not resolve).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from figure_common import UnseenData, fail, machine_line, read_run
from runtimes_vs_original import calibration_images

from tools.artifacts.io import load_compressed, load_original
from tools.deploy.openvino.convert import convert_openvino, save_openvino
from tools.deploy.openvino.model import OpenVinoModel
from tools.deploy.openvino.quantize import calibration_items


def variants() -> dict[str, dict[str, Any]]:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    return {
        "NNCF defaults": {},
        "mixed preset": {"preset": nncf.QuantizationPreset.MIXED},
        "no fast bias correction": {"fast_bias_correction": False},
        "no overflow fix": {"advanced_parameters": AdvancedQuantizationParameters(overflow_fix=OverflowFix.DISABLE)},
        "quantile activation ranges": {
            "advanced_parameters": AdvancedQuantizationParameters(
                activations_range_estimator_params=RangeEstimatorParametersSet.MEAN_QUANTILE
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--model", type=Path, help="a float artifact (default: the run's best pruned model)")
    parser.add_argument("--select", required=True, help="images to choose a setting on (the run's half)")
    parser.add_argument("--report", required=True, help="images no choice saw (the other half)")
    parser.add_argument("--out", type=Path, help="where the int8 models go (default: RUN_DIR/nncf-variants)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = read_run(args.run_dir)
    source = args.model or (
        Path(run.report.pruned.artifact) if run.report.pruned and run.report.pruned.artifact else None
    )
    if source is None:
        raise fail(f"{args.run_dir} has no pruned model: pass --model")
    out = args.out or args.run_dir / "nncf-variants"
    images, calibrated_on = calibration_images(run, args.select)
    model = load_compressed(source).eval()
    original = load_original(run.original).model.eval()
    halves = {"select": UnseenData(args.select, run), "report": UnseenData(args.report, run)}
    base = {h: data.predict(original) for h, data in halves.items()}

    def change(predictions: Any, half: str) -> float:
        return 100.0 * (sum(predictions.correct) - sum(base[half].correct)) / len(predictions.correct)

    print(machine_line(args.threads))
    print(f"{source}, calibrated on {calibrated_on}; points against the original on {args.select} / {args.report}")
    floats = {h: data.predict(model) for h, data in halves.items()}
    fp32 = {h: change(p, h) for h, p in floats.items()}
    print(f"  {'float model':28s} {fp32['select']:+.2f} / {fp32['report']:+.2f}")

    def changed(predictions: dict[str, Any]) -> float:
        pairs = [(a, b) for h, p in predictions.items() for a, b in zip(p.predicted, floats[h].predicted, strict=True)]
        return 100.0 * sum(a != b for a, b in pairs) / len(pairs)

    import nncf

    converted = convert_openvino(model, images[:1])
    for name, options in variants().items():
        start = time.perf_counter()
        quantized = nncf.quantize(
            converted, nncf.Dataset(calibration_items(images)), subset_size=len(images), **options
        )
        xml = save_openvino(quantized, out / name.replace(" ", "-") / "model.xml")
        int8 = OpenVinoModel(xml, threads=args.threads)
        predicted = {h: data.predict(int8) for h, data in halves.items()}
        got = {h: change(p, h) for h, p in predicted.items()}
        print(
            f"  {name:28s} {got['select']:+.2f} / {got['report']:+.2f}, {changed(predicted):.2f} % of answers changed "
            f"({time.perf_counter() - start:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
