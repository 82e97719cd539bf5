"""A finished run's models on images the run never saw: accuracy paired with the original, 95 % interval.

    python benchmarks/unseen_half.py RUN_DIR [RUN_DIR ...] --data HALF_B [--rounds] [--json OUT.json]

For each run: the original, the best pruned model and the deployed model (``report.json``) are loaded from
their saved artifacts with ``tools.load_compressed`` and evaluated on every image of ``--data`` (the half of
the data the run was not given: ``benchmarks/split_halves.py``); each model's accuracy change against the
original is paired image by image (``tools.evaluation.paired``), with its 95 % interval and the share of
images on which both give the same class. ``--rounds`` adds every round's candidate model, beside the
in-run evaluation that selected it.

It also prints what the run itself measured and saved: parameters, the batch-1 latencies of the original and
the pruned model (timed interleaved in the run), the sensitivity profile's seconds, and the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from figure_common import REPO, Predictions, RunInfo, UnseenData, fail, machine_line, pct, points, read_run

from tools.schemas import ModelEntry, PairedAccuracy
from tools.stages import ops

DEFAULT_DATA = REPO / "runs" / "figures" / "halves" / "b"


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def in_run_lines(run: RunInfo) -> list[str]:
    """What the run measured itself, from report.json."""
    report, baseline, pruned = run.report, run.report.baseline, run.report.pruned
    if baseline is None:
        raise fail(f"{run.run_dir}/report.json has no baseline: the run did not get past its first evaluation")
    lines = []
    if pruned is not None and pruned.params:
        fewer = 1.0 - pruned.params / baseline.params
        lines.append(
            f"params {baseline.params:,} -> {pruned.params:,} ({100.0 * fewer:.1f} % fewer; "
            f"best of {len(report.rounds)} round(s): round {pruned.round})"
        )
        paired = f", pruned {points(pruned.paired)}" if pruned.paired else ""
        lines.append(
            f"in the run ({baseline.samples} evaluation images): original {pct(baseline.accuracy)}{paired}; "
            f"batch-1 latency {ms(baseline.latency_s)} -> {ms(pruned.latency_s)} "
            f"({pruned.latency_measured or 'timed alone'})"
        )
    sensitivity = report.profile.get("sensitivity") or {}
    if sensitivity.get("seconds") is not None:
        lines.append(f"sensitivity profile: {sensitivity['seconds']:.1f} s on {sensitivity.get('samples')} images")
    # each unit at its own lowest ratio probed (a unit whose step rounds differently has its own, e.g. 29 %)
    firsts = [
        min(probed, key=lambda p: float(p["ratio"]))
        for unit in sensitivity.get("units") or []
        if (probed := unit.get("points"))
    ]
    if firsts:
        ratios = sorted({float(p["ratio"]) for p in firsts})
        kept = [100.0 * float(p["agreement"]) for p in firsts]
        at = f"{ratios[0]:.0%}" if len(ratios) == 1 else f"its lowest ratio ({ratios[0]:.0%}-{ratios[-1]:.0%})"
        lines.append(
            f"  each of {len(firsts)} units pruned alone at {at} (recovered) keeps "
            f"{min(kept):.1f}-{max(kept):.1f} % agreement with the original on the calibration images"
        )
    return lines


def model_line(label: str, result: Predictions, original: Predictions) -> tuple[str, PairedAccuracy]:
    paired = result.against(original)
    line = f"{label:50s} {pct(result.accuracy):>8s}  Δ {points(paired)} pt  agreement {100.0 * paired.agreement:.1f} %"
    return line, paired


def deployed_label(entry: ModelEntry) -> str:
    extra = entry.model_extra or {}
    backend, precision = extra.get("backend"), extra.get("precision")
    return f"deployed ({backend}{', ' + str(precision) if precision else ''})"


def check_run(run: RunInfo, data_spec: str, batch_size: int, rounds: bool) -> dict[str, Any]:
    """Print and return one run's figures on the unseen images."""
    print(f"{run.run_dir} ({Path(str(run.report.model.get('spec', ''))).name}, trained on {run.dataset})")
    for line in in_run_lines(run):
        print(f"  {line}")
    data = UnseenData(data_spec, run, batch_size=batch_size)
    print(f"  unseen images: {data.samples} of {data_spec}")
    original = data.predict(run.original)
    print(f"  {'original':50s} {pct(original.accuracy):>8s}")
    result: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "data": data_spec,
        "samples": data.samples,
        "original_accuracy": original.accuracy,
    }
    seen: set[Path] = {run.original.resolve()}
    for key, entry in (("pruned", run.report.pruned), ("deployed", run.report.quantized)):
        if entry is None or not entry.artifact:
            continue
        path = Path(entry.artifact)
        if path.resolve() in seen:
            print(f"  {key:50s} the same artifact as above ({path})")
            continue
        seen.add(path.resolve())
        label = "pruned (best round)" if key == "pruned" else deployed_label(entry)
        line, paired = model_line(label, data.predict(path), original)
        print(f"  {line}")
        result[key] = {"artifact": str(path), "params": entry.params, "paired": paired.model_dump()}
    if rounds:
        result["rounds"] = []
        baseline_params = run.report.baseline.params if run.report.baseline else 0
        for done in run.report.rounds:
            path = Path(str(done.metrics.artifact))
            fewer = 1.0 - done.metrics.params / baseline_params if baseline_params else 0.0
            in_run = f"in run {points(done.metrics.paired)}" if done.metrics.paired else "in run n/a"
            budget = "within budget" if done.within_budget else "over budget"
            tuned = (done.prune_report or {}).get("finetune") or {}
            if tuned.get("seconds") is not None:
                budget += f", distillation {tuned['seconds']:.0f} s"
            line, paired = model_line(f"round {done.round} ({100.0 * fewer:.1f} % fewer)", data.predict(path), original)
            print(f"  {line}  ({in_run}, {budget})")
            result["rounds"].append(
                {"round": done.round, "params": done.metrics.params, "within_budget": done.within_budget}
                | {"paired": paired.model_dump()}
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="finished `profiling-agent run`s")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="images the runs never saw (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="evaluation batch (the run's default, 32)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--rounds", action="store_true", help="also every round's candidate model")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        raise fail(f"--batch-size must be >= 1, not {args.batch_size}")
    ops.set_threads(args.threads)
    if not Path(args.data).exists():
        raise fail(f"{args.data} not found: make the halves with benchmarks/split_halves.py, or pass --data")
    print(machine_line(torch.get_num_threads()))
    results = [check_run(read_run(run_dir), args.data, args.batch_size, args.rounds) for run_dir in args.run_dirs]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
