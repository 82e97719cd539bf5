"""A trained 224-px mobile CNN to judge pruning at ImageNet size on, where no ImageNet weights or images can be had.

    python benchmarks/mobilenet_proxy.py --data HALF_A --out DIR [--arch efficientnet-b0] [--seconds 270] \
        [--device cuda]

Trains a Hugging Face ``MobileNetV2ForImageClassification`` (width 1.0, 224 px, 10 classes, 2.24 M parameters;
depthwise-separable inverted residual blocks) or, with ``--arch efficientnet-b0``, an
``EfficientNetForImageClassification`` B0 (224 px, 4.02 M parameters; inverted residual blocks with
squeeze-and-excitation, SiLU) on the images of ``--data`` (half a of CIFAR-10's test split:
``benchmarks/split_halves.py``) upscaled to 224 px, by function matching (Beyer et al., 2022): its softmax is fitted
to that of an ensemble of CIFAR ResNets (``--teacher FACTORY=CHECKPOINT``, 32 px; by default the shared ResNet-56)
on mixup of randomly cropped and flipped images, so 5,000 images give an accurate student. bf16 on a GPU (an
NVIDIA H100 trained it in 270 s, 138 epochs); the CPU works too, far slower. The folder it writes
(``save_pretrained`` with an image processor that resizes to 224 and normalises with 0.5/0.5) loads with
``--model DIR``. Its accuracy is what matters, not how it was trained: it is a trained 224-px MobileNetV2 whose
channels carry what it learned, unlike one with random weights.

Measured (teachers ResNet-56 + ResNet-44 + ResNet-32, 85.4 % on half a): MobileNetV2 80.3 % on the 5,000 images of
half b.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (
    EfficientNetConfig,
    EfficientNetForImageClassification,
    EfficientNetImageProcessor,
    MobileNetV2Config,
    MobileNetV2ForImageClassification,
    MobileNetV2ImageProcessor,
    PretrainedConfig,
    PreTrainedModel,
)

from tools.evaluation.datasets import load_eval_dataset
from tools.models.checkpoints import load_state_dict_file, load_weights
from tools.models.factory import call_factory
from tools.zoo.cifar_resnet import CIFAR_MEAN, CIFAR_STD

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEACHER = f"tools.zoo.cifar_resnet:resnet56={REPO.parent / 'shared' / 'models' / 'cifar10-resnet56.th'}"
SIZE = {"height": 224, "width": 224}
HALF = [0.5, 0.5, 0.5]  # the processors resize bilinearly and normalise with 0.5 and 0.5, as student_input does


def torchvision_init(model: torch.nn.Module) -> None:
    """torchvision's initialisation: He for convolutions, BatchNorm scales 1 (transformers draws EfficientNet's from
    N(0, 0.02), and twenty of them in a row leave block 0's output at 1e-6 of its input: it never trains)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_out")
        elif isinstance(module, torch.nn.BatchNorm2d):
            torch.nn.init.ones_(module.weight)
        elif isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.01)
        if isinstance(module, torch.nn.Conv2d | torch.nn.BatchNorm2d | torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)


#: --arch: (config class, its settings, model class, image processor, initialisation)
ARCHITECTURES: dict[
    str,
    tuple[type[PretrainedConfig], dict[str, Any], type[PreTrainedModel], Callable[[], Any], Callable[..., None]],
] = {
    "mobilenet-v2": (
        MobileNetV2Config,
        {},
        MobileNetV2ForImageClassification,
        lambda: MobileNetV2ImageProcessor(size={"shortest_edge": 224}, crop_size=SIZE),
        lambda model: None,  # transformers' own
    ),
    "efficientnet-b0": (
        EfficientNetConfig,  # B0's widths and depths (the config's defaults are B7's); PyTorch's BN momentum
        {"width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280, "batch_norm_momentum": 0.1},
        EfficientNetForImageClassification,
        lambda: EfficientNetImageProcessor(size=SIZE, image_mean=HALF, image_std=HALF, include_top=False, resample=2),
        torchvision_init,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="image folder to train on (half a)")
    parser.add_argument("--out", type=Path, required=True, help="where to save the model")
    parser.add_argument(
        "--teacher", action="append", help=f"FACTORY=CHECKPOINT, repeatable (default {DEFAULT_TEACHER})"
    )
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="mobilenet-v2")
    parser.add_argument("--seconds", type=float, default=270.0, help="training time (one-cycle schedule over it)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    dev = args.device
    torch.manual_seed(0)
    data = load_eval_dataset(str(args.data), samples=None, seed=0)  # every image, as the runs read it
    x8 = torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) for im in data.images])).permute(0, 3, 1, 2)
    y, classes = torch.tensor(data.labels), data.label_names
    x8, y = x8.to(dev), y.to(dev)
    teachers = []
    for spec in args.teacher or [DEFAULT_TEACHER]:
        factory, _, checkpoint = spec.partition("=")
        teacher = call_factory(factory)
        load_weights(teacher, load_state_dict_file(checkpoint), source=checkpoint, factory=factory)
        teachers.append(teacher.to(dev).eval())
    mean = torch.tensor(CIFAR_MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=dev).view(1, 3, 1, 1)

    @torch.no_grad()
    def teach(x01: torch.Tensor) -> torch.Tensor:  # the ensemble's log-probabilities
        logp = torch.stack([t((x01 - mean) / std).float().log_softmax(1) for t in teachers])
        return logp.logsumexp(0) - math.log(len(teachers))

    teacher_accuracy = (teach(x8.float() / 255).argmax(1) == y).float().mean().item()
    config_class, settings, model_class, make_processor, initialise = ARCHITECTURES[args.arch]
    config = config_class(
        num_labels=len(classes),
        id2label=dict(enumerate(classes)),
        label2id={c: i for i, c in enumerate(classes)},
        image_size=224,
        **settings,
    )
    model = model_class(config)
    initialise(model)
    model = model.to(dev).to(memory_format=torch.channels_last)
    processor = make_processor()

    def student_input(x01: torch.Tensor) -> torch.Tensor:  # the image processor's resize and normalisation
        up = F.interpolate(x01, size=224, mode="bilinear", align_corners=False)
        return ((up - 0.5) / 0.5).contiguous(memory_format=torch.channels_last)

    def augment(batch: torch.Tensor) -> torch.Tensor:  # 32 px: random crop of the 4-px reflect-padded image, flip
        padded = F.pad(batch, (4, 4, 4, 4), mode="reflect")
        i, j = torch.randint(0, 9, (2,)).tolist()
        batch = padded[:, :, i : i + 32, j : j + 32]
        flip = torch.rand(batch.shape[0], device=batch.device) < 0.5
        return torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch)

    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    start, steps = time.time(), 0
    model.train()
    while (done := (time.time() - start) / args.seconds) < 1:
        warm = 0.03
        lr = 2e-3 * (done / warm if done < warm else 0.5 * (1 + math.cos(math.pi * (done - warm) / (1 - warm))))
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, x8.shape[0], (args.batch_size,), device=dev)
        batch = augment(x8[idx].float() / 255)
        lam = torch.distributions.Beta(1.0, 1.0).sample((args.batch_size, 1, 1, 1)).to(dev)
        batch = lam * batch + (1 - lam) * batch.flip(0)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev.startswith("cuda")):
            logits = model(pixel_values=student_input(batch)).logits.float()
        loss = F.kl_div(logits.log_softmax(1), teach(batch), log_target=True, reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        if steps % 500 == 0:
            print(f"step {steps}, {time.time() - start:.0f} s, loss {loss.item():.4f}", flush=True)
    model.eval().to("cpu").to(memory_format=torch.contiguous_format)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    result = {
        "arch": args.arch,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "epochs": round(steps * args.batch_size / x8.shape[0], 1),
        "seconds": round(time.time() - start, 1),
        "device": torch.cuda.get_device_name() if dev.startswith("cuda") else dev,
        "teachers": args.teacher or [DEFAULT_TEACHER],
        "teacher_ensemble_accuracy_on_data": round(teacher_accuracy, 4),
        "data": str(args.data),
    }
    (args.out / "training_result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
