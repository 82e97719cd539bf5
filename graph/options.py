"""The command line's options: one per setting of :class:`graph.context.Context`, and the ``run``/``demo``/... parser.

Each ``run`` option is a Context field of the same name (``--no-X`` switches a field off); :func:`run_context` builds
the run's settings from the parsed options.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

from pydantic import JsonValue

from graph.context import DISTILL_PRECISIONS, Context, Objective, Selection, parse_steps

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
        "--confirm-samples",
        "--holdout-samples",
        dest="confirm_samples",
        type=int,
        default=defaults.confirm_samples,
        help="images nothing chooses on: the shipped build is judged on them once and the budget holds there "
        "(-1: automatic, a quarter of the rows, at most 2,000; 0: none)",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=defaults.confidence,
        metavar="P",
        help="the confirmed interval's bound at level P holds the budget (default: the confirmed point estimate)",
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
    kinds = "unit kinds plans may use, comma-separated (structured, head, head_dim, block; default: all)"
    parser.add_argument("--unit-kinds", default=defaults.unit_kinds, metavar="KINDS", help=kinds)
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
    parser.add_argument("--objective", default=defaults.objective, choices=list(get_args(Objective)))
    parser.add_argument(
        "--allow-over-budget", action="store_true", help="with --deploy NAME: deploy it even over the accuracy budget"
    )
    parser.add_argument("--target-speedup", type=float, default=defaults.target_speedup, metavar="X")
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
        "--extra-images",
        default=defaults.extra_images,
        metavar="DIR",
        help="a folder of unlabelled images (e.g. your training images; class folders ignored) that distillation "
        "trains on: fit only, never choosing or confirming",
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


def factory_options(args: argparse.Namespace) -> dict[str, JsonValue] | None:
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
