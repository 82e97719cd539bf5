"""The run's data: which images a run uses for what, decoded once and preprocessed for the model.

:class:`EvalSpec` names the dataset and the sizes of its disjoint, seeded parts, each with one job: *fit*
(calibration and finetune: importance, recovery, calibration, distillation), *choose* (evaluation: every comparison
that decides) and *confirm* (the one build that ships, once: ``tools.evaluation.datasets.split_indices``). The
confirm part is sealed: reading it outside :func:`confirming` raises :class:`ConfirmSealed`, and every read of any
part is recorded (:class:`DataReads`), so that the report's disjointness is what was read, not what was planned.
:func:`calibration_batch` and :func:`finetune_batch` give the preprocessed calibration and distillation images;
:func:`preprocess_of` turns images into the batch the original model expects (greyscale or colour as the model
takes them), each image once per process. :func:`check_data` decodes the parts a run uses once, up front: images
that cannot be decoded are left out of every part and named, and too many of them stop the run with a one-line error
(the confirm part's are found, and left out, when it is read).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, Field

from tools.artifacts.io import load_original
from tools.deploy.pytorch import FLOAT
from tools.models.base import build_preprocess
from tools.schemas import InputShape
from tools.stats import images_needed
from tools.store.reads import DataReads, read_log, record_rows

__all__ = [
    "AUTO_EVAL_SAMPLES",
    "EXTRA_IMAGE_BYTES",
    "ROLES",
    "Calibration",
    "ConfirmSealed",
    "DataCheck",
    "DataReads",
    "EvalSpec",
    "auto_eval_samples",
    "calibration_batch",
    "check_data",
    "check_extra_images",
    "confirming",
    "extra_batch",
    "extra_images_used",
    "extra_limit",
    "finetune_batch",
    "first_evaluated_images",
    "match_dataset_labels",
    "part_label",
    "part_sizes",
    "preprocess_of",
    "read_log",
    "record_reads",
]

#: What each part of the data is for: the role its reads are recorded under (:class:`DataReads`).
ROLES: dict[str, str] = {"calibration": "fit", "finetune": "fit", "evaluation": "choose", "confirm": "confirm"}


class ConfirmSealed(RuntimeError):
    """The confirm part was read before the confirmation of the build that ships (a bug: nothing may choose on it)."""


_CONFIRM_OPEN = [False]


@contextlib.contextmanager
def confirming() -> Iterator[None]:
    """The one place the confirm part may be read: the confirmation of the build that ships."""
    before = _CONFIRM_OPEN[0]
    _CONFIRM_OPEN[0] = True
    try:
        yield
    finally:
        _CONFIRM_OPEN[0] = before


#: Automatic evaluation size (``--eval-samples 0``): the larger of what the accuracy budget's test needs
#: (:func:`tools.stats.images_needed`: 2,000 images for 1 point) and the images one evaluation takes about
#: ``AUTO_EVAL_SECONDS`` at the MAC rate the sensitivity profile assumes (a fixed figure, so the count never
#: depends on timing), the latter between these bounds; every image left when the data holds fewer.
AUTO_EVAL_SAMPLES = (1000, 5000)
AUTO_EVAL_SECONDS = 10.0


def auto_eval_samples(macs: int | None, *, budget_points: float = 1.0) -> int:
    """Evaluation images for a model of ``macs`` per image and an accuracy budget of ``budget_points`` (see
    :data:`AUTO_EVAL_SAMPLES`): at least what the budget test needs; small models get more, so that selection
    resolves smaller differences. The split gives evaluation at most what the other parts leave
    (``tools.evaluation.datasets.split_indices``)."""
    from tools.compression.sensitivity import ASSUMED_MACS_PER_SECOND

    low, high = AUTO_EVAL_SAMPLES
    needed = max(low, images_needed(budget_points))
    if not macs or macs <= 0:
        return needed
    return max(needed, min(high, int(AUTO_EVAL_SECONDS * ASSUMED_MACS_PER_SECOND / macs)))


def part_label(name: str, half: int | None = None) -> str:
    """The name a part's saved predictions go by: ``evaluation-half<N>`` for one half of the evaluation part."""
    return f"{name}-half{half}" if name == "evaluation" and half is not None else name


def record_reads(spec: EvalSpec, role: str, indices: list[int]) -> None:
    """Record that ``role`` read the dataset rows ``indices`` in ``spec.reads_log`` (nothing without one)."""
    if spec.reads_log is not None:
        record_rows(Path(spec.reads_log), role, indices)


class EvalSpec(BaseModel):
    """What every evaluation of a run shares: the data, its subset, and how to batch it."""

    dataset: str | None
    split: str | None = None
    label_match: dict[str, Any] | None = None
    samples: int = 500
    calibration_samples: int = 0
    confirm_samples: int = Field(
        default=0, description="Rows of the confirm part (``tools.evaluation.datasets.AUTO_CONFIRM``: automatic)."
    )
    finetune_samples: int = 0
    seed: int = 0
    batch_size: int = 32
    device: str = "cpu"
    progress: bool = True
    stop_beyond_points: float | None = Field(
        default=None,
        description="Sequential evaluation: stop a candidate's evaluation at a look once it clearly loses more than "
        "this many points (the accuracy budget); None: every candidate sees every image.",
    )
    float_runtime: str = Field(
        default=FLOAT,
        description="What runs a float model's evaluation: torch, or openvino (its FP32 twin, checked against it: "
        "tools.evaluation.twin) where the run judged PyTorch too slow for the images and MACs.",
    )
    spare_to_evaluation: bool = Field(
        default=False,
        description="The rows no part takes join evaluation when they are few (the automatic evaluation size: "
        "``tools.evaluation.datasets.SPARE_ROWS_SHARE``); False: evaluation holds ``samples`` rows at most.",
    )
    reads_log: str | None = Field(
        default=None, description="Where every read of a part is recorded (:func:`record_reads`); None: nowhere."
    )
    extra_images: str | None = Field(
        default=None,
        description="A folder of the user's unlabelled images (``--extra-images``; class folders, if any, ignored): "
        "fit only (:func:`extra_batch`), never choosing or confirming; None: none.",
    )
    evaluation_half: int | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Only this half of the evaluation part (``tools.evaluation.datasets.evaluation_halves``): the "
        "images a cross-fitted student was not distilled on; None: all of it.",
    )

    def sizes(self) -> dict[str, int]:
        """Rows of each part besides evaluation (see ``tools.evaluation.datasets.split_indices``)."""
        return {
            "calibration": self.calibration_samples,
            "confirm": self.confirm_samples,
            "finetune": self.finetune_samples,
        }

    def part(self, name: str) -> Any:
        """The decoded rows of one part (calibration, evaluation, confirm, finetune) of this spec's data, recorded as
        read by the part's role (:data:`ROLES`). The confirm part only inside :func:`confirming`."""
        if self.dataset is None:
            raise ValueError("no dataset")
        if name == "confirm" and not _CONFIRM_OPEN[0]:
            raise ConfirmSealed(
                "the confirm part was asked for before the confirmation of the build that ships: nothing may choose "
                "on it (read it inside tools.stages.run_data.confirming())"
            )
        sizes = tuple(sorted(self.sizes().items()))
        data = _dataset(self.dataset, self.split, self.samples, self.seed, name, sizes, self.spare_to_evaluation)
        if name == "evaluation" and self.evaluation_half is not None:
            from tools.evaluation.datasets import evaluation_halves, subset

            data = subset(data, evaluation_halves(len(data), self.seed)[self.evaluation_half])
        record_reads(self, ROLES.get(name, name), list(data.indices))
        return data

    def part_label(self, name: str) -> str:
        """The name a part's saved predictions go by: ``evaluation-half<N>`` for one half of the evaluation part."""
        return part_label(name, self.evaluation_half)

    def whole(self) -> EvalSpec:
        """This spec with the whole evaluation part."""
        return self.model_copy(update={"evaluation_half": None})

    def finetune_spec(self) -> EvalSpec:
        """The spec whose ``finetune`` part is what distillation adds to the calibration images."""
        return self.model_copy(update={"finetune_samples": max(0, self.finetune_samples - self.calibration_samples)})


@functools.lru_cache(maxsize=8)
def _dataset(
    spec: str,
    split: str | None,
    samples: int,
    seed: int,
    part: str = "evaluation",
    sizes: tuple[tuple[str, int], ...] = (),
    spare_to_evaluation: bool = False,
) -> Any:
    from tools.evaluation.datasets import load_eval_dataset

    # the share of unreadable images is checked over all the parts a run uses, by check_data
    return load_eval_dataset(
        spec,
        split=split,
        samples=samples,
        seed=seed,
        part=part,
        sizes=dict(sizes),
        max_unreadable=None,
        spare_to_evaluation=spare_to_evaluation,
    )


def match_dataset_labels(
    original_dir: Path,
    dataset: str,
    split: str | None,
    samples: int,
    seed: int,
    sizes: dict[str, int] | None = None,
    spare_to_evaluation: bool = False,
) -> dict[str, Any]:
    """The dataset's classes matched to the model's (``LabelMatch.model_dump()``). ``sizes``: the other parts
    of the run's data (``EvalSpec.sizes()``), so that the evaluation part decoded here is the run's own."""
    from tools.evaluation.labels import match_labels

    loaded = load_original(original_dir)
    parts = {f"{name}_samples": count for name, count in (sizes or {}).items()}
    spec = EvalSpec.model_validate(
        {"dataset": dataset, "split": split, "samples": samples, "seed": seed, **parts}
    ).model_copy(update={"spare_to_evaluation": spare_to_evaluation})
    data = spec.part("evaluation")
    return match_labels(loaded.id2label, data.label_names).model_dump()


class DataCheck(BaseModel):
    """The parts of a run's data once decoded: images per part, and those left out because they are unreadable."""

    total: int = Field(default=0, description="Rows in the dataset split.")
    parts: dict[str, int] = Field(default_factory=dict, description="Images decoded in each part the run uses.")
    looked_at: int = Field(default=0, description="Rows of all those parts, readable or not.")
    unreadable: int = 0
    unreadable_parts: dict[str, int] = Field(default_factory=dict, description="Unreadable images of each part.")
    examples: list[str] = Field(default_factory=list, description="The first unreadable images: 'path (why)'.")

    def note(self) -> str | None:
        """The report's note naming the unreadable images (None when every image was read)."""
        if not self.unreadable:
            return None
        where = ", ".join(f"{part} {count}" for part, count in self.unreadable_parts.items())
        more = f", ... ({self.unreadable} in all)" if self.unreadable > len(self.examples) else ""
        return (
            f"{self.unreadable} of {self.looked_at} images could not be read and were left out ({where}): "
            + ", ".join(self.examples)
            + more
        )


def _used_parts(spec: EvalSpec) -> dict[str, EvalSpec]:
    """The parts a run decodes up front (in ``PARTS`` order), each with the spec that loads it as the run does: all
    but the confirm part, which only the confirmation reads."""
    used = {"calibration": spec} if spec.calibration_samples > 0 else {}
    used["evaluation"] = spec
    if spec.finetune_samples > spec.calibration_samples:
        used["finetune"] = spec.finetune_spec()
    return used


def check_data(spec: EvalSpec) -> DataCheck:
    """Decode every part the run uses (kept for the run in this process) and count what could not be read.

    Raises ``DatasetError`` when more than ``MAX_UNREADABLE_FRACTION`` of the images looked at are unreadable,
    or when no evaluation image is left.
    """
    from tools.evaluation.datasets import (
        MAX_UNREADABLE_FRACTION,
        PARTS,
        UNREADABLE_SHOWN,
        split_indices,
        too_many_unreadable,
    )
    from tools.evaluation.sources import DatasetError

    if spec.dataset is None:
        return DataCheck()
    total = spec.part("evaluation").size_total
    asked = {**spec.sizes(), "evaluation": spec.samples}
    planned = split_indices(total, asked, spec.seed, spare_to_evaluation=spec.spare_to_evaluation)
    loaded = {name: part.part(name) for name, part in _used_parts(spec).items() if planned[name]}
    unreadable = [u for data in loaded.values() for u in data.unreadable]
    looked_at = sum(data.looked_at for data in loaded.values())
    problem = too_many_unreadable(spec.dataset, unreadable, looked_at, MAX_UNREADABLE_FRACTION)
    if problem:
        raise DatasetError(problem)
    if not loaded["evaluation"].images:
        raise DatasetError(
            f"no image of the evaluation part of {spec.dataset} can be read: repair the files or raise --eval-samples"
        )
    return DataCheck(
        total=total,
        parts={name: len(loaded[name]) if name in loaded else len(planned.get(name, [])) for name in PARTS},
        looked_at=looked_at,
        unreadable=len(unreadable),
        unreadable_parts={name: len(data.unreadable) for name, data in loaded.items() if data.unreadable},
        examples=[str(u) for u in unreadable[:UNREADABLE_SHOWN]],
    )


def _in_mode(preprocess: Callable[[list[Any]], torch.Tensor], channels: int) -> Callable[[list[Any]], torch.Tensor]:
    """``preprocess`` given every image as the model takes it: 'L' for one channel, 'RGB' for three."""
    mode = {1: "L", 3: "RGB"}.get(channels)
    if mode is None:
        return preprocess

    def converted(images: list[Any]) -> torch.Tensor:
        return preprocess(
            [img.convert(mode) if isinstance(img, Image.Image) and img.mode != mode else img for img in images]
        )

    return converted


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


def preprocessing_note(original_dir: Path) -> str | None:
    """How a plain PyTorch model's images are prepared, and where each setting came from (None for a model whose
    own image processor prepares them)."""
    spec = getattr(load_original(original_dir), "factory_spec", None)
    return spec.describe_preprocessing() if spec is not None else None


def preprocess_of(original_dir: Path, shape: InputShape) -> Callable[[list[Any]], torch.Tensor]:
    """Images -> batch, as the original model expects them (HF processor, or the factory's options)."""
    return _memo_of(original_dir, shape)


def _memo_of(original_dir: Path, shape: InputShape) -> _MemoPreprocess:
    key = (str(original_dir.resolve()), shape.as_tuple())
    if key not in _PREPROCESS:
        from tools.models.specs import preprocess_for

        loaded = load_original(original_dir)
        _PREPROCESS.clear()  # one model's images at a time
        plain = (
            preprocess_for(loaded.preprocessing)
            if loaded.preprocessing
            else build_preprocess(loaded.processor, shape.as_tuple())
        )
        _PREPROCESS[key] = _MemoPreprocess(_in_mode(plain, shape.channels))
    return _PREPROCESS[key]


def part_sizes(spec: EvalSpec) -> dict[str, int]:
    """Images each part of the spec's data holds as the run uses it (calibration, evaluation, confirm: the rows
    planned, read only at the confirmation; finetune: the images distillation adds to the calibration ones), ``total``
    rows and ``unreadable`` images left out. Whether the roles kept to their rows is what they read
    (:func:`read_log`), not this plan."""
    check = check_data(spec)
    if not check.total:
        return {}
    return {**check.parts, "total": check.total, "unreadable": check.unreadable}


class Calibration(BaseModel):
    """Calibration images, preprocessed for the model, and their labels as model classes where matched."""

    model_config = {"arbitrary_types_allowed": True}

    images: torch.Tensor
    targets: torch.Tensor | None = None


def calibration_batch(
    original_dir: Path, shape: InputShape, spec: EvalSpec, part: str = "calibration"
) -> Calibration | None:
    """The calibration part of the data as one preprocessed batch (None without a dataset or calibration, or when
    none of its images can be read).

    ``targets`` holds the matched model class of each image, -1 for images of unmatched classes (None when
    the model is untrained or no labels were matched).
    """
    if spec.dataset is None or spec.calibration_samples < 1:
        return None
    data = spec.part(part)
    if not data.images:  # every image of the part is unreadable
        return None
    images = preprocess_of(original_dir, shape)(list(data.images))
    targets = None  # an unlabelled dataset's targets are the original's answers, not these rows' labels
    if (
        spec.label_match is not None
        and not spec.label_match.get("unlabelled")
        and not load_original(original_dir).untrained
    ):
        mapping = {int(k): int(v) for k, v in (spec.label_match.get("mapping") or {}).items()}
        targets = torch.tensor([mapping.get(int(label), -1) for label in data.labels])
    return Calibration(images=images, targets=targets)


def first_evaluated_images(original_dir: Path, shape: InputShape, spec: EvalSpec, count: int) -> torch.Tensor | None:
    """The first ``count`` images the evaluation runs (those of matched classes, in its order), preprocessed as one
    batch; None without a dataset or matched labels."""
    if spec.dataset is None or spec.label_match is None:
        return None
    data = spec.part("evaluation")
    matched = {int(k) for k in (spec.label_match.get("mapping") or {})}
    keep = [i for i, label in enumerate(data.labels) if int(label) in matched][:count]
    if not keep:
        return None
    images: torch.Tensor = preprocess_of(original_dir, shape)([data.images[i] for i in keep])
    return images


def finetune_batch(original_dir: Path, shape: InputShape, spec: EvalSpec) -> torch.Tensor | None:
    """Unlabelled images for distillation: the calibration images, plus the finetune part when there is one, plus
    the extra images (:func:`extra_batch`) when the run has them."""
    calibration = calibration_batch(original_dir, shape, spec)
    if calibration is None:
        return None
    batches = [calibration.images]
    if spec.finetune_samples > spec.calibration_samples:
        more = calibration_batch(original_dir, shape, spec.finetune_spec(), part="finetune")
        batches += [] if more is None else [more.images]
    extra = extra_batch(original_dir, shape, spec)
    batches += [] if extra is None else [extra]
    return batches[0] if len(batches) == 1 else torch.cat(batches)


#: The most the extra images (``--extra-images``) take in memory once preprocessed, in bytes: a folder holding more
#: gives a seeded subset of as many as fit (50,000 CIFAR images take 0.6 GB; 2,600 at 260 px take 2 GiB).
EXTRA_IMAGE_BYTES = 2 * 1024**3


def extra_limit(shape: InputShape) -> int:
    """How many extra images of ``shape`` fit in :data:`EXTRA_IMAGE_BYTES` once preprocessed (FP32)."""
    return max(1, EXTRA_IMAGE_BYTES // (4 * shape.channels * shape.height * shape.width))


@functools.lru_cache(maxsize=2)
def _extra_dataset(folder: str, samples: int, seed: int) -> Any:
    from tools.evaluation.datasets import load_eval_dataset

    return load_eval_dataset(folder, samples=samples, seed=seed)


def check_extra_images(spec: EvalSpec) -> None:
    """Fail fast, in one line (``DatasetError``), where ``--extra-images`` cannot serve: no such folder, no images in
    it, or a folder that holds the dataset's images or is held by the dataset's folder (they would be fitted on and
    then chosen on). Nothing without extra images."""
    from tools.evaluation.sources import DATASET_SOURCES, DatasetError

    if not spec.extra_images:
        return
    folder = Path(spec.extra_images).expanduser()
    if not folder.is_dir():
        raise DatasetError(f"--extra-images {spec.extra_images}: no such folder: give a folder of images")
    if not DATASET_SOURCES["imagefolder"].accepts(str(folder)):
        raise DatasetError(f"--extra-images {spec.extra_images}: no images in it: give a folder of images")
    if spec.dataset is not None and Path(spec.dataset).expanduser().exists():
        data, extra = Path(spec.dataset).expanduser().resolve(), folder.resolve()
        if data == extra or data in extra.parents or extra in data.parents:
            raise DatasetError(
                f"--extra-images {spec.extra_images} and the dataset {spec.dataset} share images: the extra images "
                "are fitted on, the dataset's are chosen and confirmed on; give a folder apart from the dataset"
            )


def extra_images_used(spec: EvalSpec, shape: InputShape) -> int:
    """How many extra images the run fits on (0 without ``--extra-images``): a seeded subset where the folder holds
    more than :func:`extra_limit`, less the unreadable ones (decoded once, here)."""
    if not spec.extra_images:
        return 0
    return len(_extra_dataset(str(Path(spec.extra_images).expanduser()), extra_limit(shape), spec.seed))


def extra_batch(original_dir: Path, shape: InputShape, spec: EvalSpec) -> torch.Tensor | None:
    """The user's extra unlabelled images (``--extra-images``), preprocessed for the model, recorded as read by the
    fit role (their own rows: ``DataReads.extra``); a seeded subset of at most :func:`extra_limit` images; None
    without them. Fit only: distillation trains on them; nothing that chooses or confirms calls this."""
    if not spec.extra_images:
        return None
    data = _extra_dataset(str(Path(spec.extra_images).expanduser()), extra_limit(shape), spec.seed)
    if spec.reads_log is not None:
        record_rows(Path(spec.reads_log), "fit", list(data.indices), extra=True)
    return _preprocessed_extra(original_dir, shape, data)


_EXTRA_TENSOR: dict[tuple[str, tuple[int, int, int], int], torch.Tensor] = {}


def _preprocessed_extra(original_dir: Path, shape: InputShape, data: Any) -> torch.Tensor:
    """``data``'s images preprocessed once per process (not memoised image by image: thousands of them)."""
    key = (str(original_dir.resolve()), shape.as_tuple(), id(data))
    if key not in _EXTRA_TENSOR:
        _EXTRA_TENSOR.clear()
        preprocess = _memo_of(original_dir, shape).preprocess  # the memo's inner function: nothing kept
        images = list(data.images)
        _EXTRA_TENSOR[key] = torch.cat([preprocess(images[i : i + 512]) for i in range(0, len(images), 512)])
    return _EXTRA_TENSOR[key]
