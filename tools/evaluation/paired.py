"""Paired accuracy: a candidate against the original, image by image, on the same images.

Two accuracies measured on the same images differ by the mean of the per-image differences
``d_i = c_cand_i - c_ref_i`` (each +1, 0 or -1, where ``c`` is 1 for a correct top-1 prediction). Its
standard error comes from the images on which the two models *disagree*, so it is far smaller than the
error of either accuracy alone: on 1,000 images, a pruned model that changes 20 answers has a standard
error near 0.45 points, where each accuracy alone has about 1 point. :func:`paired_accuracy` gives the
difference in points with its 95 % interval (normal approximation, ``delta ± 1.96 · sd(d) / sqrt(n)``,
sample standard deviation), the agreement of the top-1 predictions, and how many images were gained
and lost.

:class:`ImagePredictions` holds one model's per-image predictions on one part of the data, with the key
that says which model and which images they are; :func:`load_predictions` / :func:`save_predictions`
keep them next to the artifact (``<artifact_dir>.predictions.<part>.json``), so that the original is
run once per part and every candidate is paired with it.

Sequential evaluation: :func:`stop_when_over` gives the rule that ends a candidate's evaluation at a look
(:func:`tools.stats.sequential_looks`) once it is clearly over the accuracy budget; such predictions cover the
first images only (``stopped_early``) and are paired with the original's on those same images.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from tools.clock import counts_as
from tools.evaluation.accuracy import iter_logits
from tools.evaluation.datasets import EvalDataset
from tools.evaluation.labels import LabelMatch
from tools.schemas import PairedAccuracy, PartAccuracy
from tools.stats import Z95, clearly_over_budget, paired_accuracy, sequential_looks, standard_error_points
from tools.store.files import META_FILE, atomic_write_json, read_json

logger = logging.getLogger(__name__)

__all__ = [
    "Z95",
    "ImagePredictions",
    "PartAccuracy",
    "StopRule",
    "adopt_predictions",
    "load_predictions",
    "pair",
    "paired_accuracy",
    "part_accuracy",
    "predict_part",
    "prediction_key",
    "predictions_for",
    "predictions_path",
    "save_predictions",
    "standard_error_points",
    "stop_when_over",
]

#: A sequential evaluation's stopping rule: given the predictions and correctness so far, whether to stop.
StopRule = Callable[[list[int], list[int]], bool]


def part_accuracy(
    part: str, candidate: ImagePredictions, reference: ImagePredictions, paired: PairedAccuracy | None
) -> PartAccuracy:
    """``candidate``'s accuracy on ``part``, with ``reference``'s (the original's) on the same images."""
    base, acc = reference.accuracy, candidate.accuracy
    drop = None if base is None or acc is None else round(100.0 * (base - acc), 4)
    return PartAccuracy(
        part=part,
        accuracy=acc,
        samples=candidate.samples,
        baseline_accuracy=base,
        accuracy_drop_points=drop,
        paired=paired,
    )


# --- per-image predictions ---------------------------------------------------------------------------


class ImagePredictions(BaseModel):
    """One model's top-1 prediction and its correctness (1/0) on each image of one part of the data.

    Only images of matched classes are run (as for the accuracy). ``key`` says which model and which images
    these are: predictions are paired, or reused, only under an equal key (``spec`` is for people).
    """

    key: dict[str, Any]
    spec: dict[str, Any] = Field(default_factory=dict)
    predictions: list[int]
    correct: list[int]
    stopped_early: bool = Field(
        default=False,
        description="Evaluation stopped at a look, clearly over the accuracy budget: the first images only.",
    )

    @field_validator("key", "spec")
    @classmethod
    def _json_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        """As they read back from JSON (int keys as strings, tuples as lists), so that keys compare equal."""
        return _as_json(value)

    @property
    def samples(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None

    def images_key(self) -> dict[str, Any]:
        """The part of the key that names the images (not the model): what two paired results must share."""
        return {k: v for k, v in self.key.items() if k not in ("artifact", "answers")}


def pair(reference: ImagePredictions, candidate: ImagePredictions) -> PairedAccuracy:
    """:func:`paired_accuracy` of two models' predictions on the same images (refused otherwise)."""
    if reference.images_key() != candidate.images_key():
        raise ValueError("the two models were evaluated on different images: they cannot be paired")
    n = candidate.samples if candidate.stopped_early else reference.samples  # a stopped one: its first images
    return paired_accuracy(reference.correct[:n], candidate.correct, reference.predictions[:n], candidate.predictions)


def merge_halves(
    halves: tuple[list[int], list[int]],
    labels: list[int],
    matched: Callable[[int], bool],
    parts: list[ImagePredictions],
) -> tuple[list[int], list[int]]:
    """One set of answers for a whole part from answers on its two halves: ``parts[h]`` holds the answers on the
    images of ``halves[h]`` (positions in the part, ascending) whose label is ``matched``, in that order; the
    result holds them in the order of the whole part's matched images (as a model run on it would give them)."""
    half_of = {position: h for h, positions in enumerate(halves) for position in positions}
    wanted = [sum(1 for position in positions if matched(labels[position])) for positions in halves]
    if wanted != [part.samples for part in parts]:
        raise ValueError("the answers on the halves do not match the halves' images")
    taken = [0 for _ in halves]
    predictions: list[int] = []
    correct: list[int] = []
    for position, label in enumerate(labels):
        if not matched(label):
            continue
        h = half_of[position]
        predictions.append(parts[h].predictions[taken[h]])
        correct.append(parts[h].correct[taken[h]])
        taken[h] += 1
    return predictions, correct


def stop_when_over(reference: ImagePredictions | None, budget_points: float | None) -> StopRule | None:
    """The rule that stops a candidate's evaluation once it is clearly over ``budget_points`` against ``reference``
    (the original's predictions on the same images; :func:`tools.stats.clearly_over_budget`); None without either."""
    if reference is None or budget_points is None:
        return None

    def over(predictions: list[int], correct: list[int]) -> bool:
        n = len(correct)
        paired = paired_accuracy(reference.correct[:n], correct, reference.predictions[:n], predictions)
        return clearly_over_budget(paired, budget_points)

    return over


@counts_as("evaluate")
def predict_part(
    model: Callable[..., Any],
    preprocess: Callable[[list[Any]], Any],
    dataset: EvalDataset,
    match: LabelMatch,
    *,
    batch_size: int = 32,
    device: str = "cpu",
    progress: bool = True,
    desc: str = "evaluate",
    stop: StopRule | None = None,
    answers: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Top-1 predictions and their correctness for the images of matched classes, in dataset order.

    The same rule as :func:`tools.evaluation.accuracy.evaluate_accuracy`: the argmax over all model
    classes, correct when it is the model class the image's dataset class was matched to. ``stop`` is asked at
    each look of :func:`tools.stats.sequential_looks` (the first batch end past it); True ends the evaluation there.
    An unlabelled dataset (``match.unlabelled``) has the original's top-1 ``answers`` (its predictions on the same
    images) as targets; without them the model is the original itself, and each of its answers is its own target.
    """
    keep = [i for i, label in enumerate(dataset.labels) if label in match.mapping]
    images = [dataset.images[i] for i in keep]
    targets: list[int] | None = [match.mapping[dataset.labels[i]] for i in keep]
    if match.unlabelled:
        targets = None if answers is None else list(answers)
        if targets is not None and len(targets) != len(images):
            raise ValueError(f"{len(targets)} answers of the original for {len(images)} images")
    looks: Sequence[int] = sequential_looks(len(images)) if stop is not None else ()
    predictions: list[int] = []
    correct: list[int] = []
    batches = iter_logits(model, preprocess, images, batch_size=batch_size, device=device, progress=progress, desc=desc)
    for logits in batches:
        seen = len(predictions)
        predictions.extend(int(p) for p in logits.argmax(dim=-1))
        fresh = predictions[seen:]
        if targets is None:  # the original on an unlabelled dataset: its answers are the targets
            correct.extend(1 for _ in fresh)
        else:
            wanted = targets[seen : len(predictions)]
            same = match.counts_as if match.unlabelled else int  # an answer of a duplicated class counts as its first
            correct.extend(int(match.counts_as(p) == same(t)) for p, t in zip(fresh, wanted, strict=True))
        if stop is not None and any(seen < look <= len(predictions) for look in looks) and stop(predictions, correct):
            batches.close()
            logger.info("%s: clearly over the accuracy budget after %d of %d images", desc, len(correct), len(images))
            break
    if correct:
        logger.info("%s: accuracy %.4f on %d samples", desc, sum(correct) / len(correct), len(correct))
    return predictions, correct


def prediction_key(
    artifact_dir: Path, dataset: str, part: str, data: EvalDataset, label_mapping: dict[Any, Any] | None
) -> dict[str, Any]:
    """What decides an artifact's predictions on a part: its files as written, the rows, the label mapping."""
    from tools.artifacts.io import deployed_files

    artifact_dir = Path(artifact_dir)
    files = [artifact_dir / META_FILE, *deployed_files(artifact_dir)]
    return _as_json(
        {
            "artifact": {
                "path": str(artifact_dir.resolve()),
                "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files],
            },
            "dataset": dataset,
            "split": data.split,
            "part": part,
            "rows_total": data.size_total,
            "indices": list(data.indices),
            "label_mapping": label_mapping,
        }
    )


def predictions_for(
    artifact_dir: Path,
    part: str,
    data: EvalDataset,
    spec: dict[str, Any],
    preprocess: Callable[[list[Any]], Any],
    load: Callable[[], Callable[..., Any]],
    *,
    device: str = "cpu",
    desc: str = "evaluate",
    stop: StopRule | None = None,
    answers: Sequence[int] | None = None,
) -> ImagePredictions:
    """An artifact's predictions on ``data`` (the rows of ``part``), from its predictions file when that was
    written for the same artifact files, rows and label mapping; else run (``load()`` gives the model) and saved.
    ``stop``: sequential evaluation's rule (:func:`stop_when_over`); predictions it stopped are reused only by a
    caller whose rule stops them too. ``answers``: the original's predictions, the targets of an unlabelled dataset
    (:func:`predict_part`; part of the predictions' key).

    ``spec``: the ``EvalSpec`` fields (``dataset``, ``label_match``, what chose the rows, ``batch_size``,
    ``progress``); those that choose the images are kept with the predictions.
    """
    mapping = (spec.get("label_match") or {}).get("mapping")
    key = prediction_key(artifact_dir, str(spec.get("dataset")), part, data, mapping)
    if answers is not None:
        key["answers"] = _answers_key(answers)
    path = predictions_path(artifact_dir, part)
    cached = load_predictions(path, key)
    if cached is not None and (
        not cached.stopped_early or (stop is not None and stop(cached.predictions, cached.correct))
    ):
        return cached  # stopped predictions serve only a rule that stops them too (the same budget or a tighter one)
    match = LabelMatch.model_validate(spec.get("label_match"))
    batch_size, progress = int(spec.get("batch_size", 32)), bool(spec.get("progress", False))
    preds, correct = predict_part(
        load(),
        preprocess,
        data,
        match,
        batch_size=batch_size,
        device=device,
        progress=progress,
        desc=desc,
        stop=stop,
        answers=answers,
    )
    stopped = len(preds) < sum(1 for label in data.labels if label in match.mapping)
    result = ImagePredictions(key=key, spec=_shown(spec), predictions=preds, correct=correct, stopped_early=stopped)
    save_predictions(path, result)
    return result


def adopt_predictions(
    artifact_dir: Path, part: str, data: EvalDataset, spec: dict[str, Any], source: ImagePredictions, how: str
) -> ImagePredictions:
    """``source``'s predictions saved as ``artifact_dir``'s on ``part`` (:func:`predictions_for` then reads them):
    for a float runtime of the same model whose outputs were checked to match (``how`` says how closely)."""
    mapping = (spec.get("label_match") or {}).get("mapping")
    key = prediction_key(artifact_dir, str(spec.get("dataset")), part, data, mapping)
    result = ImagePredictions(
        key=key,
        spec=_shown(spec) | {"adopted": how},
        predictions=list(source.predictions),
        correct=list(source.correct),
    )
    save_predictions(predictions_path(artifact_dir, part), result)
    return result


def _answers_key(answers: Sequence[int]) -> str:
    """A short fingerprint of the original's answers (they decide an unlabelled dataset's correctness)."""
    import hashlib

    return hashlib.sha256(",".join(str(int(a)) for a in answers).encode()).hexdigest()[:16]


def _shown(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("label_match", "batch_size", "device", "progress")}


def predictions_path(artifact_dir: Path, part: str) -> Path:
    """Where an artifact's predictions on ``part`` live: beside the artifact directory, not inside it."""
    artifact_dir = Path(artifact_dir)
    return artifact_dir.with_name(f"{artifact_dir.name}.predictions.{part}.json")


def load_predictions(path: Path, key: dict[str, Any]) -> ImagePredictions | None:
    """The predictions saved at ``path`` when their key equals ``key`` (None: absent, unreadable or stale)."""
    if not path.is_file():
        return None
    try:
        saved = ImagePredictions.model_validate(read_json(path))
    except (OSError, ValueError, ValidationError):
        logger.warning("ignoring unreadable predictions %s", path)
        return None
    if saved.key != _as_json(key) or len(saved.predictions) != len(saved.correct):
        logger.info("predictions %s are for another model or other images: recomputing", path)
        return None
    return saved


def save_predictions(path: Path, predictions: ImagePredictions) -> None:
    atomic_write_json(path, predictions.model_dump(mode="json"))


def _as_json(value: Any) -> Any:
    loaded: Any = json.loads(json.dumps(value, default=str))
    return loaded
