"""Distillation after the search, cross-fitted: a saved pruned model distilled twice from the original, each student
on the calibration images plus one half of the evaluation images and judged on the other half, their answers merged
into one paired result on the whole evaluation part (``agents.distillation`` runs it on rounds over the budget)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from torch import nn

from tools.artifacts.hashes import distill_recipe_hash, stale_reason
from tools.artifacts.io import is_complete, load_compressed, load_original, save_compressed
from tools.ops import calibration_batch, evaluate_accuracy_on, predictions_on
from tools.run_data import EvalSpec
from tools.schemas import CrossFitStudent, InputShape, PairedAccuracy
from tools.stats import paired_accuracy
from tools.store.files import read_json

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig
    from tools.evaluation.paired import ImagePredictions

logger = logging.getLogger(__name__)


def distill_saved(
    source_dir: Path, original_dir: Path, out_dir: Path, images: torch.Tensor, config: DistillConfig
) -> dict[str, Any]:
    """Distil a copy of the saved pruned model at ``source_dir`` against the original on ``images`` and save it
    in ``out_dir`` (a pruned artifact whose recipe is the source's plus ``distilled``); returns what distillation
    did (``DistillReport``). A complete artifact of the same recipe (``distill_recipe_hash``) is reused."""
    from tools.compression.distill import distill_

    key = distill_recipe_hash(source_dir, config, images)
    stale = stale_reason(out_dir, key)
    if is_complete(out_dir) and stale is None:
        saved = dict(read_json(out_dir / "artifact.json")["recipe"]["distilled"])
        return {k: v for k, v in saved.items() if k != "source"}  # as a fresh distillation reports it
    if stale is not None:
        logger.warning("rebuilding the distilled model: %s", stale)
    model = load_compressed(source_dir)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{source_dir} did not load as a torch module")
    original = load_original(original_dir).model.eval()
    done = distill_(model, original, images, config).model_dump()
    recipe = {**read_json(source_dir / "artifact.json")["recipe"], "distilled": {**done, "source": str(source_dir)}}
    save_compressed(model, out_dir, base_dir=original_dir, kind="pruned", recipe=recipe, recipe_key=key)
    return done


class CrossFitResult(BaseModel):
    """:func:`cross_fit_distill`'s answer: each student and the merged paired result on the whole evaluation part."""

    students: list[CrossFitStudent]
    images_per_student: int
    accuracy: float | None
    samples: int
    paired: PairedAccuracy | None


def cross_fit_distill(
    source_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    out_dirs: tuple[Path, Path],
    config: DistillConfig,
) -> CrossFitResult:
    """Distil the saved pruned model at ``source_dir`` twice (``out_dirs``), each time on the calibration images plus
    one half of the evaluation images (``tools.evaluation.datasets.evaluation_halves``), judge each student on the
    half it did not see, and merge their answers into a paired result on the whole evaluation part: an estimate of
    what distilling this model gives that takes no image it is judged on. The first student is distilled on half
    0 and judged on half 1."""
    from tools.evaluation.datasets import evaluation_halves
    from tools.evaluation.labels import LabelMatch
    from tools.evaluation.paired import merge_halves

    whole = spec.whole().model_copy(update={"stop_beyond_points": None})
    calibration = calibration_batch(original_dir, shape, whole)
    evaluation = calibration_batch(original_dir, shape, whole, part="evaluation")
    if calibration is None or evaluation is None or whole.label_match is None:
        raise ValueError("cross-fitted distillation needs calibration images and labelled evaluation images")
    halves = evaluation_halves(len(evaluation.images), whole.seed)
    students: list[CrossFitStudent] = []
    answers: dict[int, ImagePredictions] = {}
    for trained, (out_dir, judged) in enumerate(zip(out_dirs, (1, 0), strict=True)):
        images = torch.cat([calibration.images, evaluation.images[halves[trained]]])
        done = distill_saved(source_dir, original_dir, out_dir, images, config)
        half = whole.model_copy(update={"evaluation_half": judged})
        part = evaluate_accuracy_on(out_dir, original_dir, shape, half, "evaluation", f"student {trained}")
        predictions = predictions_on(out_dir, original_dir, shape, half, "evaluation")
        if part is None or predictions is None:
            raise ValueError("cross-fitted distillation needs a trained model and a labelled dataset")
        answers[judged] = predictions
        students.append(
            CrossFitStudent(
                artifact=str(out_dir),
                judged_on_half=judged,
                accuracy=part.accuracy,
                samples=part.samples,
                paired=part.paired,
                distilled=done,
            )
        )
    reference = predictions_on(original_dir, original_dir, shape, whole, "evaluation", "original")
    if reference is None:
        raise ValueError("cross-fitted distillation needs the original's answers on the evaluation images")
    match = LabelMatch.model_validate(whole.label_match)
    labels = list(whole.part("evaluation").labels)
    merged, correct = merge_halves(halves, labels, lambda label: label in match.mapping, [answers[0], answers[1]])
    paired = paired_accuracy(reference.correct, correct, reference.predictions, merged)
    return CrossFitResult(
        students=students,
        images_per_student=len(calibration.images) + len(halves[0]),
        accuracy=sum(correct) / len(correct) if correct else None,
        samples=len(correct),
        paired=paired,
    )
