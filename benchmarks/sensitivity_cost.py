"""Time the sensitivity profile of a run's original alone (its profile dir reused), and print what it measured.

    python benchmarks/sensitivity_cost.py RUN_DIR [--samples N] [--threads 1] [--out FILE]

RUN_DIR is a run made by ``profiling-agent`` (``models/original``, ``profile/profile.json``, ``settings.json``). The
profile is recomputed into a temporary copy of ``profile/``, so the run is not touched.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.figure_common import machine_line
from tools.stages import ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--samples", type=int, default=0, help="calibration images (0: automatic)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the profile's JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    settings = json.loads((args.run_dir / "settings.json").read_text())
    ctx, inp = settings["context"], settings["input"]
    original = args.run_dir / "models" / "original"
    shape = ops.resolve_input_shape(original)
    spec = ops.EvalSpec(
        dataset=inp["dataset"],
        split=inp.get("dataset_split"),
        calibration_samples=ctx["calibration_samples"],
        seed=ctx["seed"],
        batch_size=ctx["batch_size"],
        progress=False,
    )
    print(machine_line(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        for name in ("profile.json", "prunable.json"):
            if (args.run_dir / "profile" / name).is_file():
                shutil.copy(args.run_dir / "profile" / name, out_dir / name)
        start = time.perf_counter()
        result = ops.sensitivity(original, shape, out_dir, spec, samples=args.samples)
        wall = time.perf_counter() - start
    if result is None:
        raise SystemExit("no calibration images")
    print(f"{len(result.units)} units on {result.samples} images: {result.seconds:.1f} s profile, {wall:.1f} s in all")
    for unit in result.units:
        points = " ".join(f"{p.ratio:.1f}:{1 - p.agreement:.4f}" for p in unit.points)
        print(f"  {unit.kind:14s} {unit.pattern:50s} {points}")
    if args.out:
        args.out.write_text(json.dumps(result.model_dump(), indent=1))


if __name__ == "__main__":
    main()
