"""Distillation made cheap for a 260-px ImageNet CNN: only the last stage trained, from cached features.

EfficientNet-Lite2's distillation is off in a run (its fewest steps are estimated at about 3,400 s at one core's
planned rate; measured here, a full step of 32 images at 260 px takes 6-8 s in bf16). Its largest units sit in its
last stage, at 9 x 9: this script removes two of that stage's blocks (``--plan blocks``, 18 % fewer parameters) or
halves its expanded channels (``--plan expand``), caches the original's input to ``_blocks.16`` and its logits and
pooled features for ``--views`` views of every training image (the first as it is, the others flipped and shifted as
distillation augments), and distils only what follows (``_blocks.16`` on, the head and the classifier), about 0.4 s
a step. Each variant is judged on images it never saw (``--data``): accuracy change against the original and the
share of answers kept, before and after. The measurement behind README's "distillation at that size" line::

    python benchmarks/split_halves.py --source ../shared/data/imagenet-sample-500 --out runs/inet --by-class
    python benchmarks/suffix_distill.py runs/lite2 --train runs/inet/a --data runs/inet/b --steps 300 --lr 1e-3

``RUN`` is a finished run of the Lite2 factory (README's ImageNet example): its original model, preprocessing and
class names are used, nothing else. The suffix is written for ``efficientnet_lite_pytorch.EfficientNet`` (its
``extract_features`` and ``forward`` in order).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from figure_common import machine_line, read_run, top1
from torch import nn

from tools import load_compressed
from tools.compression.distill import DISTILL_TEMPERATURE, _lr_factor, augment_batch, distill_loss
from tools.compression.pruning import apply_pruning
from tools.compression.recipes import PruningConfig
from tools.evaluation.datasets import load_eval_dataset
from tools.schemas import PruningRecommendation
from tools.stages import ops
from tools.stats import paired_accuracy

FIRST = 16  #: the first block of the suffix: blocks before it are untouched by both plans
PLANS = {
    "blocks": [
        PruningRecommendation(layer=rf"^_blocks\.{i}$", pruning_type="block", pruning_ratio=1.0) for i in (17, 19)
    ],
    "expand": [
        PruningRecommendation(layer=rf"^_blocks\.{i}\._expand_conv$", pruning_type="structured", pruning_ratio=0.5)
        for i in (16, 17, 18, 19)
    ],
}


def suffix(model: nn.Module, features: torch.Tensor, pooled: bool = False) -> torch.Tensor:
    """What EfficientNet-Lite computes from the input of ``_blocks[FIRST]`` on: logits, or the pooled features."""
    x = features
    for block in list(model._blocks)[FIRST:]:  # type: ignore[union-attr, arg-type]
        x = block(x, drop_connect_rate=None)
    x = model._swish(model._bn1(model._conv_head(x)))
    x = F.adaptive_avg_pool2d(x, 1).flatten(1)
    return x if pooled else model._fc(model._dropout(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished run of EfficientNet-Lite2 (its model and preprocessing)")
    parser.add_argument("--train", required=True, help="labelled folder the students learn from")
    parser.add_argument("--data", required=True, help="labelled folder they are judged on (not seen)")
    parser.add_argument("--plan", choices=sorted(PLANS), default="blocks")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--views", type=int, default=4, help="views of each training image (1: as it is)")
    parser.add_argument(
        "--loss",
        choices=("logits", "features"),
        default="logits",
        help="features: MSE of the pooled features, classifier frozen",
    )
    parser.add_argument("--train-only", choices=("all", "batchnorm"), default="all")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    ops.set_threads(args.threads)
    print(machine_line(args.threads))
    run = read_run(args.run)
    preprocess = run.preprocess()
    names = {name: i for i, name in enumerate(run.settings["input"]["model_options"]["labels"])}

    def images(spec: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = load_eval_dataset(spec, samples=None, seed=0)
        labels = [names.get(data.label_names[label], -1) for label in data.labels]
        return preprocess(list(data.images)), torch.tensor(labels)

    train, _ = images(args.train)
    unseen, labels = images(args.data)
    original = load_compressed(run.original).eval()
    original_top1 = top1(original, unseen)

    def judged(what: str, model: nn.Module) -> None:
        predicted = top1(model, unseen)
        right, right_before = (predicted == labels).tolist(), (original_top1 == labels).tolist()
        paired = paired_accuracy(right_before, right, original_top1.tolist(), predicted.tolist())
        half_width = (paired.ci95_high_points - paired.ci95_low_points) / 2
        print(
            f"{what}: unseen Δ {paired.delta_points:+.2f} ± {half_width:.2f} points, "
            f"agreement {100 * paired.agreement:.1f} % ({paired.samples} images)",
            flush=True,
        )

    student = copy.deepcopy(original)
    apply_pruning(student, PLANS[args.plan], train[:1], PruningConfig(importance="l2"))
    fewer = 1 - sum(p.numel() for p in student.parameters()) / sum(p.numel() for p in original.parameters())
    print(f"plan {args.plan}: {100 * fewer:.1f} % fewer parameters")
    judged("training-free", student)

    generator = torch.Generator().manual_seed(0)
    inputs: list[torch.Tensor] = []
    pooled: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []
    hooks = [
        original._blocks[FIRST].register_forward_pre_hook(  # type: ignore[index]
            lambda _m, a: inputs.append(a[0].detach().clone())
        ),
        original._fc.register_forward_pre_hook(lambda _m, a: pooled.append(a[0].detach().clone())),
    ]
    start = time.perf_counter()
    with torch.no_grad():
        for view in range(args.views):
            batch = train if view == 0 else augment_batch(train, generator)
            logits.extend(original(batch[i : i + 50]) for i in range(0, len(batch), 50))
    for hook in hooks:
        hook.remove()
    features, teacher, teacher_pooled = torch.cat(inputs), torch.cat(logits), torch.cat(pooled)
    print(f"cached {len(features)} views ({features.numel() * 4 / 1e6:.0f} MB) in {time.perf_counter() - start:.0f} s")

    suffix_modules = [*list(student._blocks)[FIRST:], student._conv_head, student._bn1]  # type: ignore[union-attr]
    if args.loss == "logits":
        suffix_modules.append(student._fc)  # type: ignore[arg-type]
    if args.train_only == "batchnorm":
        suffix_modules = [m for s in suffix_modules for m in s.modules() if isinstance(m, nn.BatchNorm2d)]
    trainable = [p for module in suffix_modules for p in module.parameters()]
    student.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, args.steps))
    order = torch.empty(0, dtype=torch.long)
    start = time.perf_counter()
    for _ in range(args.steps):
        if len(order) < 32:
            order = torch.cat([order, torch.randperm(len(features), generator=generator)])
        index, order = order[:32], order[32:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = suffix(student, features[index], pooled=args.loss == "features").float()
        if args.loss == "logits":
            loss = distill_loss(out, teacher[index], DISTILL_TEMPERATURE)
        else:
            target = teacher_pooled[index]
            loss = F.mse_loss(out, target) / target.pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
    took = time.perf_counter() - start
    judged(
        f"distilled ({args.loss}, {args.train_only}, {args.steps} steps at lr {args.lr:g}, {args.views} view(s), "
        f"{took:.0f} s)",
        student,
    )


if __name__ == "__main__":
    main()
