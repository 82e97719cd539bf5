"""Whole blocks removed and distilled: what depth buys where channel pruning buys nothing (measured, not built).

A *block* is a child of an ``nn.Sequential`` or ``nn.ModuleList`` whose output has its input's shape (a residual
block with an identity shortcut, a transformer layer). This script measures each block's damage removed alone (the
block's output replaced by its input, no training) on a finished run's evaluation images, removes the ``K`` least
damaging for each ``K`` given, distils the result from the original twice as the tool's distillation after the search
does (``tools.compression.distill``: each student on the run's calibration images and one seeded half of its
evaluation images, judged on the other half, 1,000 steps, logits only), reports both students on images the run
never saw (``--data``) and the cross-fitted estimate the run's budget test would see, then times the first student
against the original in OpenVINO int8 (the tool's NNCF build, calibrated on the run's calibration images),
OpenVINO FP32 and ONNX Runtime FP32, batch 1, warm blocks of 20 calls, interleaved in one process::

    python benchmarks/block_removal.py runs/figures/resnet20 --blocks 1,2 --data runs/figures/halves/b
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from figure_common import machine_line, read_run, run_images, top1
from torch import nn

from tools import load_compressed
from tools.compression.distill import DistillConfig, distill_
from tools.compression.distill_budget import AUTO_DISTILL_BATCH, AUTO_DISTILL_LR
from tools.compression.kinds.blocks import removable_blocks
from tools.deploy.cpu import detect_cpu
from tools.deploy.onnxruntime.export import export_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.deploy.openvino.convert import export_openvino, openvino_module
from tools.deploy.openvino.model import OpenVinoModel, core
from tools.deploy.openvino.quantize import quantize_openvino
from tools.evaluation.cost import compare_latencies
from tools.stages import ops


class SkippedBlock(nn.Module):
    """A removed block: returns a copy of its first input (whatever else the caller passes). A copy, as a block's
    output is a new tensor: a caller that adds the shortcut in place (Hugging Face's ResNet layers) would otherwise
    change its input too, which autograd refuses."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x.clone()


def same_shape_blocks(model: nn.Module, example: torch.Tensor) -> list[str]:
    """Names of the blocks whose output has their input's shape and whose removal leaves the model running: the
    blocks unit kind's own finder (:func:`tools.compression.kinds.blocks.removable_blocks`)."""
    return list(removable_blocks(model, example))


def without(model: nn.Module, names: list[str]) -> nn.Module:
    """A copy of ``model`` with the blocks ``names`` replaced by :class:`SkippedBlock`."""
    copied = copy.deepcopy(model)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = copied.get_submodule(parent_name) if parent_name else copied
        if isinstance(parent, nn.Sequential | nn.ModuleList):
            parent[int(child)] = SkippedBlock()
        else:
            setattr(parent, child, SkippedBlock())
    return copied


def least_damaging(order: list[str], count: int) -> list[str]:
    """The first ``count`` blocks of ``order`` that neither hold nor sit inside one taken before (removing a stage
    removes its blocks: a nested name would be counted twice, or be gone)."""
    taken: list[str] = []
    for name in order:
        if len(taken) == count:
            break
        if not any(name.startswith(f"{t}.") or t.startswith(f"{name}.") for t in taken):
            taken.append(name)
    return taken


def paired(predicted: torch.Tensor, original: torch.Tensor, labels: torch.Tensor) -> str:
    """Δ points ± 95 % and the agreement with the original."""
    diff = (predicted == labels).float() - (original == labels).float()
    half_width = 196 * float(diff.std()) / len(diff) ** 0.5
    agreement = 100 * float((predicted == original).float().mean())
    return f"Δ {100 * float(diff.mean()):+.2f} ± {half_width:.2f}, agreement {agreement:.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished run directory (runs on one half of a split)")
    parser.add_argument("--blocks", required=True, help="how many blocks to remove, comma-separated (e.g. 1,2)")
    parser.add_argument("--data", required=True, help="images the run never saw (the other half)")
    parser.add_argument("--steps", type=int, default=1000, help="distillation steps of each student")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    ops.set_threads(args.threads)
    print(machine_line(args.threads))
    run = read_run(args.run)
    images = run_images(run)
    calibration, evaluation, labels = images.calibration, images.evaluation, images.labels
    unseen, unseen_labels = images.unseen(args.data)
    original = load_compressed(run.original).eval()
    original_eval, original_unseen = top1(original, evaluation), top1(original, unseen)
    example = evaluation[:1]
    accuracy = float((original_eval == labels).float().mean())
    damage = {
        name: 100 * (accuracy - float((top1(without(original, [name]), evaluation) == labels).float().mean()))
        for name in same_shape_blocks(original, example)
    }
    order = sorted(damage, key=lambda name: damage[name])
    print(
        f"{args.run}: {len(evaluation):,} evaluation images, {len(unseen):,} unseen; each block removed alone, "
        "points lost on the evaluation images: " + ", ".join(f"{n} {damage[n]:.2f}" for n in order)
    )
    order_halves = torch.randperm(len(evaluation), generator=torch.Generator().manual_seed(0))
    halves = (order_halves[: len(order_halves) // 2], order_halves[len(order_halves) // 2 :])
    params = sum(p.numel() for p in original.parameters())
    students: dict[str, nn.Module] = {"original": original}
    for count in (int(k) for k in args.blocks.split(",")):
        removed = least_damaging(order, count)
        cut = without(original, removed)
        fewer = 100 * (1 - sum(p.numel() for p in cut.parameters()) / params)
        print(
            f"{count} removed ({', '.join(removed)}; {fewer:.1f} % fewer parameters): undistilled, unseen "
            f"{paired(top1(cut, unseen), original_unseen, unseen_labels)}"
        )
        merged = torch.empty_like(original_eval)
        for index, (seen, held_out) in enumerate((halves, halves[::-1])):
            student = copy.deepcopy(cut)
            start = time.perf_counter()
            config = DistillConfig(
                steps=args.steps,
                lr=AUTO_DISTILL_LR,
                batch_size=AUTO_DISTILL_BATCH,
                precision="bf16" if detect_cpu().bf16 else "fp32",
            )
            distill_(student, original, torch.cat([calibration, evaluation[seen]]), config)
            merged[held_out] = top1(student, evaluation[held_out])
            print(
                f"  student {index + 1} ({time.perf_counter() - start:.0f} s): unseen "
                f"{paired(top1(student, unseen), original_unseen, unseen_labels)}",
                flush=True,
            )
            if index == 0:
                students[f"{count} removed"] = student
        print(f"  cross-fitted, in the run: {paired(merged, original_eval, labels)}", flush=True)
    models: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in students.items():
            stem = Path(tmp) / name.replace(" ", "-")
            xml = export_openvino(model, example, stem.with_suffix(".xml"))
            int8 = quantize_openvino(core().read_model(str(xml)), calibration, transformer=False)
            openvino_module().save_model(int8, str(stem.with_suffix(".int8.xml")), compress_to_fp16=False)
            models[f"{name}|OpenVINO int8"] = OpenVinoModel(stem.with_suffix(".int8.xml"), threads=args.threads)
            models[f"{name}|OpenVINO FP32"] = OpenVinoModel(xml, threads=args.threads)
            onnx = export_onnx(model, example, stem.with_suffix(".onnx"))
            models[f"{name}|ONNX Runtime FP32"] = OrtModel(onnx, threads=args.threads, fixed_batch=True)
        seconds = compare_latencies(models, example, warmup=10, repeats=30, block=20)
    runtimes = ("OpenVINO int8", "OpenVINO FP32", "ONNX Runtime FP32")
    print("batch 1, warm blocks of 20 calls, 30 interleaved repetitions; each against the original's same runtime")
    print(f"  {'model':14s}" + "".join(f" {runtime:>22s}" for runtime in runtimes))
    for name in students:
        cells = [
            f"{seconds[f'{name}|{rt}'] * 1e3:7.3f} ms {seconds[f'original|{rt}'] / seconds[f'{name}|{rt}']:5.2f}x"
            for rt in runtimes
        ]
        print(f"  {name:14s}" + "".join(f" {cell:>22s}" for cell in cells))


if __name__ == "__main__":
    main()
