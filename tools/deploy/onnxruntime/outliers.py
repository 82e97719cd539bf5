"""Calibration images that would take an activation range whole: found in the float model, left out of ONNX
Runtime's static int8 calibration.

ONNX Runtime's min-max calibration sets each activation's int8 range from the largest value any calibration image
gives it. One image whose activations run far past every other image's then costs that tensor most of its 256
levels on all the others: a trained 224-px EfficientNet-B0 had one image of 125 whose activations reached 1,491x
the median image's in a block's projection (and six more past 25x), and its static int8 changed 62 % of the top-1
answers (on 8 or 64 other images it agreed with float on 97-100 %). NNCF's ranges were not affected.

:func:`outlier_images` finds such images by each layer's largest output magnitude per image against the
median image's; :func:`without_outlier_images` leaves them out, and says which and why. No image of the shared
CIFAR models' or the CIFAR ResNets' calibration data came near :data:`OUTLIER_RATIO` (at most 5.0x, over 1,000 to
5,000 images of half a), nor of a trained 224-px MobileNetV2's (14.8x over its 500): their calibration is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from tools.profiling.modules import atomic_modules

logger = logging.getLogger(__name__)

__all__ = ["MAX_OUTLIER_SHARE", "MIN_IMAGES", "OUTLIER_RATIO", "outlier_images", "without_outlier_images"]

#: An image is an outlier when some module's largest output magnitude on it is this many times the median image's:
#: its range would cost that activation over log2(25) = 4.6 of its 8 bits on every other image.
OUTLIER_RATIO = 25.0
#: Below this many calibration images there is no median to speak of: nothing is left out.
MIN_IMAGES = 16
#: At most this share of the images are left out; more that far out is the data's spread, not outliers. The
#: EfficientNet-B0 above had 7 of 125 past it (1,491x, 239x, 238x, 202x, 77x, 39x, 28x): without all 7, int8
#: changed 3.5 % of the answers on 200 other images and kept float's accuracy; without the worst one only, 9 %.
MAX_OUTLIER_SHARE = 0.10
_BATCH = 32
#: Notes already logged: the int8 profile and the static build calibrate on the same original's images, and the
#: warning says the same thing each time.
_LOGGED: set[str] = set()


#: The models and images :func:`without_outlier_images` searched last, with what it found (one pass of the float
#: model over the calibration images each: 15 s for a 260-px EfficientNet-Lite2 on one thread).
_FOUND: dict[tuple[float, ...], dict[int, tuple[str, float]]] = {}
_KEPT = 4


@torch.no_grad()
def _fingerprint(model: nn.Module, images: torch.Tensor) -> tuple[float, ...]:
    """Which model and which images: shapes and sums of every parameter and of the images (float64)."""
    params = [p.detach().double() for p in model.parameters()]
    return (
        float(sum(p.numel() for p in params)),
        float(sum(float(p.sum()) for p in params)),
        float(sum(float(p.abs().sum()) for p in params)),
        *(float(d) for d in images.shape),
        float(images.double().sum()),
        float(images.double().abs().sum()),
    )


@torch.no_grad()
def outlier_images(model: nn.Module, images: torch.Tensor) -> dict[int, tuple[str, float]]:
    """Image index -> (the module, the ratio) where it runs furthest past the median image, for the images that
    exceed :data:`OUTLIER_RATIO` somewhere. The profile's layers (:func:`~tools.profiling.modules.atomic_modules`: a
    convolution that pads through a child counts as one) whose output is a tensor with the batch first."""
    peaks: dict[str, list[torch.Tensor]] = {}

    def record(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            if isinstance(output, torch.Tensor) and output.dim() > 1 and output.is_floating_point():
                dims = tuple(range(1, output.dim()))  # reduced in place: no copy of a channels-last activation
                peak = torch.maximum(output.detach().amax(dims), -output.detach().amin(dims))
                peaks.setdefault(name, []).append(peak.float().cpu())

        return hook

    leaves = [(name, m) for name, m in atomic_modules(model).items() if name]
    handles = [m.register_forward_hook(record(name)) for name, m in leaves]
    was_training = model.training
    device = next((t.device for t in model.parameters()), images.device)
    try:
        model.eval()
        for start in range(0, len(images), _BATCH):
            part = images[start : start + _BATCH].to(device)
            model(part.contiguous(memory_format=torch.channels_last) if part.ndim == 4 else part)  # faster on CPUs
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    worst: dict[int, tuple[str, float]] = {}
    for name, parts in peaks.items():
        per_image = torch.cat(parts)
        if len(per_image) != len(images):  # called more than once per forward, or not batch-first
            continue
        median = float(per_image.median())
        if median <= 0:
            continue
        for index in torch.nonzero(per_image > OUTLIER_RATIO * median).flatten().tolist():
            ratio = float(per_image[index]) / median
            if ratio > worst.get(index, ("", 0.0))[1]:
                worst[index] = (name, ratio)
    return worst


def without_outlier_images(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """``images`` without their outliers (:func:`outlier_images`), and a note naming them (also logged as a
    warning, once per process for the same images: the deployment table shows only the deployed candidate's
    notes); unchanged with fewer than :data:`MIN_IMAGES` images or more than :data:`MAX_OUTLIER_SHARE` of them out
    that far."""
    if len(images) < MIN_IMAGES:
        return images, []
    key = _fingerprint(model, images)
    if key not in _FOUND:  # the int8 profile and the original's static builds ask the same of the same model
        while len(_FOUND) >= _KEPT:
            _FOUND.pop(next(iter(_FOUND)))
        _FOUND[key] = outlier_images(model, images)
    found = _FOUND[key]
    if not found or len(found) > MAX_OUTLIER_SHARE * len(images):
        return images, []
    keep = [i for i in range(len(images)) if i not in found]
    shown = ", ".join(f"image {i} ({found[i][1]:,.0f}x the median image in {found[i][0]})" for i in sorted(found))
    note = (
        f"static int8 calibration: {len(found)} of {len(images)} calibration image(s) left out, whose activations "
        f"would set ONNX Runtime's min-max ranges on their own: {shown}"
    )
    if note not in _LOGGED:
        _LOGGED.add(note)
        logger.warning("%s", note)
    return images[keep], [note]
