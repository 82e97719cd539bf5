"""What the distillation rate does to a pruned model's accuracy and to its agreement with the original.

One prune of a CIFAR ResNet (every block-internal convolution of stages 2 and 3 at one ratio, ``act`` importance,
rounded to 8, least-squares recovery on 256 calibration images), then 300 distillation steps of 32 images on the
calibration images plus 1,424 more of the same half, at each learning rate given, each from the same repaired
model. Every variant is evaluated on every image of the other half (images neither pruning nor distillation saw):
the change of top-1 accuracy against the original (points, 95 % interval of the paired difference) and the share
of images whose top-1 class is the original's. The agreement is what the run's paired test pays for: every answer
that changes widens it. It is the measurement behind ``AUTO_DISTILL_LR`` (``tools/compression/distill.py``)::

    python benchmarks/split_halves.py --source ../shared/data/cifar10-test --out runs/figures/halves
    python benchmarks/distill_rates.py --depth 56 --ratio 0.25 --threads 1
    python benchmarks/distill_rates.py --depth 20 --ratio 0.125 --rates 1e-3,1e-4
    python benchmarks/distill_rates.py --depth 56 --rates 3e-4 --precisions fp32,bf16   # --distill-precision
"""

from __future__ import annotations

import argparse
import copy
import random
import time
from pathlib import Path

import numpy as np
import torch
from figure_common import REPO, machine_line
from PIL import Image
from torch import nn

from tools.compression.distill import DistillConfig, distill_
from tools.compression.distill_budget import AUTO_DISTILL_BATCH
from tools.compression.pruning import apply_pruning
from tools.compression.recipes import PruningConfig
from tools.compression.recovery import RecoveryConfig, recover_
from tools.schemas import PruningRecommendation
from tools.zoo.cifar_resnet import CIFAR10_CLASSES, CIFAR_MEAN, CIFAR_STD, resnet

CALIBRATION, DISTILLATION = 256, 1680


def images_of(root: Path, seed: int = 0) -> list[tuple[Path, int]]:
    """Every JPEG of an image-folder CIFAR-10 split, with its class index, in a seeded order."""
    files = sorted((p, CIFAR10_CLASSES.index(p.parent.name)) for p in root.rglob("*.jpg"))
    random.Random(seed).shuffle(files)
    return files


def tensors(files: list[tuple[Path, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images scaled to [0, 1] and normalised as the checkpoints expect, and their labels."""
    mean, std = torch.tensor(CIFAR_MEAN)[:, None, None], torch.tensor(CIFAR_STD)[:, None, None]
    pixels = [np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) / 255 for p, _ in files]
    batch = torch.stack([(torch.from_numpy(x).permute(2, 0, 1) - mean) / std for x in pixels])
    return batch, torch.tensor([label for _, label in files])


def predictions(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(images[i : i + 500]).argmax(1) for i in range(0, len(images), 500)])


def compared(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, original: torch.Tensor) -> str:
    """``Δ +0.34 ± 0.57 pt, agreement 94.5 %`` against the original's predictions ``original``."""
    mine = predictions(model, images)
    diff = (mine == labels).float() - (original == labels).float()
    half_width = 1.96 * float(diff.std()) / len(diff) ** 0.5
    agreement = float((mine == original).float().mean())
    return f"Δ {100 * float(diff.mean()):+.2f} ± {100 * half_width:.2f} pt, agreement {100 * agreement:.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=56, help="CIFAR ResNet depth with a checkpoint (20 or 56)")
    parser.add_argument("--ratio", type=float, default=0.25, help="ratio of every stage-2/3 inner convolution")
    parser.add_argument("--rates", default="1e-3,3e-4,1e-4", help="peak learning rates, comma-separated")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--precisions", default="fp32", help="of the forward passes, comma-separated: fp32, bf16")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    parser.add_argument("--halves", type=Path, default=REPO / "runs" / "figures" / "halves")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(args.threads))
    checkpoint = args.shared / "models" / f"cifar10-resnet{args.depth}.th"
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    original = resnet(args.depth)
    original.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=False)
    original.eval()
    seen = images_of(args.halves / "a")
    calibration, _ = tensors(seen[:CALIBRATION])
    distillation, _ = tensors(seen[:DISTILLATION])  # the calibration images and the next ones
    unseen, labels = tensors(images_of(args.halves / "b"))
    reference = predictions(original, unseen)
    pruned = copy.deepcopy(original)
    rule = PruningRecommendation(
        layer=r"^layer[23]\.\d+\.conv1$", pruning_type="structured", pruning_ratio=args.ratio, justification="bench"
    )
    report = apply_pruning(
        pruned, [rule], torch.randn(1, 3, 32, 32), PruningConfig(importance="act", round_to=8), calibration=calibration
    )
    recover_(pruned, original, calibration, report.consumers(), RecoveryConfig())
    fewer = 100 * (1 - report.params_after / report.params_before)
    print(f"CIFAR ResNet-{args.depth}, {fewer:.1f} % fewer parameters; {len(unseen):,} unseen images")
    print(f"  repaired                {compared(pruned, unseen, labels, reference)}")
    for rate in (float(r) for r in args.rates.split(",")):
        for precision in args.precisions.split(","):
            student = copy.deepcopy(pruned)
            start = time.perf_counter()
            config = DistillConfig(steps=args.steps, lr=rate, batch_size=AUTO_DISTILL_BATCH, precision=precision)
            distill_(student, original, distillation, config)
            took = time.perf_counter() - start
            print(
                f"  distilled at {rate:<8g} {precision}  {compared(student, unseen, labels, reference)}  ({took:.0f} s)"
            )


if __name__ == "__main__":
    main()
