"""Running a classifier on images and counting its accuracy.

:func:`iter_logits` / :func:`predict_logits` run a model (eval mode, ``torch.no_grad``) over
preprocessed batches. The prediction is always the argmax over all model classes; a sample counts as
correct when that argmax is the model class its dataset class was matched to (see
:mod:`tools.evaluation.labels`; a model class whose name repeats counts as the first of that name), and samples
of unmatched classes are left out of the accuracy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from tqdm import tqdm

from tools.clock import counts_as
from tools.evaluation.common import EvaluationError, eval_mode
from tools.evaluation.datasets import EvalDataset
from tools.evaluation.labels import LabelMatch
from tools.models.base import logits_of

logger = logging.getLogger(__name__)

__all__ = [
    "Preprocess",
    "accuracy_from_predictions",
    "chance_note",
    "evaluate_accuracy",
    "iter_logits",
    "predict_logits",
    "prediction_agreement",
]

Preprocess = Callable[[list[Image.Image]], Any]


def _logits_of(output: Any) -> torch.Tensor:
    try:
        return logits_of(output)
    except TypeError as exc:
        raise EvaluationError(str(exc)) from exc


def _as_batch(prepared: Any) -> torch.Tensor:
    if isinstance(prepared, torch.Tensor):
        return prepared
    if isinstance(prepared, Mapping) and isinstance(prepared.get("pixel_values"), torch.Tensor):
        return prepared["pixel_values"]
    raise EvaluationError(
        f"preprocess returned {type(prepared).__name__}: return a tensor (or a dict with pixel_values)"
    )


def _float_dtype(model: Any) -> torch.dtype | None:
    if isinstance(model, nn.Module):
        for param in model.parameters():
            if param.is_floating_point():
                return param.dtype
    return None


def iter_logits(
    model: Callable[..., Any],
    preprocess: Preprocess,
    images: Sequence[Image.Image],
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "predict",
) -> Generator[torch.Tensor, None, None]:
    """Logits (on CPU, float) of ``images`` in batches of ``batch_size``, under ``torch.no_grad``.

    Not ``inference_mode``: a cache a model fills on its first call (BEiT keeps its relative-position index in a
    process-wide LRU cache) would then hold an inference tensor, and tracing the model for pruning would fail.

    The model must already be on ``device``; the preprocessed batches are moved there.
    """
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, not {batch_size}")
    target = torch.device(device)
    dtype = _float_dtype(model)
    with (
        eval_mode([model]),
        torch.no_grad(),
        tqdm(total=len(images), desc=desc, unit="img", disable=not progress, leave=False) as bar,
    ):
        for start in range(0, len(images), batch_size):
            chunk = list(images[start : start + batch_size])
            batch = _as_batch(preprocess(chunk)).to(target)
            if dtype is not None and batch.is_floating_point() and batch.dtype != dtype:
                batch = batch.to(dtype)
            logits = _logits_of(model(batch))
            if logits.ndim != 2 or logits.shape[0] != len(chunk):
                raise EvaluationError(
                    f"model returned logits of shape {tuple(logits.shape)} for a batch of {len(chunk)}: "
                    "expected (batch, classes)"
                )
            bar.update(len(chunk))
            yield logits.detach().float().cpu()


@counts_as("evaluate")
def predict_logits(
    model: Callable[..., Any],
    preprocess: Preprocess,
    images: Sequence[Image.Image] | EvalDataset,
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = False,
    desc: str = "predict",
) -> torch.Tensor:
    """All logits as one (N, classes) CPU float tensor; N = 0 gives an empty (0, 0) tensor."""
    items = images.images if isinstance(images, EvalDataset) else images
    chunks = list(
        iter_logits(model, preprocess, items, batch_size=batch_size, device=device, progress=progress, desc=desc)
    )
    return torch.cat(chunks) if chunks else torch.empty(0, 0)


def accuracy_from_predictions(
    predictions: Sequence[int] | torch.Tensor, labels: Sequence[int], match: LabelMatch
) -> tuple[float | None, int]:
    """(fraction correct, samples counted) over samples whose dataset class is matched; (None, 0) if none."""
    preds = predictions.tolist() if isinstance(predictions, torch.Tensor) else list(predictions)
    if len(preds) != len(labels):
        raise EvaluationError(f"{len(preds)} predictions for {len(labels)} labels: they must align")
    counted = correct = 0
    for pred, label in zip(preds, labels, strict=True):
        target = match.mapping.get(int(label))
        if target is None:
            continue
        counted += 1
        correct += int(match.counts_as(int(pred)) == target)
    return (correct / counted if counted else None), counted


def prediction_agreement(logits_a: torch.Tensor, logits_b: torch.Tensor) -> float:
    """Fraction of samples with the same top-1 class under both logits (fidelity of a compressed model)."""
    if logits_a.shape[0] != logits_b.shape[0]:
        raise EvaluationError(f"logits of {logits_a.shape[0]} vs {logits_b.shape[0]} samples: must align")
    if logits_a.shape[0] == 0:
        return 1.0
    return float((logits_a.argmax(-1) == logits_b.argmax(-1)).float().mean())


@counts_as("evaluate")
def evaluate_accuracy(
    model: Callable[..., Any],
    preprocess: Preprocess,
    dataset: EvalDataset,
    match: LabelMatch,
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "evaluate",
) -> tuple[float | None, int]:
    """Top-1 accuracy over the samples of matched classes: (fraction, samples counted), or (None, 0).

    The prediction is the argmax over all model classes; samples of unmatched classes are not run.
    """
    keep = [i for i, label in enumerate(dataset.labels) if label in match.mapping]
    if len(keep) < len(dataset.labels):
        logger.info(
            "%d of %d samples belong to unmatched classes and are left out",
            len(dataset.labels) - len(keep),
            len(dataset.labels),
        )
    images = [dataset.images[i] for i in keep]
    labels = [dataset.labels[i] for i in keep]
    predictions: list[int] = []
    for logits in iter_logits(
        model, preprocess, images, batch_size=batch_size, device=device, progress=progress, desc=desc
    ):
        predictions.extend(int(p) for p in logits.argmax(dim=-1))
    accuracy, counted = accuracy_from_predictions(predictions, labels, match)
    shown = "n/a" if accuracy is None else f"{accuracy:.4f}"
    logger.info("%s: accuracy %s on %d samples", desc, shown, counted)
    return accuracy, counted


def chance_note(accuracy: float | None, samples: int, classes: int, budget_points: float | None = None) -> str | None:
    """A note when ``accuracy`` is not clearly above chance (1/classes, one-sided 99.5 %): untrained or mislabelled.
    With ``budget_points`` (the accuracy budget), also when it is so near chance that a candidate answering at random,
    which loses ``accuracy - chance``, would pass that budget (within its 99.5 % margin): EfficientNet-Lite0 with its
    class list off by one scored 0.8 % on 375 images of 500 ImageNet classes, clearly above their 0.2 %, and every
    candidate could have lost at most 0.8 points."""
    if accuracy is None or samples <= 0 or classes < 2:
        return None
    chance = 1.0 / classes
    margin = 2.58 * math.sqrt(accuracy * (1 - accuracy) / samples)
    near = budget_points is not None and 100 * (accuracy - chance - margin) <= budget_points
    if accuracy > chance + 2.58 * math.sqrt(chance * (1 - chance) / samples) and not near:
        return None
    return (
        f"the original model scores {100 * accuracy:.1f}% on {samples} images, near chance for {classes} classes "
        f"({100 * chance:.1f}%): it looks untrained, or its labels do not match the dataset's; accuracy "
        "changes say nothing about what pruning costs"
    )
