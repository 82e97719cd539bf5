"""A finished run's rounds judged again as tries: the round the run kept, and the one each budget test over several
tries keeps, from the answers the run saved.

    python benchmarks/rejudge_rounds.py RUN_DIR [RUN_DIR ...]

For each run (``report.json``): every round's drop and standard error on the run's evaluation images, and the
standard errors it is held to as one of the rounds by Bonferroni, by the step-down alone (Romano and Wolf) and by
the two-step test the run uses now (``tools.evaluation.simultaneous``: each round's slack over the budget taken off
its error), with the round each keeps (``agents.planning.selection.kept_round``). Nothing is evaluated again: the
figures are the run's own, on its evaluation images (a validation set: judge the kept rounds on images the run did
not see with ``unseen_half.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from figure_common import fail, machine_line

from agents.evaluation import round_files
from agents.planning.selection import kept_round, passes_as_one_of
from tools.evaluation.paired import predictions_path
from tools.evaluation.simultaneous import budget_zs
from tools.schemas import RunReport
from tools.stats import selection_z, standard_error_points
from tools.store.files import read_json


def rejudge(run_dir: Path) -> list[str]:
    report_file = run_dir / "report.json"
    if not report_file.is_file():
        raise fail(f"{report_file} is missing: the run has not finished (or RUN_DIR is not a run directory)")
    report = RunReport.model_validate(read_json(report_file))
    context = dict(read_json(run_dir / "settings.json").get("context") or {})
    selection, objective = context.get("selection", "accuracy"), context.get("objective", "params")
    if report.accuracy_budget is None:
        raise fail(f"{report_file} has no accuracy budget: the run stopped before its int8 profile")
    budget = float(report.accuracy_budget.pruning_points)
    rounds = [r for r in report.rounds if r.metrics.paired is not None]
    original = predictions_path(run_dir / "models" / "original", "evaluation")
    files = [round_files(r) for r in rounds]

    def passes(i: int, z: float) -> bool:
        return passes_as_one_of(rounds[i], budget, z)

    tests = {
        "Bonferroni": [round(selection_z(len(rounds)), 3)] * len(rounds),
        "step-down": budget_zs(original, files, passes),
        "two-step": budget_zs(original, files, passes, budgets=[budget] * len(rounds)),
    }
    params = rounds[0].metrics.params if rounds else 0
    baseline_params = report.baseline.params if report.baseline is not None else params
    lines = [f"{run_dir}: {len(rounds)} rounds, pruning budget {budget:.2f} points"]
    lines.append("round  fewer params  drop   se    alone  " + "  ".join(f"{name:>10}" for name in tests))
    for i, r in enumerate(rounds):
        assert r.metrics.paired is not None
        fewer = 100.0 * (1.0 - r.metrics.params / baseline_params) if baseline_params else 0.0
        marks = "  ".join(f"{tests[name][i]:>6.2f} {'ok' if passes(i, tests[name][i]) else '--'}" for name in tests)
        lines.append(
            f"{r.round:>5}  {fewer:>11.1f} %  {-r.metrics.paired.delta_points:+.2f}  "
            f"{standard_error_points(r.metrics.paired):.2f}  {'yes' if r.within_budget else 'no ':>5}  {marks}"
        )
    for name, zs in tests.items():
        kept, _ = kept_round(
            rounds, selection, budget, objective, zs={r.round: z for r, z in zip(rounds, zs, strict=True)}
        )
        fewer = 100.0 * (1.0 - kept.metrics.params / baseline_params) if kept is not None and baseline_params else 0.0
        lines.append(f"{name}: keeps round {kept.round if kept else None} ({fewer:.1f} % fewer parameters)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print(machine_line("the run's"))
    for run_dir in args.runs:
        print("\n".join(rejudge(run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
