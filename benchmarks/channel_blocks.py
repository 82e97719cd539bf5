"""What a pruned convolution's channel count buys in latency: whole channel blocks or nothing.

CPU convolution kernels compute channels in blocks (oneDNN's and ONNX Runtime's blocked layouts: 8 channels on
AVX2, 16 on AVX-512), so a count between two blocks runs as the next one. This script narrows every block-internal
convolution of one stage of a CIFAR ResNet (random weights: latency only) to each width given and times the
result against the unpruned net in OpenVINO FP32 and ONNX Runtime FP32 (and OpenVINO bf16 where the CPU computes
it natively; with ``--int8`` also OpenVINO int8, the tool's NNCF build calibrated on 32 random inputs), batch 1,
interleaved in one process.
It is the measurement behind ``--round-to`` (``tools.compression.channels.channel_step``)::

    python benchmarks/channel_blocks.py --threads 1                     # ResNet-56, the widths of the README
    python benchmarks/channel_blocks.py --depth 20 --widths 1:14,1:12,1:8,2:28,2:24,3:60,3:56
    python benchmarks/channel_blocks.py --depth 20 --int8 --widths 3:56,3:48,3:32
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from figure_common import machine_line
from torch import nn

from tools.deploy.cpu import detect_cpu
from tools.deploy.onnxruntime.export import export_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.deploy.openvino.convert import export_openvino, openvino_module
from tools.deploy.openvino.model import OpenVinoModel, core
from tools.deploy.openvino.quantize import quantize_openvino
from tools.evaluation.cost import compare_latencies
from tools.zoo.cifar_resnet import CifarResNet

DEFAULT_WIDTHS = "1:14,1:12,1:8,2:28,2:24,3:60,3:56"


def narrowed(depth: int, stage: int | None, width: int | None) -> nn.Module:
    """A CIFAR ResNet-``depth`` whose stage ``stage`` has every block's inner convolution ``width`` channels wide."""
    n = (depth - 2) // 6
    torch.manual_seed(0)
    model = CifarResNet((n, n, n))
    if stage is not None and width is not None:
        for block in getattr(model, f"layer{stage}"):
            block.conv1 = nn.Conv2d(block.conv1.in_channels, width, 3, block.conv1.stride, 1, bias=False)
            block.bn1 = nn.BatchNorm2d(width)
            block.conv2 = nn.Conv2d(width, block.conv2.out_channels, 3, 1, 1, bias=False)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=56, help="CIFAR ResNet depth, 6n+2 (default 56)")
    parser.add_argument("--widths", default=DEFAULT_WIDTHS, help=f"STAGE:WIDTH,... (default {DEFAULT_WIDTHS})")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--int8", action="store_true", help="also OpenVINO int8 (the tool's NNCF build)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(args.threads))
    variants: dict[str, tuple[int | None, int | None]] = {"unpruned": (None, None)}
    for item in args.widths.split(","):
        stage, width = (int(v) for v in item.split(":"))
        variants[f"stage {stage} inner at {width}"] = (stage, width)
    x = torch.randn(1, 3, 32, 32)
    runtimes = ["OpenVINO FP32", "ONNX Runtime FP32", *(["OpenVINO bf16"] * detect_cpu().bf16)]
    runtimes += ["OpenVINO int8"] * args.int8
    calibration = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (stage, width) in variants.items():
            model = narrowed(args.depth, stage, width)
            stem = Path(tmp) / name.replace(" ", "-")
            xml = export_openvino(model, x, stem.with_suffix(".xml"))
            models[f"{name}|OpenVINO FP32"] = OpenVinoModel(xml, threads=args.threads)
            if "OpenVINO bf16" in runtimes:
                models[f"{name}|OpenVINO bf16"] = OpenVinoModel(xml, threads=args.threads, precision="bf16")
            if args.int8:
                int8 = quantize_openvino(core().read_model(str(xml)), calibration, transformer=False)
                openvino_module().save_model(int8, str(stem.with_suffix(".int8.xml")), compress_to_fp16=False)
                models[f"{name}|OpenVINO int8"] = OpenVinoModel(stem.with_suffix(".int8.xml"), threads=args.threads)
            onnx = export_onnx(model, x, stem.with_suffix(".onnx"))
            models[f"{name}|ONNX Runtime FP32"] = OrtModel(onnx, threads=args.threads, fixed_batch=True)
        seconds = compare_latencies(models, x, warmup=10, repeats=args.repeats)
    print(f"CIFAR ResNet-{args.depth}, random weights, batch 1, {args.repeats} interleaved calls each")
    print(f"  {'variant':28s}" + "".join(f" {rt:>20s}" for rt in runtimes))
    base = {rt: seconds[f"unpruned|{rt}"] for rt in runtimes}
    for name in variants:
        cells = [f"{seconds[f'{name}|{rt}'] * 1e3:7.3f} ms {base[rt] / seconds[f'{name}|{rt}']:5.2f}x" for rt in base]
        print(f"  {name:28s}" + "".join(f" {cell:>20s}" for cell in cells))


if __name__ == "__main__":
    main()
