"""``profiling-agent``: run, demo, resume and status from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graph.options import DEMO_DATASET, DEMO_MODEL, build_parser, context_from, factory_options
from tools.schemas import Metrics, RoundResult
from tools.text import first_line

if TYPE_CHECKING:
    from graph.runner import RunResult
    from tools.schemas import RunReport

logger = logging.getLogger("profiling_agent")


#: The stage each node belongs to, as the progress line names it.
STAGES = {
    "acquire_model": "loading",
    "resolve_input_shape": "loading",
    "profile_model": "profiling",
    "evaluate_baseline": "profiling",
    "profile_int8": "profiling",
    "profile_sensitivity": "profiling",
    "analyze_profile": "planning",
    "review_plan": "planning",
    "prune_model": "pruning",
    "evaluate_model": "pruning",
    "iterate_pruning": "pruning",
    "distill_over_budget_round": "distilling",
    "select_best_model": "deploying",
}
#: Nodes whose time is one pruning round's.
ROUND_NODES = ("prune_model", "evaluate_model", "iterate_pruning")


class _Progress:
    """One line per finished node: its stage, its duration and, during the search, about how long the rounds
    still planned take at the pace of those done (distillation after the search and the deployment not counted)."""

    def __init__(self, rounds_planned: int | None = None) -> None:
        self.last = time.perf_counter()
        self.rounds_planned = rounds_planned
        self.rounds_done = 0
        self.round_seconds = 0.0

    def __call__(self, node: str, update: dict[str, object]) -> None:
        now = time.perf_counter()
        extra, seconds = "", now - self.last
        rounds = update.get("rounds")
        baseline = update.get("baseline")
        if node in ROUND_NODES:
            self.round_seconds += seconds
        if node in ("evaluate_model", "distill_over_budget_round") and isinstance(rounds, list) and rounds:
            r = RoundResult.model_validate(rounds[-1])
            m = r.metrics
            acc = "n/a" if m.accuracy is None else f"{100 * m.accuracy:.2f}%"
            rate = _rate(m, seconds) if node == "evaluate_model" else ""
            extra = f"  round {r.round}: accuracy {acc}, params {m.params / 1e6:.3f} M{rate}"
            extra += "" if r.within_budget else "  (over budget)"
            if r.cross_fit is not None:
                extra += f", distilled from round {r.cross_fit.source_round}"
            elif node == "evaluate_model":
                self.rounds_done += 1
                extra += self._left()
        elif node == "evaluate_baseline" and baseline is not None:
            extra = "  original" + _rate(Metrics.model_validate(baseline), seconds)
        stage = STAGES.get(node, "deploying" if node != "write_report" else "reporting")
        print(f"  done {node:<26} {seconds:6.1f}s  [{stage}]{extra}", file=sys.stderr, flush=True)
        self.last = now

    def _left(self) -> str:
        """``; about 40 s of rounds left`` while the search has planned rounds to go."""
        if not self.rounds_planned or self.rounds_done >= self.rounds_planned:
            return ""
        pace = self.round_seconds / self.rounds_done
        return f"; about {pace * (self.rounds_planned - self.rounds_done):.0f} s of rounds left"


def _rate(metrics: Metrics, seconds: float) -> str:
    """``, 4,744 images, 327 img/s``: the images an evaluation stage judged and its rate (latency timing included)."""
    samples = metrics.samples
    return f", {samples:,} images, {samples / seconds:.0f} img/s" if samples and seconds > 0 else ""


def _summary(report: RunReport | dict[str, Any]) -> str:
    from tools.reporting.format import accuracy_pct, millions, millis, named_entries
    from tools.reporting.paired_text import agreement, change_ci, confirmed_text, split_text
    from tools.schemas import RunReport

    report = RunReport.model_validate(report)
    rows = [("model", "accuracy", "Δacc pts [95% CI]", "agreement", "params (M)", "latency (ms)", "memory (MB)")]
    for key, _, m in named_entries(report):
        params, latency = millions(m.params, unit=""), millis(m.latency_s, unit="")
        change = "" if key == "baseline" else change_ci(m.accuracy_drop_points, m.paired)
        agree = "" if key == "baseline" else agreement(m.paired)
        rows.append((key, accuracy_pct(m.accuracy), change, agree, params, latency, f"{m.memory_mb:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    split = split_text(report.dataset)
    chosen = "; the best round was chosen on the choose images" if report.rounds else ""
    lines += [f"data: {split}{chosen}"] if split else []
    confirmed = confirmed_text(report)
    return "\n".join(lines + ([confirmed] if confirmed else []))


def _finish(result: RunResult) -> None:
    if result.report is None:
        pending = result.pending or {}
        print(
            f"paused for approval of the {pending.get('stage', 'analysis')} plan (round {pending.get('round', 0)}, "
            f"from {pending.get('source')}):"
        )
        print(json.dumps(pending.get("plan"), indent=2))
        run_dir = shlex.quote(result.run_dir)
        print(f"continue with: profiling-agent resume --run-dir {run_dir} --approve | --plan FILE | --reject")
        if pending.get("errors"):
            raise ValueError(f"the edited plan was not accepted (the run is still paused): {pending['errors'][0]}")
        return
    from tools.profiling.static import is_count_note
    from tools.schemas import RunReport
    from tools.stats import is_budget_note

    report, run_dir = RunReport.model_validate(result.report), result.run_dir
    # what the data resolves and what the counts leave out, before the figures
    first = [f"budget: {n}" for n in report.notes if is_budget_note(n)]
    first += [f"note: {n}" for n in report.notes if is_count_note(n)]
    rest = [f"note: {n}" for n in report.notes if not (is_budget_note(n) or is_count_note(n))]
    print("\n".join([*first, _summary(report), *rest]))
    print(f"report: {Path(run_dir) / 'report.json'} and report.md")


def _refuse_if_held(run_dir: str) -> None:
    """Fail at once, before the slow imports, when another process holds the run dir (the runner locks it)."""
    from tools.store.lock import refuse_if_held, status_hint

    refuse_if_held(run_dir, status_hint(Path(run_dir).resolve()))


def _cmd_run(args: argparse.Namespace) -> None:
    _refuse_if_held(args.run_dir)
    from graph.runner import start_run

    ctx = context_from(args, args.run_dir)
    if ctx.quantize:
        from tools.deploy.cpu import detect_cpu, resolve_target

        target = resolve_target(ctx.int8_cpu)
        print(f"cpu: {detect_cpu().describe()}; int8 built for {target} CPUs", file=sys.stderr, flush=True)
    result = start_run(
        args.model,
        dataset=args.dataset,
        split=args.split,
        ctx=ctx,
        thread_id=args.thread_id,
        on_update=_Progress(ctx.iterations + 1),
        model_options=factory_options(args),
    )
    _finish(result)


def _cmd_demo(args: argparse.Namespace) -> None:
    from graph.runner import load_settings, start_run
    from tools.store.lock import LOCK_FILE, run_dir_lock

    run_dir = Path(args.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run dir: pass another --run-dir")
    try:
        with run_dir_lock(run_dir):  # held from before the previous demo is cleared until the new one stops
            leftovers = [path for path in run_dir.iterdir() if path.name != LOCK_FILE]
            if leftovers:
                try:
                    command = load_settings(run_dir).get("command")
                except ValueError:
                    command = None
                if command != "demo":
                    raise ValueError(f"{run_dir} exists and is not a demo run dir: pass another --run-dir")
                for path in leftovers:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
            ctx = context_from(args, str(run_dir))
            extra = {"command": "demo"}
            result = start_run(
                DEMO_MODEL, dataset=DEMO_DATASET, ctx=ctx, on_update=_Progress(ctx.iterations + 1), extra=extra
            )
    except BaseException:
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if empty: a demo that saved nothing leaves no directory behind
        raise
    _finish(result)


def _cmd_compare_llms(args: argparse.Namespace) -> None:
    from graph.runner import compare_llms
    from tools.store.lock import run_dir_lock

    args.planner = "llm"
    with run_dir_lock(Path(args.out)):
        result = compare_llms(
            args.model,
            dataset=args.dataset,
            split=args.split,
            llms=args.llms,
            out_dir=Path(args.out),
            ctx=context_from(args, args.out),
            on_update=_Progress(args.iterations + 1),
        )
    from tools.reporting.report import render_llm_comparison

    print(render_llm_comparison(result))
    print(f"table: {Path(args.out) / 'compare.md'}")


def _cmd_bench(args: argparse.Namespace) -> None:
    from graph.bench import run_bench
    from tools.models.specs import is_factory_spec

    try:
        ratios = [float(r) for r in args.ratios.split(",") if r.strip()]
    except ValueError:
        raise ValueError(f"--ratios must be comma-separated numbers, not {args.ratios!r}") from None
    if not ratios or not all(0 < r < 1 for r in ratios):
        raise ValueError("--ratios must be numbers in (0, 1), e.g. 0.01,0.1,0.2")
    factories = [m for m in args.models if is_factory_spec(m)]
    options = None
    if factories:
        args.model = factories[0]
        options = factory_options(args)
    from tools.store.lock import run_dir_lock

    with run_dir_lock(Path(args.out)):
        result = run_bench(
            args.models,
            dataset=args.dataset,
            split=args.split,
            out_dir=Path(args.out),
            ctx=context_from(args, ""),
            ratios=ratios,
            model_options=options,
            on_update=_Progress(),
        )
    out = Path(args.out)
    for name in ("table1", "table3", "table4"):
        print((out / f"{name}.md").read_text())
    print(f"bench: {out / 'bench.json'}, tables, CSV and plots in {out} ({len(result['models'])} model(s))")


def _cmd_resume(args: argparse.Namespace) -> None:
    _refuse_if_held(args.run_dir)
    from graph.runner import resume_run

    answer: dict[str, Any] | None = None
    if args.approve:
        answer = {"action": "approve"}
    elif args.reject:
        answer = {"action": "reject"}
    elif args.plan is not None:
        try:
            plan = json.loads(args.plan.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read the plan file {args.plan}: {exc}") from exc
        answer = {"action": "edit", "plan": plan.get("plan", plan) if isinstance(plan, dict) else plan}
    _finish(resume_run(Path(args.run_dir), thread_id=args.thread_id, on_update=_Progress(), answer=answer))


def _cmd_status(args: argparse.Namespace) -> None:
    from graph.runner import run_status

    print(json.dumps(run_status(Path(args.run_dir), thread_id=args.thread_id), indent=2))


def _cmd_predict(args: argparse.Namespace) -> None:
    from tools.stages.predict import predict

    for result in predict(Path(args.artifact), [Path(p) for p in args.images], args.top_k):
        print(result.image + ": " + ", ".join(f"{label} {100 * p:.1f}%" for label, p in result.top))


COMMANDS = {
    "run": _cmd_run,
    "demo": _cmd_demo,
    "compare-llms": _cmd_compare_llms,
    "bench": _cmd_bench,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "predict": _cmd_predict,
}


def _naming_the_dataset(exc: Exception, message: str, args: argparse.Namespace) -> str:
    """A dataset error that does not name its dataset (``no label column ...``) gets ``dataset SPEC:`` in front."""
    from tools.evaluation.sources import DatasetError

    dataset = getattr(args, "dataset", None)
    if isinstance(exc, DatasetError) and dataset and dataset not in message:
        return f"dataset {dataset}: {message}"
    return message


def _after_interrupt(args: argparse.Namespace) -> str:
    """What to do after Ctrl-C: the real resume command, rerunning a bench, or starting again."""
    from tools.store.run_paths import RunPaths

    if args.command in ("bench", "compare-llms"):
        return f"run the same command again to continue (its finished runs in {args.out} are reused)"
    run_dir = getattr(args, "run_dir", None)
    if args.command not in ("run", "demo", "resume") or not run_dir:
        return "stopped"
    if not RunPaths(run_dir).settings.is_file():
        return "stopped before anything was saved: start the run again"
    from graph.runner import resume_command

    return f"continue with {resume_command(Path(run_dir).resolve())}"


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.debug:
        _quiet_libraries()
    if not args.verbose:
        for name in ("huggingface_hub", "transformers", "datasets", "httpx"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"interrupted: {_after_interrupt(args)}", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        message = _naming_the_dataset(exc, first_line(exc), args)
        if not isinstance(exc, ValueError | OSError):  # not a known bad input: say where to look
            message = f"{type(exc).__name__}: {message} (rerun with --debug for the traceback)"
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
