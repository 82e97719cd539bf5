"""A float model's evaluation run by OpenVINO FP32 instead of PyTorch: the same function, several times faster.

Evaluating a pruned round of a 224-260 px CNN in PyTorch on one CPU thread costs about a minute for a few hundred
images (EfficientNet-Lite2 at 260 px: 8-9 images a second, its depthwise convolutions are slow in eager PyTorch);
OpenVINO runs the same graph at FP32 about five times faster (46 images a second), and its logits differ from
PyTorch's by float rounding (1e-5 on Lite2's). :func:`openvino_twin` converts the model once (a few seconds), checks
the twin against the model on a few images (logits within :data:`TWIN_TOLERANCE` of their range and the same top-1
class on every one), and returns it, or None where OpenVINO is not installed, the conversion fails or the outputs
differ: the caller then evaluates in PyTorch. The original and every round of a run are evaluated the same way, so
their paired comparison sees no runtime difference. The twin is used only where the estimated PyTorch time is long
(``EvalSpec.float_runtime``, set by the run); small models keep PyTorch, where a conversion would cost more than it
saves.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.models.base import logits_of
from tools.text import first_line

logger = logging.getLogger(__name__)

__all__ = ["GROUPED_CONV_COST", "TWIN_AFTER_SECONDS", "TWIN_TOLERANCE", "float_runtime_for", "openvino_twin"]

#: Estimated PyTorch seconds of one evaluation (images x MACs at the sensitivity profile's assumed one-thread rate,
#: a fixed figure so the choice never depends on timing) past which a float model is evaluated by its OpenVINO twin.
TWIN_AFTER_SECONDS = 10.0

#: What one MAC of a grouped (depthwise) convolution costs PyTorch on the CPU, in MACs of a dense one. Measured on
#: one Xeon core, batch 32 at 224 px (the other core busy): EfficientNet-Lite0 ran 7 images a second (3.0·10⁹ MAC/s;
#: its depthwise convolutions are 9 % of its MACs), its OpenVINO FP32 twin 57; dense CNNs run 7.5·10⁹ MAC/s. So
#: the 9 % took about two thirds of the time: about 16 times a dense MAC. Counted at 1, Lite0's evaluation of 375
#: images was estimated at 7.6 s (PyTorch; it took 32-51 s a round) and kept in PyTorch.
GROUPED_CONV_COST = 16.0

#: Largest difference between the twin's and the model's logits, relative to the logits' range, that counts as the
#: same function.
TWIN_TOLERANCE = 1e-3


def float_runtime_for(macs: int | None, images: int, device: str = "cpu", grouped_conv_macs: int = 0) -> str:
    """``openvino`` where a float evaluation of ``images`` images of a ``macs``-MAC model on the CPU would take PyTorch
    more than :data:`TWIN_AFTER_SECONDS` (estimated; the ``grouped_conv_macs`` among them at
    :data:`GROUPED_CONV_COST`) and OpenVINO is installed, else ``torch``."""
    from tools.compression.sensitivity import SENSITIVITY_MACS_PER_SECOND
    from tools.deploy.registry import FLOAT, FLOAT_TWIN, available

    if device != "cpu" or not macs or not available(FLOAT_TWIN):
        return FLOAT
    macs += round((GROUPED_CONV_COST - 1.0) * grouped_conv_macs)
    return FLOAT_TWIN if images * macs / SENSITIVITY_MACS_PER_SECOND > TWIN_AFTER_SECONDS else FLOAT


class _Twin:
    """An :class:`~tools.deploy.openvino.model.OpenVinoModel` that owns the directory its IR was written to."""

    def __init__(self, model: Any, directory: Path) -> None:
        self.model = model
        self._directory = directory

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)  # type: ignore[no-any-return]

    def __del__(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


def openvino_twin(
    model: nn.Module, example: torch.Tensor, check: torch.Tensor | None = None
) -> Callable[..., Any] | None:
    """``model`` (a float torch classifier on the CPU) compiled by OpenVINO at FP32, checked on ``check`` (default
    ``example``); None where that cannot be done or the outputs differ (see module doc)."""
    try:
        from tools.deploy.openvino.convert import export_openvino
        from tools.deploy.openvino.model import OpenVinoModel
    except ImportError:
        return None
    directory = Path(tempfile.mkdtemp(prefix="profiling-agent-twin-"))
    try:
        path = export_openvino(model.eval(), example, directory / "model.xml")
        twin = _Twin(OpenVinoModel(path, precision="f32"), directory)
    except Exception as exc:  # any converter failure: evaluate in PyTorch
        shutil.rmtree(directory, ignore_errors=True)
        logger.info("evaluating in PyTorch: OpenVINO could not take the model (%s)", first_line(exc))
        return None
    images = check if check is not None else example
    with torch.no_grad():
        wanted = logits_of(model(images)).float()
    got = twin(images)
    scale = float(wanted.max() - wanted.min()) or 1.0
    if got.shape != wanted.shape or not (
        float((got - wanted).abs().max()) <= TWIN_TOLERANCE * scale
        and bool((got.argmax(-1) == wanted.argmax(-1)).all())
    ):
        logger.info("evaluating in PyTorch: OpenVINO FP32's logits differ from the model's")
        return None
    return twin
