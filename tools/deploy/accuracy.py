"""Accuracy-controlled int8: the images, the original's answers and the budget a mixed-precision build keeps within.

A mixed-precision backend (``onnxruntime-static-mixed``, ``openvino-int8-mixed``) quantizes a model to int8, and
while the result is over the accuracy budget keeps more of its most damaging layers in float. What "over the
budget" means is the run's own test (:func:`tools.stats.within_budget`: the drop against the *original* plus one
standard error of the paired difference, on the same images), so :class:`AccuracyControl` carries the validation
images, their classes and the original's per-image results, and judges any candidate's predictions exactly as the
deployment will.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tools.clock import counts_as
from tools.schemas import Int8Sensitivity, PairedAccuracy
from tools.stats import budget_drop_points, paired_accuracy, standard_error_points, within_budget

__all__ = ["AccuracyControl", "predict_classes"]

#: Images a validation batch holds (the runtimes' sessions are compiled per batch size: one size is reused).
BATCH = 50


@counts_as("evaluate")
def predict_classes(model: Callable[[torch.Tensor], Any], images: torch.Tensor, batch: int = BATCH) -> list[int]:
    """Top-1 class of each image under ``model`` (a runtime's callable ``pixel_values -> logits``)."""
    out: list[int] = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            logits = model(images[start : start + batch])
            logits = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(logits)
            out.extend(int(c) for c in logits.argmax(dim=-1))
    return out


@dataclass(frozen=True, eq=False)
class AccuracyControl:
    """The validation images an accuracy-controlled build is judged on, and the budget it keeps within.

    ``targets`` is each image's class in the model's label space; ``same_class`` maps a duplicated class name's
    other indices to the one a prediction counts as. ``reference_pred`` / ``reference_correct`` are the original
    model's answers on the same images (the budget is against the original, not the model being quantized).
    ``max_float_share``: at most this share of the quantizable layers is kept in float before giving up (a model
    mostly in float is slower than the float deployments it competes with). ``macs_per_image``: the model's MACs
    per image (0: unknown), which a backend plans the cost of its control with. ``int8_ranking``: the original's
    per-block int8 damage (the int8 profile's), which ONNX Runtime's control ranks its blocks by instead of measuring
    each block of the model it builds again (a pruned round keeps its blocks' names; at 260 px the measurement is a
    minute a build).
    """

    images: torch.Tensor
    targets: Sequence[int]
    reference_pred: Sequence[int]
    reference_correct: Sequence[int]
    max_drop_points: float
    same_class: dict[int, int] = field(default_factory=dict)
    max_float_share: float = 0.5
    macs_per_image: int = 0
    int8_ranking: Int8Sensitivity | None = None

    def __post_init__(self) -> None:
        n = len(self.images)
        if not (len(self.targets) == len(self.reference_pred) == len(self.reference_correct) == n) or n == 0:
            raise ValueError(
                f"accuracy control needs one target and one reference answer per image: {n} images, "
                f"{len(self.targets)} targets, {len(self.reference_pred)} reference answers"
            )

    def counts_as(self, predicted: int) -> int:
        """The class a prediction counts as (the first index of a duplicated class name)."""
        return self.same_class.get(int(predicted), int(predicted))

    def correct(self, predictions: Sequence[int]) -> list[int]:
        """1 for each image whose prediction counts as its target class, else 0 (every image, in order)."""
        return [int(self.counts_as(p) == int(t)) for p, t in zip(predictions, self.targets, strict=True)]

    def paired(self, predictions: Sequence[int]) -> PairedAccuracy:
        """The candidate against the original on the validation images."""
        return paired_accuracy(self.reference_correct, self.correct(predictions), self.reference_pred, predictions)

    def holds(self, predictions: Sequence[int]) -> bool:
        """The run's budget test on the validation images: drop + 1 se <= ``max_drop_points``."""
        return within_budget(None, self.max_drop_points, self.paired(predictions))

    def used_points(self, predictions: Sequence[int]) -> float:
        """What the budget test holds against the budget for these predictions (drop + 1 se, points)."""
        used = budget_drop_points(None, self.paired(predictions))
        return float(used) if used is not None else 0.0

    def allowed_int8_drop(self, source_predictions: Sequence[int], tighten: float = 1.0) -> float:
        """The accuracy the int8 model may lose against the float model it is built from (a fraction, as NNCF's
        ``max_drop`` takes it): the budget less what the float source already uses (its drop against the original
        plus 1.25 standard errors, int8 adding a few disagreements of its own), times ``tighten``; at least 0."""
        paired = self.paired(source_predictions)
        used = -paired.delta_points + 1.25 * standard_error_points(paired)
        return max(0.0, (self.max_drop_points - used) * tighten) / 100.0

    def digest(self) -> str:
        """Identifies what the control judges by, for recipe hashes: images, targets, reference, budget."""
        digest = hashlib.sha256()
        data = self.images.detach().cpu().contiguous()
        digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        digest.update(repr((list(self.targets), list(self.reference_pred), list(self.reference_correct))).encode())
        digest.update(repr((self.max_drop_points, sorted(self.same_class.items()), self.max_float_share)).encode())
        return digest.hexdigest()
