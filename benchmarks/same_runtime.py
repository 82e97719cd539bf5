"""A run's builds of its kept model against its builds of the original, in one runtime: where the speed-up comes from
when the runtime is fixed.

    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/same_runtime.py RUN_DIR [RUN_DIR ...] --runtime openvino

For each finished run, the builds its deployment stage wrote (``models/deploy/<backend>`` for the kept model,
``models/deploy-original/<backend>`` for the original) of every backend of ``--runtime`` (default ``openvino``:
``openvino`` FP32 and ``openvino-int8``), loaded with ``tools.load_compressed`` as the tool runs them, timed at
batch 1 interleaved in one process (``tools.evaluation.cost.compare_latencies``, medians, ``--block`` calls of a
model in a row). The ratio is the kept build's speed over the original's in the same backend.

With oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA=AVX2``) OpenVINO's kernels compute as on a CPU without VNNI or AVX-512,
natively (``tools.deploy.cpu``), which ONNX Runtime's kernels ignore: ``--runtime openvino`` then compares what an
AVX2-only CPU runs. The machine line says whether the cap was set.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from figure_common import fail, machine_line, read_run

from tools import load_compressed
from tools.deploy.registry import BACKENDS
from tools.evaluation.cost import compare_latencies
from tools.models.base import example_input


def _builds(run: Path, runtime: str) -> dict[str, Path]:
    """name -> artifact folder of every build of ``runtime``'s backends the run's deployment wrote."""
    found = {}
    for backend, spec in BACKENDS.items():
        if spec.runtime != runtime:
            continue
        for who, folder in (("kept", "deploy"), ("original", "deploy-original")):
            path = run / "models" / folder / backend
            if (path / "artifact.json").is_file():
                found[f"{who} {backend}"] = path
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="finished `profiling-agent run`s")
    parser.add_argument("--runtime", default="openvino", help="the runtime whose builds are compared")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    runtimes = {spec.runtime for spec in BACKENDS.values()}
    if args.runtime not in runtimes:
        raise fail(f"--runtime {args.runtime}: choose one of {', '.join(sorted(runtimes))}")
    torch.set_num_threads(args.threads)
    print(machine_line(args.threads))
    figures: dict[str, dict[str, float]] = {}
    for run in args.run_dirs:
        builds = _builds(run, args.runtime)
        if not builds:
            raise fail(f"{run}: no {args.runtime} build in models/deploy or models/deploy-original: a finished run?")
        models = {name: load_compressed(path) for name, path in builds.items()}
        x = example_input(read_run(run).shape)
        seconds = compare_latencies(models, x, warmup=args.warmup, repeats=args.repeats, block=args.block)
        figures[str(run)] = {name: s * 1e3 for name, s in seconds.items()}
        print(run)
        for name in sorted(seconds):
            backend = name.split(" ", 1)[1]
            line = f"  {name:32s} {seconds[name] * 1e3:8.3f} ms"
            if name.startswith("kept") and f"original {backend}" in seconds:
                line += f"   {seconds[f'original {backend}'] / seconds[name]:.2f}x the original's"
            print(line)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(args.threads), "ms": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
