"""The command line's options: one per setting of :class:`agents.context.Context`, and the ``run``/``demo``/... parser.

Each ``run`` option is a Context field of the same name (``--no-X`` switches a field off); :func:`context_from` builds
the run's settings from the parsed options.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from agents.context import Context, Option

DEMO_MODEL = "digits-vit"
DEMO_DATASET = "digits"


def _add_run_options(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
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
    _add_setting_options(parser)


#: Settings that are not options of their own: the run directory is each command's (``run``: required).
NOT_OPTIONS = ("run_dir",)


def setting_flags(name: str) -> tuple[str, ...]:
    """The flags of the setting ``name``: its own (``Option.flags``), else ``--name-with-dashes``; a setting on by
    default (as declared: an environment variable changes the default, not the flag) is switched off by
    ``--no-name``."""
    f = next(f for f in fields(Context) if f.name == name)
    dashed = name.replace("_", "-")
    if f.metadata["kind"] is bool and f.metadata["default"]:
        return (f"--no-{dashed}",)
    option: Option = f.metadata["option"]
    return option.flags or (f"--{dashed}",)


def _add_setting_options(parser: argparse.ArgumentParser) -> None:
    """One option per setting of :class:`Context` (but :data:`NOT_OPTIONS`), from its field: flags, type, default
    (the environment's where set), choices and help all come from there, so a new setting is a new option."""
    defaults = Context()
    for f in fields(Context):
        if f.name in NOT_OPTIONS:
            continue
        option: Option = f.metadata["option"]
        text = f.metadata["description"].replace("%", "%%")
        text += f" One or more of: {', '.join(option.items())}." if option.items else ""
        value = getattr(defaults, f.name)
        if f.metadata["kind"] is bool:
            action = "store_false" if f.metadata["default"] else "store_true"
            text = f"switch off: {text}" if f.metadata["default"] else text
            parser.add_argument(*setting_flags(f.name), dest=f.name, action=action, default=value, help=text)
            continue
        parser.add_argument(
            *setting_flags(f.name),
            dest=f.name,
            type=f.metadata["kind"],
            default=value,
            metavar=option.metavar,
            choices=list(option.choices()) if option.choices else None,
            help=text,
        )


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


def context_from(args: argparse.Namespace, run_dir: str) -> Context:
    """The run's settings from the parsed options (each Context field's option has its name as ``dest``)."""
    given = vars(args)
    values: dict[str, Any] = {"run_dir": run_dir}
    values |= {f.name: given[f.name] for f in fields(Context) if f.name in given and f.name not in NOT_OPTIONS}
    return Context(**values)
