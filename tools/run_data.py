"""The run's data: which images a run uses for what, decoded once and preprocessed for the model.

:class:`EvalSpec` names the dataset and the sizes of its disjoint, seeded parts (calibration, evaluation,
holdout, finetune: ``tools.evaluation.datasets.split_indices``). :func:`calibration_batch` and
:func:`finetune_batch` give the preprocessed calibration and distillation images; :func:`preprocess_of`
turns images into the batch the original model expects, each image once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from tools.models.base import build_preprocess
from tools.schemas import InputShape
from tools.store.artifacts import load_original

__all__ = [
    "Calibration",
    "EvalSpec",
    "calibration_batch",
    "finetune_batch",
    "match_dataset_labels",
    "part_sizes",
    "preprocess_of",
]


class EvalSpec(BaseModel):
    """What every evaluation of a run shares: the data, its subset, and how to batch it."""

    dataset: str | None
    split: str | None = None
    label_match: dict[str, Any] | None = None
    samples: int = 500
    calibration_samples: int = 0
    holdout_samples: int = 0
    finetune_samples: int = 0
    seed: int = 0
    batch_size: int = 32
    device: str = "cpu"
    progress: bool = True

    def sizes(self) -> dict[str, int]:
        """Rows of each part besides evaluation (see ``tools.evaluation.datasets.split_indices``)."""
        return {
            "calibration": self.calibration_samples,
            "holdout": self.holdout_samples,
            "finetune": self.finetune_samples,
        }

    def part(self, name: str) -> Any:
        """The decoded rows of one part (calibration, evaluation, holdout, finetune) of this spec's data."""
        if self.dataset is None:
            raise ValueError("no dataset")
        return _dataset(self.dataset, self.split, self.samples, self.seed, name, tuple(sorted(self.sizes().items())))


@functools.lru_cache(maxsize=8)
def _dataset(
    spec: str,
    split: str | None,
    samples: int,
    seed: int,
    part: str = "evaluation",
    sizes: tuple[tuple[str, int], ...] = (),
) -> Any:
    from tools.evaluation.datasets import load_eval_dataset

    return load_eval_dataset(spec, split=split, samples=samples, seed=seed, part=part, sizes=dict(sizes))


def match_dataset_labels(
    original_dir: Path, dataset: str, split: str | None, samples: int, seed: int
) -> dict[str, Any]:
    from tools.evaluation.labels import match_labels

    loaded = load_original(original_dir)
    data = _dataset(dataset, split, samples, seed)
    return match_labels(loaded.id2label, data.label_names).model_dump()


class _MemoPreprocess:
    """Preprocess each image once per process: every candidate of a run sees the same evaluation images."""

    def __init__(self, preprocess: Callable[[list[Any]], torch.Tensor]) -> None:
        self.preprocess = preprocess
        self.done: dict[int, tuple[Any, torch.Tensor]] = {}

    def __call__(self, images: list[Any]) -> torch.Tensor:
        missing = [img for img in images if id(img) not in self.done]
        if missing:
            for img, tensor in zip(missing, self.preprocess(missing), strict=True):
                self.done[id(img)] = (img, tensor)  # the image is kept, so its id stays unique
        return torch.stack([self.done[id(img)][1] for img in images])


_PREPROCESS: dict[tuple[str, tuple[int, int, int]], _MemoPreprocess] = {}


def preprocess_of(original_dir: Path, shape: InputShape) -> Callable[[list[Any]], torch.Tensor]:
    """Images -> batch, as the original model expects them (HF processor, or the factory's options)."""
    key = (str(original_dir.resolve()), shape.as_tuple())
    if key not in _PREPROCESS:
        from tools.models.specs import preprocess_for

        loaded = load_original(original_dir)
        _PREPROCESS.clear()  # one model's images at a time
        _PREPROCESS[key] = _MemoPreprocess(
            preprocess_for(loaded.preprocessing)
            if loaded.preprocessing
            else build_preprocess(loaded.processor, shape.as_tuple())
        )
    return _PREPROCESS[key]


def part_sizes(spec: EvalSpec) -> dict[str, int]:
    """Rows each part of the spec's data holds (calibration, evaluation, holdout, finetune), and ``total``."""
    from tools.evaluation.datasets import split_indices

    total = spec.part("evaluation").size_total if spec.dataset is not None else 0
    parts = split_indices(total, {**spec.sizes(), "evaluation": spec.samples}, spec.seed)
    return {**{name: len(rows) for name, rows in parts.items()}, "total": total} if total else {}


class Calibration(BaseModel):
    """Calibration images, preprocessed for the model, and their labels as model classes where matched."""

    model_config = {"arbitrary_types_allowed": True}

    images: torch.Tensor
    targets: torch.Tensor | None = None


def calibration_batch(
    original_dir: Path, shape: InputShape, spec: EvalSpec, part: str = "calibration"
) -> Calibration | None:
    """The calibration part of the data as one preprocessed batch (None without a dataset or calibration).

    ``targets`` holds the matched model class of each image, -1 for images of unmatched classes (None when
    the model is untrained or no labels were matched).
    """
    if spec.dataset is None or spec.calibration_samples < 1:
        return None
    data = spec.part(part)
    images = preprocess_of(original_dir, shape)(list(data.images))
    targets = None
    if spec.label_match is not None and not load_original(original_dir).untrained:
        mapping = {int(k): int(v) for k, v in (spec.label_match.get("mapping") or {}).items()}
        targets = torch.tensor([mapping.get(int(label), -1) for label in data.labels])
    return Calibration(images=images, targets=targets)


def finetune_batch(original_dir: Path, shape: InputShape, spec: EvalSpec) -> torch.Tensor | None:
    """Unlabelled images for distillation: the calibration images, plus the finetune part when there is one."""
    calibration = calibration_batch(original_dir, shape, spec)
    if calibration is None:
        return None
    if spec.finetune_samples <= spec.calibration_samples:
        return calibration.images
    extra = spec.model_copy(update={"finetune_samples": spec.finetune_samples - spec.calibration_samples})
    more = calibration_batch(original_dir, shape, extra, part="finetune")
    return calibration.images if more is None else torch.cat([calibration.images, more.images])
