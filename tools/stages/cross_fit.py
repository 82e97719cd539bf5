"""Distillation after the search, cross-fitted: a saved pruned model distilled twice from the original, each student
on the calibration images plus one half of the evaluation images and judged on the other half, their answers merged
into one paired result on the whole evaluation part (``agents.distillation`` runs it on rounds over the budget).

A round that removes whole blocks beyond a round distilled before it (the depth ladder's next step) may start its
students from that round's students, each from the one distilled on the same half, with the further blocks removed
(``starts``): they never saw the half they are judged on either. Measured on CIFAR ResNet-56 (one Xeon core, bf16,
900 steps, judged on the half it did not see / on 5,000 images no run saw): eight blocks distilled from the round
that removed them lost 0.36 / 0.86 points; the same eight from the five-block round's student (+0.56 / +0.08), its
three further blocks removed (-54 points before training), gained 0.61 / 0.54."""

from __future__ import annotations

import logging
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from torch import nn

from tools.artifacts.hashes import distill_recipe_hash, stale_reason
from tools.artifacts.io import is_complete, load_compressed, load_original, save_compressed
from tools.artifacts.structure import blocks_added
from tools.clock import work
from tools.compression.kinds.blocks import SkippedBlock
from tools.compression.shortcuts import replace_module
from tools.schemas import CrossFitStudent, InputShape, PairedAccuracy
from tools.stages.ops import calibration_batch, evaluate_accuracy_on, extra_batch, predictions_on
from tools.stages.run_data import EvalSpec, record_reads
from tools.stats import paired_accuracy
from tools.store.files import read_json

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig
    from tools.evaluation.paired import ImagePredictions

logger = logging.getLogger(__name__)


def _structure(artifact_dir: Path) -> dict[str, dict[str, Any]]:
    structure: dict[str, dict[str, Any]] = read_json(artifact_dir / "artifact.json").get("structure") or {}
    return structure


def extends_by_blocks(source_dir: Path, start_dir: Path) -> bool:
    """Whether the saved pruned model at ``source_dir`` is the one at ``start_dir`` with further blocks removed whole
    and nothing else changed (``structure.blocks_added``): a student may start from ``start_dir``'s model."""
    return blocks_added(_structure(source_dir), _structure(start_dir)) is not None


def _student(source_dir: Path, start: Path | None) -> nn.Module:
    """The model a student starts from: the saved one at ``source_dir``, or the one at ``start`` with the blocks
    ``source_dir``'s removes beyond it removed (:func:`extends_by_blocks`)."""
    added = None if start is None else blocks_added(_structure(source_dir), _structure(start))
    if start is not None and added is None:
        raise ValueError(f"{source_dir} is not {start} with further blocks removed: its students cannot start there")
    model = load_compressed(start or source_dir)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{start or source_dir} did not load as a torch module")
    for name, layout in (added or {}).items():
        replace_module(model, name, SkippedBlock(layout))
    return model


def distill_saved(
    source_dir: Path,
    original_dir: Path,
    out_dir: Path,
    images: torch.Tensor,
    config: DistillConfig,
    start: Path | None = None,
) -> dict[str, Any]:
    """Distil a copy of the saved pruned model at ``source_dir`` against the original on ``images`` and save it
    in ``out_dir`` (a pruned artifact whose recipe is the source's plus ``distilled``); returns what distillation
    did (``DistillReport``). ``start``: a saved model the source extends by blocks removed (:func:`extends_by_blocks`)
    that the student starts from instead. A complete artifact of the same recipe (``distill_recipe_hash``) is
    reused."""
    from tools.compression.distill import distill_

    key = distill_recipe_hash(source_dir, config, images, start)
    stale = stale_reason(out_dir, key)
    if is_complete(out_dir) and stale is None:
        saved = dict(read_json(out_dir / "artifact.json")["recipe"]["distilled"])
        return {k: v for k, v in saved.items() if k not in ("source", "start")}  # as a fresh distillation reports it
    if stale is not None:
        logger.warning("rebuilding the distilled model: %s", stale)
    model = _student(source_dir, start)
    original = load_original(original_dir).model.eval()
    done = distill_(model, original, images, config).model_dump()
    origin = {"source": str(source_dir), **({"start": str(start)} if start is not None else {})}
    recipe = {**read_json(source_dir / "artifact.json")["recipe"], "distilled": {**done, **origin}}
    save_compressed(model, out_dir, base_dir=original_dir, kind="pruned", recipe=recipe, recipe_key=key)
    return done


#: One student's training: :func:`distill_saved`'s arguments.
_Job = tuple[Path, Path, Path, torch.Tensor, "DistillConfig", Path | None]


def _distil_both(jobs: list[_Job], workers: int) -> list[dict[str, Any]]:
    """Each student's training (:func:`distill_saved`), in order: one after the other, or with ``workers`` of two or
    more side by side, the second in a spawned process (its images shared, not copied), each on half the threads:
    a small model's steps use one core no better than two, so the pair takes the time of one student."""
    if workers < 2 or len(jobs) < 2:
        return [distill_saved(*job) for job in jobs]
    threads, half = torch.get_num_threads(), max(1, workers // 2)
    context = torch.multiprocessing.get_context("spawn")
    with (
        work("distil"),
        ProcessPoolExecutor(1, mp_context=context, initializer=torch.set_num_threads, initargs=(half,)) as pool,
    ):
        second = pool.submit(distill_saved, *jobs[1])
        torch.set_num_threads(max(1, workers - half))
        try:
            first = distill_saved(*jobs[0])
        finally:
            torch.set_num_threads(threads)
        return [first, second.result(), *(distill_saved(*job) for job in jobs[2:])]


def _judged_student(out_dir: Path, half: int | None, judged: Any, distilled: dict[str, Any]) -> CrossFitStudent:
    """A student saved at ``out_dir`` as judged (an ``evaluate_accuracy_on`` result) on ``half`` (None: every
    evaluation image), with what its distillation did."""
    return CrossFitStudent(
        artifact=str(out_dir),
        judged_on_half=half,
        accuracy=judged.accuracy,
        samples=judged.samples,
        paired=judged.paired,
        distilled=distilled,
    )


def solo(spec: EvalSpec, extra_images: int, evaluation_images: int) -> bool:
    """Whether a distillation after the search trains one student on the fit images only (:func:`distil_solo`)
    instead of two on halves of the evaluation images: where the run's extra images (``extra_images`` of them, read
    as fit) are at least as many as a half of the ``evaluation_images`` would add. The choose images then only
    choose, and the one student takes the time of two (twice the steps)."""
    return spec.extra_images is not None and extra_images >= evaluation_images // 2 > 0


class CrossFitResult(BaseModel):
    """:func:`cross_fit_distill`'s answer: each student and the merged paired result on the whole evaluation part."""

    students: list[CrossFitStudent]
    images_per_student: int
    accuracy: float | None
    samples: int
    paired: PairedAccuracy | None


def distil_solo(
    source_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    out_dir: Path,
    config: DistillConfig,
    start: Path | None = None,
) -> CrossFitResult:
    """Distil the saved pruned model at ``source_dir`` once (``out_dir``), on the calibration and extra images only,
    and judge the student on the whole evaluation part (:func:`solo`): no image it is judged on trained it.
    ``start``: the student starts from that saved model instead (a depth ladder's step)."""
    whole = spec.whole().model_copy(update={"stop_beyond_points": None})
    calibration = calibration_batch(original_dir, shape, whole)
    extra = extra_batch(original_dir, shape, whole)
    if calibration is None or extra is None or whole.label_match is None:
        raise ValueError("distillation on the fit images needs calibration images, extra images and labels")
    images = torch.cat([calibration.images, extra])
    done = distill_saved(source_dir, original_dir, out_dir, images, config, start)
    judged = evaluate_accuracy_on(out_dir, original_dir, shape, whole, "evaluation", "student")
    if judged is None:
        raise ValueError("distillation on the fit images needs a trained model and a labelled dataset")
    return CrossFitResult(
        students=[_judged_student(out_dir, None, judged, done)],
        images_per_student=len(images),
        accuracy=judged.accuracy,
        samples=judged.samples,
        paired=judged.paired,
    )


def _judge_students(
    out_dirs: tuple[Path, Path], trainings: list[dict[str, Any]], original_dir: Path, shape: InputShape, whole: EvalSpec
) -> tuple[list[CrossFitStudent], dict[int, ImagePredictions]]:
    """Each student saved in ``out_dirs`` (what its distillation did: ``trainings``) judged on the half of the
    evaluation images it was not distilled on: the students, and their answers by the half they answered."""
    students: list[CrossFitStudent] = []
    answers: dict[int, ImagePredictions] = {}
    for trained, (out_dir, judged) in enumerate(zip(out_dirs, (1, 0), strict=True)):
        done = trainings[trained]
        half = whole.model_copy(update={"evaluation_half": judged})
        part = evaluate_accuracy_on(out_dir, original_dir, shape, half, "evaluation", f"student {trained}")
        predictions = predictions_on(out_dir, original_dir, shape, half, "evaluation")
        if part is None or predictions is None:
            raise ValueError("cross-fitted distillation needs a trained model and a labelled dataset")
        answers[judged] = predictions
        students.append(_judged_student(out_dir, judged, part, done))
    return students, answers


def cross_fit_distill(
    source_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    out_dirs: tuple[Path, Path],
    config: DistillConfig,
    starts: tuple[Path, Path] | None = None,
) -> CrossFitResult:
    """Distil the saved pruned model at ``source_dir`` twice (``out_dirs``), each time on the calibration images (and
    the run's extra images, ``--extra-images``) plus one half of the evaluation images
    (``tools.evaluation.datasets.evaluation_halves``), judge each student on the
    half it did not see, and merge their answers into a paired result on the whole evaluation part: an estimate of
    what distilling this model gives that takes no image it is judged on. The first student is distilled on half
    0 and judged on half 1. ``starts``: each student starts from that saved model instead (see the module doc; the
    first distilled on half 0 too). With two threads or more (the run's ``--threads``, torch's) the students train
    side by side (:func:`_distil_both`)."""
    from tools.evaluation.datasets import evaluation_halves
    from tools.evaluation.labels import LabelMatch
    from tools.evaluation.paired import merge_halves

    whole = spec.whole().model_copy(update={"stop_beyond_points": None})
    calibration = calibration_batch(original_dir, shape, whole)
    evaluation = calibration_batch(original_dir, shape, whole, part="evaluation")
    if calibration is None or evaluation is None or whole.label_match is None:
        raise ValueError("cross-fitted distillation needs calibration images and labelled evaluation images")
    halves = evaluation_halves(len(evaluation.images), whole.seed)
    extra = extra_batch(original_dir, shape, whole)
    fit = calibration.images if extra is None else torch.cat([calibration.images, extra])
    rows = list(whole.part("evaluation").indices)
    jobs: list[_Job] = []
    for trained, out_dir in enumerate(out_dirs):
        images = torch.cat([fit, evaluation.images[halves[trained]]])
        record_reads(whole, "fit", [rows[i] for i in halves[trained]])  # these choose images train a student too
        jobs.append((source_dir, original_dir, out_dir, images, config, starts[trained] if starts else None))
    trainings = _distil_both(jobs, torch.get_num_threads())
    students, answers = _judge_students(out_dirs, trainings, original_dir, shape, whole)
    reference = predictions_on(original_dir, original_dir, shape, whole, "evaluation", "original")
    if reference is None:
        raise ValueError("cross-fitted distillation needs the original's answers on the evaluation images")
    match = LabelMatch.model_validate(whole.label_match)
    labels = list(whole.part("evaluation").labels)
    merged, correct = merge_halves(halves, labels, lambda label: label in match.mapping, [answers[0], answers[1]])
    paired = paired_accuracy(reference.correct, correct, reference.predictions, merged)
    return CrossFitResult(
        students=students,
        images_per_student=len(fit) + len(halves[0]),
        accuracy=sum(correct) / len(correct) if correct else None,
        samples=len(correct),
        paired=paired,
    )
