"""A run's best pruned model against its original: latency at several batch sizes and thread counts.

    python benchmarks/pruned_latency.py RUN_DIR [RUN_DIR ...] [--threads 1 2] [--batches 1 32]

Both float models are loaded from the run's saved artifacts (``tools.load_compressed``) and timed in PyTorch,
interleaved in a seeded random order after warm-up (``tools.evaluation.cost.compare_latencies``, medians),
for every combination of ``--threads`` and ``--batches``: pruning's own speed-up, without any runtime or
precision change (``benchmarks/runtimes_vs_original.py`` measures those).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from figure_common import fail, machine_line, read_run

from tools import load_compressed
from tools.evaluation.cost import compare_latencies
from tools.models.base import example_input
from tools.stages import ops


def time_run(run_dir: Path, threads: list[int], batches: list[int], repeats: int, batch_repeats: int) -> list[Any]:
    run = read_run(run_dir)
    if run.report.pruned is None or not run.report.pruned.artifact:
        raise fail(f"{run_dir}: the run kept no pruned model")
    rows = []
    for count in threads:
        ops.set_threads(count)
        models = {
            "original": load_compressed(run.original),
            "pruned": load_compressed(Path(run.report.pruned.artifact)),
        }
        for batch in batches:
            times = compare_latencies(
                models,
                example_input(run.shape, batch=batch, seed=0),
                warmup=5,
                repeats=repeats if batch == 1 else batch_repeats,
            )
            speedup = times["original"] / times["pruned"]
            print(
                f"{run.name:10s} threads {count} batch {batch:3d}: original {1e3 * times['original']:8.3f} ms, "
                f"pruned {1e3 * times['pruned']:8.3f} ms, speed-up {speedup:.2f}x",
                flush=True,
            )
            rows.append({"run_dir": str(run_dir), "threads": count, "batch": batch, **times, "speedup": speedup})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="finished `profiling-agent run`s")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (default 1 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes (default 1 32)")
    parser.add_argument("--repeats", type=int, default=100, help="interleaved calls of each model at batch 1")
    parser.add_argument("--batch-repeats", type=int, default=20, help="interleaved calls at the larger batches")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if min(args.threads) < 1 or min(args.batches) < 1 or args.repeats < 1 or args.batch_repeats < 1:
        raise fail("--threads, --batches, --repeats and --batch-repeats must all be >= 1")
    print(machine_line(" and ".join(str(count) for count in args.threads)))
    rows = []
    for run_dir in args.run_dirs:
        rows += time_run(run_dir, args.threads, args.batches, args.repeats, args.batch_repeats)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
