"""A distilled round's two students as one result: each student's answers on the half of the choose images it was
not distilled on, merged and paired with the original's on every image (:func:`cross_fitted`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tools.evaluation.paired import ImagePredictions
from tools.schemas import PairedAccuracy
from tools.stats import paired_accuracy
from tools.store.files import read_json

__all__ = ["cross_fitted"]


def _read(files: Sequence[str | Path]) -> ImagePredictions | None:
    """The predictions in ``files`` as one (a distilled round's students, each on its half); None if any is
    missing or unreadable."""
    parts: list[ImagePredictions] = []
    for file in files:
        try:
            parts.append(ImagePredictions.model_validate(read_json(Path(file))))
        except (OSError, ValueError):
            return None
    if not parts:
        return None
    indices = [i for p in parts for i in list(p.key.get("indices") or [])[: len(p.correct)]]
    return ImagePredictions(
        key={"indices": indices},
        predictions=[a for p in parts for a in p.predictions],
        correct=[c for p in parts for c in p.correct],
    )


def cross_fitted(original: Path, halves: Sequence[str | Path]) -> PairedAccuracy | None:
    """One model recipe's result on every evaluation image, paired with the original's: ``halves`` holds the
    per-image predictions of its builds from a distilled round's students, each on the half of the images its
    student was not distilled on. None unless together they cover each of the original's images once (a build
    stopped early, a file missing)."""
    base, joined = _read([original]), _read(halves)
    if base is None or joined is None:
        return None
    indices = [int(i) for i in base.key.get("indices") or []]
    at = {int(i): k for k, i in enumerate(joined.key.get("indices") or [])}
    if len(indices) != len(base.correct) or len(at) != len(joined.correct) or sorted(at) != sorted(indices):
        return None
    rows = [at[i] for i in indices]
    return paired_accuracy(
        base.correct, [joined.correct[k] for k in rows], base.predictions, [joined.predictions[k] for k in rows]
    )
