"""Cross-fitted distillation of a finished run's rounds: distillation that takes no image from the evaluation.

For each round given, the saved (repaired) model is distilled twice from the original, each time on the run's
calibration images plus one seeded half of its evaluation images, and each student is evaluated on the half it did
not see; the two halves' predictions together give a paired estimate on every evaluation image, as the run's
budget test would see it. Every model is also evaluated on the unseen data (``--data``: the other half of the
split, which the run never saw). It measured what distilling the rounds that recovery leaves over the budget, without
shrinking the evaluation, would give; the tool now does it after the search (``agents/distillation.py``, its own
seeded halves)::

    python benchmarks/cross_fit_distill.py runs/figures/resnet56 --rounds 2,3 --data runs/figures/halves/b
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from figure_common import read_run, run_images, top1

from agents.planning.selection import selection_z
from tools import load_compressed
from tools.compression.distill import DISTILL_TEMPERATURE, DistillConfig, distill_
from tools.compression.distill_budget import AUTO_DISTILL_BATCH, AUTO_DISTILL_LR, SOLO_STEPS_FACTOR
from tools.stages import ops

#: The multiplicity factor the figures print beside each estimate: the kept round's check for the best of 4 rounds.
Z_FOUR_ROUNDS = round(selection_z(4), 2)


def paired(predicted: torch.Tensor, original: torch.Tensor, labels: torch.Tensor) -> str:
    """Δ points ± 95 %, the budget test's drop + 1.75 standard errors, and the agreement with the original."""
    diff = (predicted == labels).float() - (original == labels).float()
    se = float(diff.std()) / len(diff) ** 0.5
    mean = float(diff.mean())
    agreement = float((predicted == original).float().mean())
    return (
        f"Δ {100 * mean:+.2f} ± {196 * se:.2f} (drop + {Z_FOUR_ROUNDS} se {100 * (-mean + Z_FOUR_ROUNDS * se):.2f}), "
        f"agreement {100 * agreement:.1f} %"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished run directory (runs on one half of a split)")
    parser.add_argument("--rounds", required=True, help="round numbers, comma-separated")
    parser.add_argument("--data", required=True, help="images the run never saw (the other half)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=AUTO_DISTILL_LR)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--features", type=float, default=0.0, help="weight of block-output matching")
    parser.add_argument("--batch", type=int, default=AUTO_DISTILL_BATCH)
    parser.add_argument("--temperature", type=float, default=DISTILL_TEMPERATURE, help="of the KL loss on logits")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="of the forward passes")
    parser.add_argument("--no-cache", action="store_true", help="every layer runs every step (no cached views)")
    parser.add_argument("--extra", help="a folder of unlabelled images every student also trains on")
    parser.add_argument("--extra-count", type=int, default=0, help="at most this many of them (0: all)")
    parser.add_argument(
        "--solo", action="store_true", help="one student on the calibration and extra images only, twice the steps"
    )
    args = parser.parse_args()
    ops.set_threads(args.threads)
    run = read_run(args.run)
    images = run_images(run)
    calibration, evaluation, labels = images.calibration, images.evaluation, images.labels
    unseen, unseen_labels = images.unseen(args.data)
    extra = torch.empty(0, *calibration.shape[1:])
    if args.extra:
        extra, _ = images.unseen(args.extra)  # every image of the folder, preprocessed (its labels unused)
        if args.extra_count:
            extra = extra[torch.randperm(len(extra), generator=torch.Generator().manual_seed(1))[: args.extra_count]]
    order = torch.randperm(len(evaluation), generator=torch.Generator().manual_seed(0))
    halves = (order[: len(order) // 2], order[len(order) // 2 :])
    original = load_compressed(run.original)
    original_eval, original_unseen = top1(original, evaluation), top1(original, unseen)
    print(f"{args.run}: {len(evaluation):,} evaluation images in two halves, {len(unseen):,} unseen")
    for index in (int(r) for r in args.rounds.split(",")):
        repaired = load_compressed(args.run / "rounds" / f"round-{index:02d}" / "model")
        print(f"round {index}, repaired: in the run {paired(top1(repaired, evaluation), original_eval, labels)}")
        print(f"  unseen {paired(top1(repaired, unseen), original_unseen, unseen_labels)}")
        merged = torch.empty_like(original_eval)
        config = DistillConfig(
            steps=args.steps,
            lr=args.lr,
            batch_size=args.batch,
            feature_weight=args.features,
            precision=args.precision,
            temperature=args.temperature,
            cache=not args.no_cache,
        )
        if args.solo:  # tools.stages.cross_fit.distil_solo: no evaluation image trains it, all of them judge it
            student, start = copy.deepcopy(repaired), time.perf_counter()
            solo = config.model_copy(update={"steps": SOLO_STEPS_FACTOR * args.steps})
            distill_(student, original, torch.cat([calibration, extra]), solo)
            in_run = paired(top1(student, evaluation), original_eval, labels)
            print(
                f"  one student of {len(calibration)} + {len(extra):,} images, {solo.steps} steps "
                f"({time.perf_counter() - start:.0f} s): in the run {in_run}"
                f"; unseen {paired(top1(student, unseen), original_unseen, unseen_labels)}",
                flush=True,
            )
            continue
        for seen, held_out in (halves, halves[::-1]):
            student = copy.deepcopy(repaired)
            start = time.perf_counter()
            done = distill_(student, original, torch.cat([calibration, extra, evaluation[seen]]), config)
            merged[held_out] = top1(student, evaluation[held_out])
            took = time.perf_counter() - start
            print(
                f"  student of {len(seen):,} + {len(calibration)} + {len(extra):,} images ({took:.0f} s, "
                f"{f'{done.views} views after {done.cached_from}' if done.views else 'no cache'}): unseen "
                f"{paired(top1(student, unseen), original_unseen, unseen_labels)}"
            )
        print(f"  cross-fitted, in the run: {paired(merged, original_eval, labels)}", flush=True)


if __name__ == "__main__":
    main()
