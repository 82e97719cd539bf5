"""Evaluation data: load a dataset spec, pick its image and label columns, decode a seeded subset of PIL images.

:func:`load_eval_dataset` resolves the spec through :mod:`tools.evaluation.sources` (built-in names,
save_to_disk folders, image folders, data-file folders, Hugging Face Hub ids), then only the selected
rows are decoded, one at a time: an image that cannot be decoded (truncated, not an image, empty) is
left out with a warning and named in :attr:`EvalDataset.unreadable`, and the load fails only when more
than :data:`MAX_UNREADABLE_FRACTION` of the rows looked at are unreadable. Every image is loaded fully
(PIL opens lazily; ``ImageFile.LOAD_TRUNCATED_IMAGES`` stays off, so a truncated file is an error, not
grey padding) and comes back as 'RGB', or 'L' when it is single-channel.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from tools.evaluation.sources import UNLABELLED, DatasetError, DatasetSource, pick_from_dict, resolve_source
from tools.text import first_line

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO_CONFIRM",
    "IMAGE_COLUMN_NAMES",
    "LABEL_COLUMN_NAMES",
    "MAX_UNREADABLE_FRACTION",
    "PARTS",
    "UNREADABLE_SHOWN",
    "EvalDataset",
    "UnreadableImage",
    "confirm_rows",
    "find_image_column",
    "find_label_column",
    "load_eval_dataset",
    "split_indices",
    "subset_indices",
    "to_pil",
    "too_many_unreadable",
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

#: The largest share of the images looked at that may be unreadable before loading fails.
MAX_UNREADABLE_FRACTION = 0.05
#: How many unreadable images a warning, an error or a note names.
UNREADABLE_SHOWN = 5


@dataclass(frozen=True)
class UnreadableImage:
    """An image left out because it cannot be decoded: its row in the split, where it is, and why."""

    row: int
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where} ({self.reason})"


@dataclass
class EvalDataset:
    """A decoded evaluation subset. ``labels[i]`` indexes ``label_names``; ``indices[i]`` is the row of
    ``images[i]`` in the split. ``unreadable`` names the selected rows left out because they cannot be decoded."""

    images: list[Image.Image]
    labels: list[int]
    label_names: list[str]
    source: str
    size_total: int
    split: str | None = None
    indices: list[int] = field(default_factory=list)
    unreadable: list[UnreadableImage] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images)

    @property
    def unlabelled(self) -> bool:
        """A folder of images without class sub-folders: judged against the original's answers, not labels."""
        return self.label_names == [UNLABELLED]

    @property
    def looked_at(self) -> int:
        """Rows selected: the images decoded and those left out as unreadable."""
        return len(self.images) + len(self.unreadable)


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
    """A dataset cell (PIL image, ``{"bytes", "path"}`` dict, array) as a fully loaded PIL image: 'RGB', or 'L'
    when it is single-channel (greyscale, 'LA', 1-bit, 16-bit; RGBA, CMYK and palette images become 'RGB').

    Raises whatever PIL raises for a file it cannot decode (``OSError`` for a truncated or unknown file).
    """
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        import io

        data, path = value.get("bytes"), value.get("path")
        if data is None and not path:
            raise DatasetError("an image cell holds neither bytes nor a path")
        source: io.BytesIO | str = io.BytesIO(data) if data is not None else str(path)
        with Image.open(source) as opened:
            opened.load()  # PIL decodes lazily: a truncated file fails here, inside the ``with``
            return _model_mode(opened)
    if isinstance(value, Image.Image):
        value.load()
        return _model_mode(value)
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
    return _model_mode(Image.fromarray(array.astype(np.uint8)))


def _model_mode(image: Image.Image) -> Image.Image:
    """A loaded image as 'RGB' or 'L' (see :func:`to_pil`)."""
    if image.mode == "L":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        return _wide_grey_to_l(image)
    if image.mode in ("1", "LA", "La"):
        return image.convert("L")
    if image.mode == "P" and "transparency" in image.info:
        return image.convert("RGBA").convert("RGB")  # PIL warns when a palette image with transparency skips RGBA
    return image.convert("RGB")


def _reason(exc: Exception, cell: Any) -> str:
    """Why an image cannot be read, in a few words."""
    if isinstance(exc, UnidentifiedImageError):
        path = _path_of(cell)
        data = cell.get("bytes") if isinstance(cell, dict) else None
        empty = data == b"" or (path is not None and Path(path).is_file() and Path(path).stat().st_size == 0)
        return "empty file" if empty else "not an image file PIL can read"
    text = first_line(exc)
    return "truncated file" if "truncated" in text.lower() else text


def _decode_rows(
    cells: list[Any], rows: list[int], root: Path | None
) -> tuple[list[Image.Image], list[int], list[UnreadableImage]]:
    """Decode each cell; (images, positions of the decoded cells, unreadable rows). A cell that fails is left out."""
    images: list[Image.Image] = []
    kept: list[int] = []
    unreadable: list[UnreadableImage] = []
    for position, (cell, row) in enumerate(zip(cells, rows, strict=True)):
        try:
            images.append(to_pil(cell))
        except MemoryError:
            raise
        except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, EOFError, ... for broken files
            where = _where(cell, row, root)
            unreadable.append(UnreadableImage(row=row, where=where, reason=_reason(exc, cell)))
            if len(unreadable) <= UNREADABLE_SHOWN:
                logger.warning("skipping an unreadable image: %s", unreadable[-1])
            continue
        kept.append(position)
    return images, kept, unreadable


def _path_of(cell: Any) -> str | None:
    if isinstance(cell, dict) and isinstance(cell.get("path"), str) and cell.get("bytes") is None:
        return str(cell["path"])
    return None


def _where(cell: Any, row: int, root: Path | None) -> str:
    """The file of an image (relative to the dataset folder where it is inside it), else ``row N (name)``."""
    path = _path_of(cell)
    if path is not None:
        if root is not None:
            try:
                return str(Path(path).resolve().relative_to(root))
            except ValueError:
                pass
        return path
    name = cell.get("path") if isinstance(cell, dict) else None
    return f"row {row}" + (f" ({name})" if name else "")


def too_many_unreadable(spec: str, unreadable: list[UnreadableImage], looked_at: int, limit: float) -> str | None:
    """The one-line error when more than ``limit`` of the ``looked_at`` images are unreadable, else None."""
    if not unreadable or len(unreadable) <= limit * looked_at:
        return None
    shown = "; ".join(str(u) for u in unreadable[:UNREADABLE_SHOWN])
    more = f"; ... ({len(unreadable)} in all)" if len(unreadable) > UNREADABLE_SHOWN else ""
    return (
        f"{len(unreadable)} of {looked_at} images of {spec} cannot be read (more than {limit:.0%}): {shown}{more}; "
        "repair or remove the broken files (or download the dataset again) and run again"
    )


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
PARTS: tuple[str, ...] = ("calibration", "evaluation", "confirm", "finetune")

#: ``sizes["confirm"]`` that asks for the automatic confirm part (:func:`confirm_rows`).
AUTO_CONFIRM = -1
#: The automatic confirm part: this share of the rows calibration leaves, at most :data:`CONFIRM_MAX` rows, none when
#: that is under :data:`CONFIRM_MIN` (too few to confirm anything: the report says the figure is unconfirmed). The
#: confirm part gives the one figure reported for what ships; the choose part (evaluation) decides every comparison,
#: so it keeps the larger share. CIFAR-10's 5,000-image half with 256 calibration images: 1,186 confirm rows, whose
#: paired interval is about +-1.2 points wide for a model that changes 7 % of the original's answers.
CONFIRM_SHARE = 0.25
CONFIRM_MAX = 2000
CONFIRM_MIN = 100


def confirm_rows(asked: int, total: int, calibration: int) -> int:
    """Rows of the confirm part: ``asked`` (at most what calibration leaves), or with :data:`AUTO_CONFIRM` the
    automatic size (:data:`CONFIRM_SHARE`)."""
    left = max(0, total - calibration)
    if asked != AUTO_CONFIRM:
        return min(max(0, asked), left)
    rows = min(CONFIRM_MAX, int(CONFIRM_SHARE * left))
    return rows if rows >= CONFIRM_MIN else 0


#: Calibration images a split too small for everything still gives calibration (at most half of it): what
#: importance, the sensitivity probes and the least-squares refits of a 224-px model need at the least.
MIN_CALIBRATION = 64

#: The share of the rows calibration and confirm leave that finetune (distillation) images keep at most when
#: evaluation wants more than the rest (see :func:`split_indices`).
FINETUNE_SHARE = 0.3

#: With ``spare_to_evaluation`` (the automatic evaluation size), the rows no part takes join evaluation when they are
#: at most this share of what it asked for: they serve nothing else, and each evaluation then takes at most 1.5x the
#: time the automatic size allowed. CIFAR ResNet-56 on 5,000 images (256 calibration) asked for 3,909 and left 835
#: unused; its rounds are judged on 4,744 now, their paired standard errors 9 % narrower.
SPARE_ROWS_SHARE = 0.5


def split_indices(
    total: int, sizes: dict[str, int], seed: int, *, spare_to_evaluation: bool = False
) -> dict[str, list[int]]:
    """Disjoint seeded parts of ``total`` rows: each part of :data:`PARTS` takes the next ``sizes[part]`` rows
    of ``np.random.default_rng(seed).permutation(total)``, in the order of ``PARTS``.

    When the split is too small for everything, calibration takes at most a quarter of it (at most half of a split
    under :data:`MIN_CALIBRATION` x 4 rows, for :data:`MIN_CALIBRATION` images), so that evaluation, whose paired test
    decides every candidate, keeps the rest: 500 images split 125 / 375 (half-and-half resolved 250 images, about
    +-2.7 points at 95 %, 375 about +-2.2), and the later parts get what is left. ``finetune`` holds only the rows
    beyond the others (distillation adds the calibration rows itself). ``sizes["confirm"]`` :data:`AUTO_CONFIRM`
    sizes the confirm part from the split (:func:`confirm_rows`); it is taken before evaluation's share is set.

    When evaluation and finetune do not both fit in what calibration and confirm leave, finetune keeps at most
    :data:`FINETUNE_SHARE` of it (or what evaluation leaves, if more) and evaluation the rest: the paired test on
    the evaluation images decides every candidate, while distillation gains little from more than about 1,500
    images (measured: CIFAR ResNet-20, 14 % fewer parameters, 300 steps: 256 images -0.80 points, 512 -0.66,
    1,000 -1.06, 1,500 +0.06, 3,000 -0.14 on 5,000 other images). 5,000 rows with 256 calibration, 5,000
    evaluation and 4,096 finetune asked for split 256 / 3,320 / 1,424.

    ``spare_to_evaluation``: the rows left after every part join evaluation when they are at most
    :data:`SPARE_ROWS_SHARE` of it (the automatic evaluation size; a size the user gave is kept).
    """
    permutation = [int(i) for i in np.random.default_rng(seed).permutation(total)]
    wanted = {part: max(0, int(sizes.get(part, 0))) for part in PARTS}
    if wanted["evaluation"] and wanted["calibration"] + wanted["evaluation"] > total:
        wanted["calibration"] = min(wanted["calibration"], max(total // 4, min(MIN_CALIBRATION, total // 2)))
    wanted["confirm"] = confirm_rows(int(sizes.get("confirm", 0)), total, wanted["calibration"])
    left = max(0, total - wanted["calibration"] - wanted["confirm"])
    wanted["evaluation"] = min(wanted["evaluation"], left)  # the confirm part keeps its rows
    if wanted["evaluation"] and wanted["finetune"] and wanted["evaluation"] + wanted["finetune"] > left:
        wanted["finetune"] = min(wanted["finetune"], max(left - wanted["evaluation"], math.ceil(FINETUNE_SHARE * left)))
        wanted["evaluation"] = min(wanted["evaluation"], left - wanted["finetune"])
    spare = left - wanted["evaluation"] - wanted["finetune"]
    if spare_to_evaluation and 0 < spare <= SPARE_ROWS_SHARE * wanted["evaluation"]:
        wanted["evaluation"] += spare
    parts: dict[str, list[int]] = {}
    start = 0
    for part in PARTS:
        parts[part] = permutation[start : start + wanted[part]]
        start += len(parts[part])
    return parts


def evaluation_halves(count: int, seed: int) -> tuple[list[int], list[int]]:
    """Two disjoint seeded halves of ``count`` positions, each in ascending order: the images one cross-fitted
    student is distilled on and the images it is judged on (``np.random.default_rng(seed + 1)``'s permutation, so
    not the permutation that chose the parts)."""
    permutation = [int(i) for i in np.random.default_rng(seed + 1).permutation(count)]
    return sorted(permutation[: count // 2]), sorted(permutation[count // 2 :])


def subset(data: EvalDataset, positions: list[int]) -> EvalDataset:
    """The images of ``data`` at ``positions`` (in that order), with their labels and rows."""
    return EvalDataset(
        images=[data.images[i] for i in positions],
        labels=[data.labels[i] for i in positions],
        label_names=data.label_names,
        source=data.source,
        size_total=data.size_total,
        split=data.split,
        indices=[data.indices[i] for i in positions] if data.indices else [],
    )


@dataclass
class _Split:
    """A loaded split: its source, rows and name, the image and label columns, and the class names and encoder."""

    source: DatasetSource
    rows: Any
    name: str | None
    image_column: str
    label_column: str
    names: list[str]
    encode: Callable[[Any], int]

    def labels(self, chosen: Any, spec: str) -> list[int]:
        """The class index of each ``chosen`` row; a ``DatasetError`` for an unlabelled row or an unknown class."""
        labels = [self.encode(value) for value in chosen[self.label_column]]
        if any(label < 0 for label in labels):
            raise DatasetError(
                f"split {self.name!r} of {spec} has unlabelled rows (label < 0): choose a labelled split"
            )
        bad = [label for label in labels if label >= len(self.names)]
        if bad:
            raise DatasetError(
                f"label {bad[0]} exceeds the {len(self.names)} class names of column {self.label_column!r}"
            )
        return labels


def _open_split(spec: str, split: str | None) -> _Split:
    """Load split ``split`` of ``spec`` (None: the source's choice) and find its columns and class names; a
    ``DatasetError`` when it is empty."""
    source = resolve_source(spec)
    rows, used_split = source.load(spec, split)
    if hasattr(rows, "keys") and not hasattr(rows, "column_names"):  # a DatasetDict from a custom loader
        rows, used_split = pick_from_dict(rows, split)
    columns = list(rows.column_names)
    image_column = find_image_column(rows.features, columns)
    label_column = find_label_column(rows.features, columns, exclude=image_column)
    if len(rows) == 0:
        raise DatasetError(f"split {used_split!r} of {spec} is empty")
    names, encode = _label_names_and_encoder(rows, label_column)
    return _Split(source, rows, used_split, image_column, label_column, names, encode)


def _row_indices(
    spec: str,
    total: int,
    samples: int | None,
    seed: int,
    *,
    part: str,
    sizes: dict[str, int] | None,
    spare_to_evaluation: bool,
) -> list[int]:
    """The rows to load: a seeded subset of ``samples`` rows, or with ``sizes`` those of ``part`` (see
    :func:`load_eval_dataset`); a ``DatasetError`` when the split leaves ``part`` none."""
    if sizes is None:
        return subset_indices(total, samples, seed)
    asked = {**sizes, "evaluation": total if samples is None else samples}
    indices = split_indices(total, asked, seed, spare_to_evaluation=spare_to_evaluation)[part]
    if not indices:
        wanted = ", ".join(f"{name} {count}" for name, count in sizes.items() if count)
        raise DatasetError(
            f"{spec} has {total} image(s), too few to leave any for its {part} part (asked for: {wanted}, the "
            "evaluation the rest): give more images, or set that part's option to 0 (e.g. --calibration-samples 0)"
        )
    return indices


def load_eval_dataset(
    spec: str,
    *,
    split: str | None = None,
    samples: int | None = 500,
    seed: int = 0,
    part: str = "evaluation",
    sizes: dict[str, int] | None = None,
    max_unreadable: float | None = MAX_UNREADABLE_FRACTION,
    spare_to_evaluation: bool = False,
) -> EvalDataset:
    """Load ``spec`` (see module doc), pick a split, and decode a seeded random subset of ``samples`` rows.

    ``samples=None`` keeps every row; fewer rows are returned when the split is smaller. With ``sizes``
    (rows per part of :data:`PARTS`; ``samples`` is then the evaluation size), the rows are those of
    ``part`` in :func:`split_indices`, disjoint from the other parts. Rows whose image cannot be decoded are
    left out (``EvalDataset.unreadable``); more than ``max_unreadable`` of them raise a ``DatasetError``
    (None: never; the caller checks the share over several parts). ``spare_to_evaluation``: see
    :func:`split_indices`.
    """
    if samples is not None and samples < 1:
        raise DatasetError(f"samples must be >= 1 (or None for all), not {samples}")
    if part not in PARTS:
        raise DatasetError(f"unknown dataset part {part!r}: choose one of {', '.join(PARTS)}")
    data = _open_split(spec, split)
    total = len(data.rows)
    indices = _row_indices(spec, total, samples, seed, part=part, sizes=sizes, spare_to_evaluation=spare_to_evaluation)
    chosen = data.rows.select_columns([data.image_column, data.label_column]).select(indices, keep_in_memory=True)
    chosen = _undecoded(chosen, data.image_column)  # decode each image here, so that a broken one can be skipped
    labels = data.labels(chosen, spec)
    root = Path(spec).expanduser().resolve() if data.source.name == "imagefolder" else None
    images, kept, unreadable = _decode_rows(chosen[data.image_column], indices, root)
    if unreadable:
        _check_unreadable(spec, part, unreadable, len(indices), max_unreadable)
        labels = [labels[i] for i in kept]
        indices = [indices[i] for i in kept]
    logger.info(
        "loaded %d/%d rows of %s (source=%s, split=%s, image=%r, label=%r, %d classes)",
        len(images),
        total,
        spec,
        data.source.name,
        data.name,
        data.image_column,
        data.label_column,
        len(data.names),
    )
    return EvalDataset(
        images=images,
        labels=labels,
        label_names=[str(n) for n in data.names],
        source=f"{data.source.name}:{spec}",
        size_total=total,
        split=data.name,
        indices=indices,
        unreadable=unreadable,
    )


def _check_unreadable(
    spec: str, part: str, unreadable: list[UnreadableImage], looked_at: int, max_unreadable: float | None
) -> None:
    """Warn that the ``unreadable`` images are left out; a ``DatasetError`` when they are more than
    ``max_unreadable`` of the ``looked_at`` (None: never)."""
    logger.warning("left out %d unreadable of %d images of the %s part of %s", len(unreadable), looked_at, part, spec)
    problem = None if max_unreadable is None else too_many_unreadable(spec, unreadable, looked_at, max_unreadable)
    if problem:
        raise DatasetError(problem)


def _undecoded(rows: Any, column: str) -> Any:
    """``rows`` with an ``Image`` column read as ``{"bytes", "path"}`` (left to :func:`to_pil`), else as is."""
    from datasets import Image as ImageFeature

    feature = rows.features.get(column) if rows.features is not None else None
    if isinstance(feature, ImageFeature) and feature.decode:
        return rows.cast_column(column, ImageFeature(decode=False))
    return rows
