"""ImageNet-1k's WordNet IDs, the names its image folders carry, with their class names.

ImageNet's images are usually laid out one folder per class named by WordNet ID (``n01440764``: torchvision's
``ImageFolder`` layout of the validation set), while its classifiers name their classes in words (``tench, Tinca
tinca``; torchvision's ``tench``), index ``i`` being the ``i``-th ID in sorted order. ``imagenet_1k.tsv`` holds the
1,000 IDs in that order with their WordNet lemmas (the table timm ships in ``timm/data/_info``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IMAGENET_1K_CLASSES", "ImageNetClass", "imagenet_1k", "is_wordnet_id"]

IMAGENET_1K_CLASSES = 1000
_TABLE = Path(__file__).with_name("imagenet_1k.tsv")
_WORDNET_ID = re.compile(r"^n\d{8}$")


@dataclass(frozen=True)
class ImageNetClass:
    """One ImageNet-1k class: its index in the models' order and its WordNet lemmas."""

    index: int
    name: str


def is_wordnet_id(name: str) -> bool:
    """Whether ``name`` is written as a WordNet noun ID (``n`` and eight digits)."""
    return bool(_WORDNET_ID.match(str(name).strip()))


@functools.cache
def imagenet_1k() -> dict[str, ImageNetClass]:
    """WordNet ID -> its ImageNet-1k class index and WordNet lemmas, for the 1,000 classes."""
    rows = [line.split("\t") for line in _TABLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {wnid: ImageNetClass(index, name) for index, (wnid, name) in enumerate(rows)}
