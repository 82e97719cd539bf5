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
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from graph.context import DISTILL_PRECISIONS, Context, Selection, parse_steps
from tools.text import first_line

if TYPE_CHECKING:
    from graph.runner import RunResult
    from tools.schemas import RunReport

logger = logging.getLogger("profiling_agent")

DEMO_MODEL = "digits-vit"
DEMO_DATASET = "digits"


def _add_run_options(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    defaults = Context()
    if not demo:
        parser.add_argument(
            "--model",
            required=True,
            help="Hugging Face id, save_pretrained dir, or vit-b16 / deit-b16 / swin-b / resnet-101",
        )
        _add_factory_options(parser)
        parser.add_argument("--dataset", help="hub id, image folder, save_to_disk dir, or 'digits'")
        parser.add_argument("--split", help="dataset split (default: test, validation, val, train)")
        parser.add_argument("--run-dir", required=True, help="directory for checkpoints, models and reports")
        parser.add_argument("--thread-id", help="checkpoint thread id (default: random)")
    parser.add_argument("--iterations", type=int, default=defaults.iterations, help="iterative pruning rounds T")
    parser.add_argument(
        "--eval-samples", type=int, default=defaults.eval_samples, help="images rounds are judged on (seeded)"
    )
    parser.add_argument(
        "--calibration-samples",
        type=int,
        default=defaults.calibration_samples,
        help="images for importance, sensitivity and recovery, disjoint from the evaluation images (default 256)",
    )
    parser.add_argument(
        "--holdout-samples",
        type=int,
        default=defaults.holdout_samples,
        help="re-evaluate the chosen model on this many images used by neither calibration nor selection",
    )
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch CPU threads (0: default)")
    parser.add_argument("--device", default=defaults.device, choices=["cpu", "cuda", "auto"])
    parser.add_argument(
        "--planner",
        default=defaults.planner,
        choices=_choices("agents.planning.registry", "planner_names"),
        help="rules: offline (default); llm: an OpenAI-compatible chat model writes the plans",
    )
    _add_llm_options(parser, defaults)
    parser.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=defaults.max_accuracy_drop,
        help="accuracy budget in points (default 1.0)",
    )
    budget = "at most PCT %% of answers changed against the original: needs no labels, bounds the accuracy drop"
    parser.add_argument("--max-disagreement", type=float, default=defaults.max_disagreement, metavar="PCT", help=budget)
    parser.add_argument("--selection", default=defaults.selection, choices=list(get_args(Selection)))
    parser.add_argument(
        "--importance", default=defaults.importance, choices=_choices("tools.compression.importance", "IMPORTANCE")
    )
    parser.add_argument(
        "--round-to",
        type=int,
        default=defaults.round_to,
        help="round kept channel counts to a multiple of this (0: off; default 8, fastest in ONNX Runtime and "
        "OpenVINO)",
    )
    parser.add_argument(
        "--head-round-to",
        type=int,
        default=defaults.head_round_to,
        help="round narrowed head widths to a multiple of this (0: off; default 8, fastest in ONNX Runtime "
        "and OpenVINO)",
    )
    parser.add_argument("--max-pruning-ratio", type=float, default=defaults.max_pruning_ratio)
    parser.add_argument(
        "--recovery",
        default=defaults.recovery,
        choices=_choices("tools.compression.recovery", "RECOVERY_METHODS"),
        help="after every prune: reconstruct (least-squares refit of the next layer + BatchNorm statistics, "
        "default), bn (BatchNorm statistics only) or none",
    )
    parser.add_argument(
        "--no-sensitivity", action="store_true", help="skip the per-unit sensitivity profile (planning is blinder)"
    )
    parser.add_argument(
        "--sensitivity-samples",
        type=int,
        default=defaults.sensitivity_samples,
        help="calibration images the sensitivity profile probes with (0: automatic, about two minutes in all)",
    )
    parser.add_argument(
        "--finetune-steps",
        type=parse_steps,
        default=defaults.finetune_steps,
        help="distillation steps against the original after each prune: N, 0 (off, the default) or auto (~150 s a "
        "round at a measured rate, 300-1,000 steps; off where 300 take over 600 s or under 1,024 images are left)",
    )
    parser.add_argument(
        "--finetune-samples",
        type=int,
        default=defaults.finetune_samples,
        help="unlabelled images for distillation, calibration ones included (default: the calibration images, "
        "up to 4,096 with --finetune-steps auto)",
    )
    parser.add_argument(
        "--distill-rescues",
        type=parse_steps,
        default=defaults.distill_rescues,
        help="distillations after the search of rounds over the budget, judged cross-fitted on halves of the "
        "evaluation images (with --finetune-steps 0): N, 0 or auto (default: about 20 min at most, at most 5)",
    )
    parser.add_argument(
        "--distill-precision",
        choices=DISTILL_PRECISIONS,
        default=defaults.distill_precision,
        help="precision of distillation's forward passes: auto (bf16 where the CPU computes it natively, "
        "AMX-BF16 or AVX512-BF16; else fp32), fp32 or bf16",
    )
    parser.add_argument(
        "--approve-plan",
        action="store_true",
        help="pause after analysis to approve, edit or reject the plan (then: resume)",
    )
    parser.add_argument("--approve-rounds", action="store_true", help="with --approve-plan: also before every round")
    parser.add_argument("--no-prune", action="store_true", help="skip pruning")
    parser.add_argument("--no-iterate", action="store_true", help="skip the iterative rounds")
    parser.add_argument("--no-quantize", action="store_true", help="skip quantization")
    parser.add_argument(
        "--deploy",
        "--quant-backend",
        dest="quant_backend",
        default=defaults.quant_backend,
        choices=_choices("tools.deploy.registry", "DEPLOY_CHOICES"),
        help="auto (default): build the best model with every runtime and precision available (PyTorch, ONNX "
        "Runtime, OpenVINO; float, dynamic and static int8), evaluate and time them side by side, deploy the "
        "fastest within the accuracy budget (never slower than the original FP32 model); torch: the float "
        "model; or one backend by name",
    )
    parser.add_argument(
        "--int8-cpu",
        default=defaults.int8_cpu,
        choices=_choices("tools.deploy.cpu", "INT8_TARGETS"),
        help="the CPU kind int8 models are built for: auto (default: this machine's, detected), vnni (AVX512-VNNI, "
        "AVX-VNNI, AMX: full 8-bit weights), no-vnni (AVX2 or AVX-512 without VNNI: 7-bit weights and NNCF's "
        "overflow fix, which hold accuracy on every x86 CPU)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _choices(module: str, name: str) -> list[str]:
    """The names a registry (``module.name``: a mapping, a sequence, or a function returning one) offers."""
    import importlib

    found = getattr(importlib.import_module(module), name)
    return list(found() if callable(found) else found)


FACTORY_FLAGS = ("weights", "labels", "image_size", "mean", "std", "channels", "crop")


def _add_factory_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plain PyTorch models (--model module.path:factory)")
    group.add_argument("--weights", help="state dict file: safetensors, or torch (read with weights_only=True)")
    group.add_argument("--labels", help="class names in output order: 'a,b,c' or a file with one per line")
    group.add_argument("--image-size", help="input size: 224 or HxW, e.g. 32x48 (default: from the model, else 224)")
    group.add_argument("--mean", help="per-channel mean after scaling to [0,1]: 0.5 or 0.485,0.456,0.406")
    group.add_argument("--std", help="per-channel std: 0.5 or 0.229,0.224,0.225")
    group.add_argument(
        "--channels", type=int, choices=[1, 3], help="1: greyscale, 3: RGB (default: from --mean, else the model)"
    )
    group.add_argument(
        "--crop",
        help="center crop: images resized, aspect kept, to the size / CROP, the size cut from the center (0.875: "
        "224 of 256); default: a timm model's crop_pct, 0.875 for torchvision.models, else the whole image resized",
    )


def factory_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """Parsed ``FactorySpec`` fields (but ``factory``) for a module:factory --model; None for other models."""
    from tools.models.base import ModelLoadError
    from tools.models.specs import FactorySpec, is_factory_spec

    given = {name: getattr(args, name, None) for name in FACTORY_FLAGS}
    if not is_factory_spec(args.model):
        used = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
        if used:
            raise ModelLoadError(f"{', '.join(used)}: only for --model module.path:factory, not {args.model!r}")
        return None
    spec = FactorySpec.from_options(args.model, **given)
    return spec.model_dump(mode="json", exclude={"factory"})


def _add_llm_options(parser: argparse.ArgumentParser, defaults: Context) -> None:
    parser.add_argument("--llm-model", default=defaults.llm_model, help="chat model (default gpt-4o-mini)")
    parser.add_argument(
        "--llm-base-url",
        default=defaults.llm_base_url,
        help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vLLM, Ollama, llama.cpp)",
    )
    parser.add_argument("--llm-timeout", type=float, default=defaults.llm_timeout, help="seconds per LLM request")
    parser.add_argument(
        "--llm-max-attempts",
        type=int,
        default=defaults.llm_max_attempts,
        help="attempts per plan before falling back to the rules planner",
    )
    parser.add_argument(
        "--llm-context-tokens",
        type=int,
        default=defaults.llm_context_tokens,
        help="tokens an LLM prompt is kept within; longer prompts are summarised (default 6000, for 8k models)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profiling-agent",
        description="Profiling-guided structured pruning and dynamic quantization of image classifiers.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_options(sub.add_parser("run", help="compress a model"))
    demo = sub.add_parser("demo", help="offline demo on the bundled digits ViT")
    demo.add_argument("--run-dir", default="runs/demo")
    _add_run_options(demo, demo=True)
    compare = sub.add_parser("compare-llms", help="iterative pruning planned by each LLM, side by side")
    compare.add_argument("--model", required=True)
    compare.add_argument("--dataset")
    compare.add_argument("--split")
    compare.add_argument("--out", required=True, help="directory for one run per LLM and compare.{json,md}")
    compare.add_argument("--llm", action="append", required=True, dest="llms", help="a chat model; repeat")
    _add_run_options(compare, demo=True)
    bench = sub.add_parser("bench", help="the agent vs uniform pruning and ONNX Runtime: the paper's tables")
    bench.add_argument("--model", action="append", required=True, dest="models", help="a model; repeat")
    _add_factory_options(bench)
    bench.add_argument("--dataset")
    bench.add_argument("--split")
    bench.add_argument("--out", required=True, help="directory for bench.json, tables, plots and the runs")
    bench.add_argument("--ratios", default="0.01,0.1,0.2", help="uniform pruning ratios (default 0.01,0.1,0.2)")
    _add_run_options(bench, demo=True)
    # the benchmark measures deployment against ONNX Runtime: deploy the agent's models the same way by default
    bench.set_defaults(quant_backend="auto")
    resume = sub.add_parser("resume", help="continue an interrupted run")
    resume.add_argument("--run-dir", required=True)
    resume.add_argument("--thread-id")
    decision = resume.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve the plan the run is paused on")
    decision.add_argument("--plan", type=Path, help="replace that plan with this JSON file (same schema)")
    decision.add_argument("--reject", action="store_true", help="reject it: no pruning with this plan")
    predict = sub.add_parser("predict", help="top-k labels of image files with a saved model, on its own runtime")
    predict.add_argument("--artifact", required=True, help="a model directory, e.g. RUN/models/quantized")
    predict.add_argument("images", nargs="+", help="image files")
    predict.add_argument("--top-k", type=int, default=5)
    status = sub.add_parser("status", help="where a run stands")
    status.add_argument("--run-dir", required=True)
    status.add_argument("--thread-id")
    return parser


#: Context fields set by a ``--no-X`` switch (the field is True unless the switch is given).
_SWITCHED_OFF = {
    "sensitivity": "no_sensitivity",
    "prune": "no_prune",
    "iterate": "no_iterate",
    "quantize": "no_quantize",
    "progress": "no_progress",
}


def _context(args: argparse.Namespace, run_dir: str) -> Context:
    """The run's settings from the parsed options: each Context field from the option of its name, or from its
    ``--no-X`` switch; fields without an option keep their defaults (or environment variables)."""
    given = vars(args)
    values: dict[str, Any] = {"run_dir": run_dir}
    for f in fields(Context):
        if f.name in _SWITCHED_OFF:
            values[f.name] = not given[_SWITCHED_OFF[f.name]]
        elif f.name in given and f.name != "run_dir":
            values[f.name] = given[f.name]
    return Context(**values)


class _Progress:
    """One line per finished node, with its duration."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def __call__(self, node: str, update: dict[str, Any]) -> None:
        now = time.perf_counter()
        extra, seconds = "", now - self.last
        if node == "evaluate_model" and update.get("rounds"):
            r = update["rounds"][-1]
            m = r["metrics"]
            acc = "n/a" if m.get("accuracy") is None else f"{100 * m['accuracy']:.2f}%"
            extra = f"  round {r['round']}: accuracy {acc}, params {m['params'] / 1e6:.3f} M{_rate(m, seconds)}"
            extra += "" if r["within_budget"] else "  (over budget)"
        elif node == "evaluate_baseline" and update.get("baseline"):
            extra = "  original" + _rate(update["baseline"], seconds)
        print(f"  done {node:<20} {seconds:6.1f}s{extra}", file=sys.stderr, flush=True)
        self.last = now


def _rate(metrics: dict[str, Any], seconds: float) -> str:
    """``, 4,744 images, 327 img/s``: the images an evaluation stage judged and its rate (latency timing included)."""
    samples = int(metrics.get("samples") or 0)
    return f", {samples:,} images, {samples / seconds:.0f} img/s" if samples and seconds > 0 else ""


def _summary(report: RunReport | dict[str, Any]) -> str:
    from tools.reporting.format import accuracy_pct, millions, millis, named_entries
    from tools.reporting.paired_text import agreement, change_ci, holdout_text, split_text
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
    chosen = "; the best round was chosen on the evaluation images" if report.rounds else ""
    lines += [f"data: {split}{chosen}"] if split else []
    holdout = holdout_text(report)
    return "\n".join(lines + ([holdout] if holdout else []))


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
    from tools.schemas import RunReport
    from tools.stats import is_budget_note

    report, run_dir = RunReport.model_validate(result.report), result.run_dir
    first = [f"budget: {n}" for n in report.notes if is_budget_note(n)]  # what the data resolves, before the figures
    print("\n".join([*first, _summary(report), *(f"note: {n}" for n in report.notes if not is_budget_note(n))]))
    print(f"report: {Path(run_dir) / 'report.json'} and report.md")


def _refuse_if_held(run_dir: str) -> None:
    """Fail at once, before the slow imports, when another process holds the run dir (the runner locks it)."""
    from tools.store.lock import refuse_if_held, status_hint

    refuse_if_held(run_dir, status_hint(Path(run_dir).resolve()))


def _cmd_run(args: argparse.Namespace) -> None:
    _refuse_if_held(args.run_dir)
    from graph.runner import start_run

    ctx = _context(args, args.run_dir)
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
        on_update=_Progress(),
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
                    previous = load_settings(run_dir)
                except ValueError:
                    previous = {}
                if previous.get("command") != "demo":
                    raise ValueError(f"{run_dir} exists and is not a demo run dir: pass another --run-dir")
                for path in leftovers:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
            ctx = _context(args, str(run_dir))
            extra = {"command": "demo"}
            result = start_run(DEMO_MODEL, dataset=DEMO_DATASET, ctx=ctx, on_update=_Progress(), extra=extra)
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
            ctx=_context(args, args.out),
            on_update=_Progress(),
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
            ctx=_context(args, ""),
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
    from tools.predict import predict

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
