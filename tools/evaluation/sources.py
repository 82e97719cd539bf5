"""Where evaluation data comes from: resolve a dataset spec to rows and a split.

A spec is resolved through :data:`DATASET_SOURCES` (first source that accepts it wins):

* ``builtin``     a name in :data:`BUILTIN_DATASETS` (``"digits"``: scikit-learn's digits, offline);
* ``disk``        a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``;
* ``imagefolder`` a directory of images laid out as ``<root>/[<split>/]<class>/<image>``;
* ``localrepo``   a directory of data files (parquet, arrow, csv, json) readable by ``load_dataset``;
* ``hub``         a Hugging Face Hub dataset id (``owner/name``, optionally ``owner/name:config``).

Plain image folders are indexed directly (file listing, labels from the parent directory names, exactly
as ``load_dataset("imagefolder")`` infers them), which takes ~0.1 s for 10,000 files instead of several
seconds of data-file pattern resolution; folders with ``metadata.csv/jsonl/parquet`` or an unusual layout
go through ``load_dataset("imagefolder")``. Columns, decoding and the seeded subset are in
:mod:`tools.evaluation.datasets`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.text import first_line

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DATASETS",
    "DATASET_SOURCES",
    "DATA_FILE_SUFFIXES",
    "IMAGE_EXTENSIONS",
    "METADATA_FILENAMES",
    "SPLIT_ALIASES",
    "SPLIT_PREFERENCE",
    "UNLABELLED",
    "DatasetError",
    "DatasetSource",
    "choose_split",
    "pick_from_dict",
    "resolve_source",
]

SPLIT_PREFERENCE: tuple[str, ...] = ("test", "validation", "val", "train")
# Split directory names that ``load_dataset("imagefolder")`` recognises, mapped to the canonical split.
SPLIT_ALIASES: dict[str, str] = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluation": "test",
}
METADATA_FILENAMES: frozenset[str] = frozenset({"metadata.csv", "metadata.jsonl", "metadata.parquet"})
DATA_FILE_SUFFIXES: frozenset[str] = frozenset({".parquet", ".arrow", ".csv", ".json", ".jsonl"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")


#: The one class name of an unlabelled dataset (a folder with the images directly in it): every image is judged
#: against the original model's top-1 answer instead of a label.
UNLABELLED = "<unlabelled>"


class DatasetError(ValueError):
    """A dataset spec, split or layout that cannot be used for evaluation (one-line, actionable)."""


@dataclass(frozen=True)
class DatasetSource:
    """One way of turning a spec into rows: ``accepts(spec)`` and ``load(spec, split) -> (rows, split)``.

    ``rows`` is a ``datasets.Dataset``; ``split`` is the name of the split actually used (or None).
    """

    name: str
    accepts: Callable[[str], bool]
    load: Callable[[str, str | None], tuple[Any, str | None]]
    description: str = ""


# ---------------------------------------------------------------------------------------------- helpers


def _image_extensions() -> frozenset[str]:
    try:
        from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

        return frozenset(ext.lower() for ext in ImageFolder.EXTENSIONS)
    except Exception:  # pragma: no cover - depends on the datasets version
        return frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})


IMAGE_EXTENSIONS: frozenset[str] = _image_extensions()


def _canonical_split(name: str) -> str:
    return SPLIT_ALIASES.get(name.lower(), name.lower())


def choose_split(available: list[str], requested: str | None) -> str:
    """The split to evaluate on: ``requested`` (exact, then by alias), else the first of SPLIT_PREFERENCE."""
    if not available:
        raise DatasetError("the dataset has no splits")
    if requested is not None:
        if requested in available:
            return requested
        by_alias = [s for s in available if _canonical_split(s) == _canonical_split(requested)]
        if by_alias:
            return by_alias[0]
        raise DatasetError(f"split {requested!r} not found: choose one of {', '.join(available)}")
    for preferred in SPLIT_PREFERENCE:
        if preferred in available:
            return preferred
    for preferred in SPLIT_PREFERENCE:
        by_alias = [s for s in available if _canonical_split(s) == _canonical_split(preferred)]
        if by_alias:
            return by_alias[0]
    return available[0]


def pick_from_dict(dataset_dict: Any, requested: str | None) -> tuple[Any, str]:
    """The split of a ``DatasetDict`` chosen by :func:`choose_split`, and its name."""
    split = choose_split(list(dataset_dict.keys()), requested)
    return dataset_dict[split], split


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith(("/", "./", "../", "~", "."))
        or spec.count("/") > 1
        or (os.sep != "/" and os.sep in spec)
        or Path(spec).suffix.lower() in IMAGE_EXTENSIONS | DATA_FILE_SUFFIXES
    )


def _is_hub_id(spec: str) -> bool:
    return not Path(spec).expanduser().exists() and not _looks_like_path(spec) and bool(_HUB_ID.match(spec))


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "__"))


def _scan_folder(root: Path) -> tuple[list[Path], bool, bool]:
    """Image files under ``root`` (sorted, hidden skipped); whether metadata / data files were seen."""
    images: list[Path] = []
    has_metadata = has_data_files = False
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _is_hidden(d))
        for name in filenames:
            if _is_hidden(name):
                continue
            suffix = os.path.splitext(name)[1].lower()
            if name in METADATA_FILENAMES:
                has_metadata = True
            elif suffix in IMAGE_EXTENSIONS:
                images.append(Path(dirpath, name))
            elif suffix in DATA_FILE_SUFFIXES:
                has_data_files = True
    images.sort()
    return images, has_metadata, has_data_files


def _folder_has_images(path: Path) -> bool:
    if not path.is_dir() or _is_saved_dataset(path):
        return False
    for _dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not _is_hidden(d)]
        if any(os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS for n in filenames if not _is_hidden(n)):
            return True
    return False


def _folder_has_data_files(path: Path) -> bool:
    if not path.is_dir() or _is_saved_dataset(path):
        return False
    return any(p.suffix.lower() in DATA_FILE_SUFFIXES for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------- loaders


def _load_digits(spec: str, split: str | None) -> tuple[Any, str | None]:
    try:
        from tools.evaluation.digits import digits_dataset
    except ImportError as exc:
        raise DatasetError(f"built-in dataset 'digits' is unavailable ({first_line(exc)})") from exc
    chosen = split or "test"
    if chosen not in ("train", "test", "all"):
        raise DatasetError(f"split {chosen!r} not found for 'digits': choose train, test or all")
    return digits_dataset(split=chosen), chosen  # type: ignore[arg-type]


BUILTIN_DATASETS: dict[str, Callable[[str, str | None], tuple[Any, str | None]]] = {
    "digits": _load_digits,
}


def _load_builtin(spec: str, split: str | None) -> tuple[Any, str | None]:
    return BUILTIN_DATASETS[spec](spec, split)


def _load_saved(spec: str, split: str | None) -> tuple[Any, str | None]:
    from datasets import DatasetDict, load_from_disk

    try:
        loaded = load_from_disk(str(Path(spec).expanduser()))
    except Exception as exc:
        raise DatasetError(f"cannot read the save_to_disk dataset at {spec}: {first_line(exc)}") from exc
    if isinstance(loaded, DatasetDict):
        return pick_from_dict(loaded, split)
    own_split = str(loaded.split) if loaded.split is not None else None
    if split is not None and own_split is not None and _canonical_split(split) != _canonical_split(own_split):
        logger.info("%s holds a single split (%s); using it for requested split %r", spec, own_split, split)
    return loaded, own_split or split


def _load_imagefolder_hf(root: Path, split: str | None) -> tuple[Any, str | None]:
    """The general path: ``load_dataset("imagefolder")`` (metadata files, unusual layouts)."""
    from datasets import load_dataset

    try:
        loaded = load_dataset("imagefolder", data_dir=str(root))
    except Exception as exc:
        raise DatasetError(f"cannot load image folder {root}: {first_line(exc)}") from exc
    return pick_from_dict(loaded, split)


def _rows_from_files(files: list[Path], root: Path) -> Any:
    """A ``datasets.Dataset`` of (image path, class label) for files at ``<root>/<class>/<image>``."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    depths = {len(f.relative_to(root).parts) for f in files}
    if depths == {1}:  # the images directly in the folder: no labels (judged against the original's answers)
        logger.info("image folder %s has no class sub-folders: its %d images are unlabelled", root, len(files))
        features = Features({"image": ImageFeature(), "label": ClassLabel(names=[UNLABELLED])})
        return Dataset.from_dict({"image": [str(f) for f in files], "label": [0] * len(files)}, features=features)
    if depths != {2}:
        raise DatasetError(
            f"image folder {root} mixes images at different depths: use <root>/[<split>/]<class>/<image>"
        )
    classes = [f.parent.name for f in files]
    names = sorted(set(classes))
    if len(names) == 1:
        logger.info("image folder %s has a single class folder (%s)", root, names[0])
    index = {name: i for i, name in enumerate(names)}
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=names)})
    return Dataset.from_dict(
        {"image": [str(f) for f in files], "label": [index[c] for c in classes]}, features=features
    )


def _load_imagefolder(spec: str, split: str | None) -> tuple[Any, str | None]:
    root = Path(spec).expanduser()
    files, has_metadata, _ = _scan_folder(root)
    if not files:
        examples = ", ".join(sorted(IMAGE_EXTENSIONS)[:6])
        raise DatasetError(f"folder {root} contains no images ({examples}, ...)")
    if has_metadata:
        return _load_imagefolder_hf(root, split)
    top = {f.relative_to(root).parts[0] for f in files}
    split_dirs = {d for d in top if d.lower() in SPLIT_ALIASES}
    if split_dirs and split_dirs == top and all(len(f.relative_to(root).parts) > 1 for f in files):
        chosen = choose_split(sorted(split_dirs), split)
        split_root = root / chosen
        selected = [f for f in files if f.relative_to(root).parts[0] == chosen]
        return _rows_from_files(selected, split_root), _canonical_split(chosen)
    if split_dirs:
        return _load_imagefolder_hf(root, split)
    if split is not None and _canonical_split(split) != "train":
        logger.info("image folder %s has no split sub-folders; using all of it as split %r", root, split)
    return _rows_from_files(files, root), split


def _load_local_repo(spec: str, split: str | None) -> tuple[Any, str | None]:
    from datasets import load_dataset

    try:
        loaded = load_dataset(str(Path(spec).expanduser()))
    except Exception as exc:
        raise DatasetError(f"cannot load the dataset files in {spec}: {first_line(exc)}") from exc
    return pick_from_dict(loaded, split)


def _load_hub(spec: str, split: str | None) -> tuple[Any, str | None]:
    from datasets import get_dataset_split_names, load_dataset

    repo, _, config = spec.partition(":")
    config_name = config or None
    try:
        available = list(get_dataset_split_names(repo, config_name))
    except Exception as exc:
        raise DatasetError(
            f"{spec!r} is not a local path and could not be loaded from the Hugging Face Hub: {first_line(exc)}"
        ) from exc
    chosen = choose_split(available, split)
    try:
        rows = load_dataset(repo, config_name, split=chosen)
    except Exception as exc:
        message = f"cannot load split {chosen!r} of hub dataset {spec!r}: {first_line(exc)}"
        raise DatasetError(message) from exc
    return rows, chosen


DATASET_SOURCES: dict[str, DatasetSource] = {
    "builtin": DatasetSource("builtin", lambda s: s in BUILTIN_DATASETS, _load_builtin, "a built-in dataset name"),
    "disk": DatasetSource(
        "disk", lambda s: _is_saved_dataset(Path(s).expanduser()), _load_saved, "a save_to_disk directory"
    ),
    "imagefolder": DatasetSource(
        "imagefolder",
        lambda s: _folder_has_images(Path(s).expanduser()),
        _load_imagefolder,
        "a folder of <class>/<image> files",
    ),
    "localrepo": DatasetSource(
        "localrepo",
        lambda s: _folder_has_data_files(Path(s).expanduser()),
        _load_local_repo,
        "a folder of parquet/arrow/csv/json files",
    ),
    "hub": DatasetSource(
        "hub",
        _is_hub_id,
        _load_hub,
        "a Hugging Face Hub dataset id",
    ),
}


def resolve_source(spec: str) -> DatasetSource:
    """The first source in :data:`DATASET_SOURCES` accepting ``spec``; else a DatasetError saying why."""
    if not spec or not spec.strip():
        raise DatasetError("empty dataset spec: give 'digits', a local folder or a Hugging Face dataset id")
    for source in DATASET_SOURCES.values():
        if source.accepts(spec):
            return source
    path = Path(spec).expanduser()
    if not path.exists():
        raise DatasetError(f"dataset path {spec} does not exist (and it is not a built-in name or hub id)")
    if path.is_file():
        raise DatasetError(f"{spec} is a file: give a folder of images, a save_to_disk folder or a hub id")
    raise DatasetError(f"folder {spec} has no images and no dataset files: expected <root>/<class>/<image>")
