"""Evaluation data: load a dataset spec, pick its image and label columns, decode a seeded subset of PIL images.

:func:`load_eval_dataset` resolves the spec through :mod:`tools.evaluation.sources` (built-in names,
save_to_disk folders, image folders, data-file folders, Hugging Face Hub ids), then only the selected
rows are decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from tools.evaluation.sources import DatasetError, pick_from_dict, resolve_source

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_COLUMN_NAMES",
    "LABEL_COLUMN_NAMES",
    "PARTS",
    "EvalDataset",
    "find_image_column",
    "find_label_column",
    "load_eval_dataset",
    "split_indices",
    "subset_indices",
    "to_pil",
]

IMAGE_COLUMN_NAMES: tuple[str, ...] = ("image", "img", "pixel_values", "picture", "photo", "images")
LABEL_COLUMN_NAMES: tuple[str, ...] = (
    "label",
    "labels",
    "fine_label",
    "fine_labels",
    "class",
    "class_label",
    "target",
    "category",
    "coarse_label",
    "y",
)


@dataclass
class EvalDataset:
    """A decoded evaluation subset. ``labels[i]`` indexes ``label_names``."""

    images: list[Image.Image]
    labels: list[int]
    label_names: list[str]
    source: str
    size_total: int
    split: str | None = None
    indices: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images)


# ---------------------------------------------------------------------------------------------- columns


def find_image_column(features: Any, columns: list[str]) -> str:
    """The first ``Image`` feature, else the first column named like an image column."""
    from datasets import Image as ImageFeature

    for name in columns:
        if isinstance(features.get(name) if features is not None else None, ImageFeature):
            return name
    lowered = {c.lower(): c for c in columns}
    for candidate in IMAGE_COLUMN_NAMES:
        if candidate in lowered:
            return lowered[candidate]
    raise DatasetError(f"no image column: expected an Image feature or one named image/img; got {columns}")


def find_label_column(features: Any, columns: list[str], exclude: str | None = None) -> str:
    """A ``ClassLabel`` feature (preferring conventional names), else a column named like a label column."""
    from datasets import ClassLabel

    lowered = {c.lower(): c for c in columns if c != exclude}
    class_labels = [
        c for c in columns if c != exclude and isinstance(features.get(c) if features is not None else None, ClassLabel)
    ]
    for candidate in LABEL_COLUMN_NAMES:
        if candidate in lowered and lowered[candidate] in class_labels:
            return lowered[candidate]
    if class_labels:
        return class_labels[0]
    for candidate in LABEL_COLUMN_NAMES:
        if candidate in lowered:
            return lowered[candidate]
    raise DatasetError(f"no label column: need a ClassLabel feature or a column named label; got {columns}")


def _label_names_and_encoder(rows: Any, column: str) -> tuple[list[str], Callable[[Any], int]]:
    from datasets import ClassLabel

    feature = rows.features.get(column) if rows.features is not None else None
    if isinstance(feature, ClassLabel):
        return list(feature.names), int
    values = rows[column]
    if values and all(isinstance(v, str) for v in values):
        names = sorted(set(values))
        index = {n: i for i, n in enumerate(names)}
        return names, lambda v: index[v]
    if values and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in values):
        top = int(max(values))
        if min(values) < 0:
            raise DatasetError(f"label column {column!r} holds negative values: expected class indices")
        logger.warning("label column %r has no class names; using '0'..'%d'", column, top)
        return [str(i) for i in range(top + 1)], int
    raise DatasetError(f"label column {column!r} must hold class indices or class names")


# ---------------------------------------------------------------------------------------------- images


def to_pil(value: Any) -> Image.Image:
    """A decoded dataset cell as a loaded PIL image: RGB, or 'L' when it is single-channel."""
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        import io

        data = value.get("bytes")
        value = Image.open(io.BytesIO(data)) if data else Image.open(value["path"])
    if isinstance(value, Image.Image):
        image = value
    else:
        array = np.asarray(value)
        if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
            array = np.moveaxis(array, 0, -1)
        if array.ndim == 3 and array.shape[-1] == 1:
            array = array[..., 0]
        if array.dtype.kind == "f":
            array = array * 255.0 if array.size and float(array.max()) <= 1.0 else array
            array = np.clip(np.rint(array), 0, 255)
        if array.ndim not in (2, 3):
            raise DatasetError(f"cannot read an image of shape {array.shape}: expected HxW or HxWxC")
        image = Image.fromarray(array.astype(np.uint8))
    if image.mode == "L":
        image.load()
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        return _wide_grey_to_l(image)
    if image.mode in ("1", "LA"):
        return image.convert("L")
    return image.convert("RGB")


def _wide_grey_to_l(image: Image.Image) -> Image.Image:
    """16-bit (or int/float) greyscale as 8-bit 'L'; values above 255 are read as 16-bit (divided by 257)."""
    array = np.asarray(image, dtype=np.float64)
    if array.size and float(array.max()) > 255.0:
        array = array / 257.0
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8), mode="L")


# ---------------------------------------------------------------------------------------------- public


def subset_indices(total: int, samples: int | None, seed: int) -> list[int]:
    """Rows of a seeded subset: ``np.random.default_rng(seed).permutation(total)[:samples]``.

    This is the permutation ``datasets.Dataset.shuffle(seed=seed)`` uses, so the subset equals
    ``dataset.shuffle(seed).select(range(samples))`` without writing an indices cache file.
    """
    permutation = np.random.default_rng(seed).permutation(total)
    count = total if samples is None else min(samples, total)
    return [int(i) for i in permutation[:count]]


#: The disjoint parts a run draws from one dataset split, in the order they are taken from the permutation.
PARTS: tuple[str, ...] = ("calibration", "evaluation", "holdout", "finetune")


def split_indices(total: int, sizes: dict[str, int], seed: int) -> dict[str, list[int]]:
    """Disjoint seeded parts of ``total`` rows: each part of :data:`PARTS` takes the next ``sizes[part]`` rows
    of ``np.random.default_rng(seed).permutation(total)``, in the order of ``PARTS``.

    When the split is too small for everything, calibration takes at most half of it (so that evaluation
    keeps at least the other half) and the later parts get what is left. ``finetune`` holds only the rows
    beyond the others (distillation adds the calibration rows itself).
    """
    permutation = [int(i) for i in np.random.default_rng(seed).permutation(total)]
    wanted = {part: max(0, int(sizes.get(part, 0))) for part in PARTS}
    if wanted["evaluation"] and wanted["calibration"] + wanted["evaluation"] > total:
        wanted["calibration"] = min(wanted["calibration"], total // 2)
    parts: dict[str, list[int]] = {}
    start = 0
    for part in PARTS:
        parts[part] = permutation[start : start + wanted[part]]
        start += len(parts[part])
    return parts


def load_eval_dataset(
    spec: str,
    *,
    split: str | None = None,
    samples: int | None = 500,
    seed: int = 0,
    part: str = "evaluation",
    sizes: dict[str, int] | None = None,
) -> EvalDataset:
    """Load ``spec`` (see module doc), pick a split, and decode a seeded random subset of ``samples`` rows.

    ``samples=None`` keeps every row; fewer rows are returned when the split is smaller. With ``sizes``
    (rows per part of :data:`PARTS`; ``samples`` is then the evaluation size), the rows are those of
    ``part`` in :func:`split_indices`, disjoint from the other parts.
    """
    if samples is not None and samples < 1:
        raise DatasetError(f"samples must be >= 1 (or None for all), not {samples}")
    if part not in PARTS:
        raise DatasetError(f"unknown dataset part {part!r}: choose one of {', '.join(PARTS)}")
    source = resolve_source(spec)
    rows, used_split = source.load(spec, split)
    if hasattr(rows, "keys") and not hasattr(rows, "column_names"):  # a DatasetDict from a custom loader
        rows, used_split = pick_from_dict(rows, split)
    columns = list(rows.column_names)
    image_column = find_image_column(rows.features, columns)
    label_column = find_label_column(rows.features, columns, exclude=image_column)
    total = len(rows)
    if total == 0:
        raise DatasetError(f"split {used_split!r} of {spec} is empty")
    names, encode = _label_names_and_encoder(rows, label_column)
    if sizes is None:
        indices = subset_indices(total, samples, seed)
    else:
        indices = split_indices(total, {**sizes, "evaluation": total if samples is None else samples}, seed)[part]
        if not indices:
            raise DatasetError(f"the {part} part of {spec} is empty: {total} rows, parts {sizes}")
    chosen = rows.select_columns([image_column, label_column]).select(indices, keep_in_memory=True)
    images = [to_pil(value) for value in chosen[image_column]]
    labels = [encode(value) for value in chosen[label_column]]
    if any(label < 0 for label in labels):
        raise DatasetError(f"split {used_split!r} of {spec} has unlabelled rows (label < 0): choose a labelled split")
    bad = [label for label in labels if label >= len(names)]
    if bad:
        raise DatasetError(f"label {bad[0]} exceeds the {len(names)} class names of column {label_column!r}")
    logger.info(
        "loaded %d/%d rows of %s (source=%s, split=%s, image=%r, label=%r, %d classes)",
        len(images),
        total,
        spec,
        source.name,
        used_split,
        image_column,
        label_column,
        len(names),
    )
    return EvalDataset(
        images=images,
        labels=labels,
        label_names=[str(n) for n in names],
        source=f"{source.name}:{spec}",
        size_total=total,
        split=used_split,
        indices=indices,
    )
