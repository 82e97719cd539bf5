"""Real offline data for the demo: scikit-learn's bundled handwritten digits as a HF dataset.

``sklearn.datasets.load_digits`` ships 1797 grey 8x8 images (values 0..16) with the library, so the
demo needs no download. Each image is scaled to 0..255 (uint8), enlarged ``UPSCALE`` times by pixel
replication (every native pixel becomes a 4x4 block, so no interpolation is involved and the
result is identical on every platform) to ``IMAGE_SIZE`` x ``IMAGE_SIZE``, and stored as a PIL RGB
image. The demo models in ``tools/models/assets`` take this size, so their image processors do not resize.

The split is a fixed stratified 70/30 split (1257 train / 540 test); the demo models were trained
on ``"train"`` only, their hyper-parameters chosen on a validation part carved from it
(``scripts/train_demo_models.py``), so ``"test"`` is held out.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
from datasets import ClassLabel, Dataset, Features
from datasets import Image as ImageFeature
from PIL import Image

DIGIT_NAMES: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)
NATIVE_SIZE = 8
UPSCALE = 4
IMAGE_SIZE = NATIVE_SIZE * UPSCALE
SPLIT_SEED = 0
TEST_FRACTION = 0.3

Split = Literal["train", "test", "all"]


def digits_features() -> Features:
    """The dataset's schema: a PIL RGB ``image`` and a ``label`` named by :data:`DIGIT_NAMES`."""
    return Features({"image": ImageFeature(), "label": ClassLabel(names=list(DIGIT_NAMES))})


@lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 images as uint8 (N, IMAGE_SIZE, IMAGE_SIZE) arrays scaled to 0..255, and their labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    native = np.asarray(bunch.images, dtype=np.float64)  # (N, 8, 8), values 0..16
    scaled = np.clip(np.rint(native * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    block = np.ones((UPSCALE, UPSCALE), dtype=np.uint8)
    big = np.stack([np.kron(img, block) for img in scaled])
    labels = np.asarray(bunch.target, dtype=np.int64)
    big.setflags(write=False)
    labels.setflags(write=False)
    return big, labels


@lru_cache(maxsize=1)
def split_indices() -> dict[str, tuple[int, ...]]:
    """Sorted indices into ``load_digits()`` of the fixed stratified split: ``train``, ``test``, ``all``."""
    from sklearn.model_selection import train_test_split

    _, labels = _digits_arrays()
    every = np.arange(len(labels))
    train, test = train_test_split(every, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    return {
        "train": tuple(int(i) for i in np.sort(train)),
        "test": tuple(int(i) for i in np.sort(test)),
        "all": tuple(int(i) for i in every),
    }


def digits_dataset(split: Split = "test") -> Dataset:
    """The digits as a ``datasets.Dataset`` with features ``image`` (PIL RGB, 32x32) and ``label``.

    ``split`` is ``"train"`` (1257 images), ``"test"`` (540, never used in training) or ``"all"``
    (1797, in ``load_digits`` order). The result is deterministic.
    """
    indices = split_indices().get(split)
    if indices is None:
        raise ValueError(f"split must be 'train', 'test' or 'all', not {split!r}")
    images, labels = _digits_arrays()
    pil_images = [Image.fromarray(images[i]).convert("RGB") for i in indices]
    return Dataset.from_dict(
        {"image": pil_images, "label": [int(labels[i]) for i in indices]},
        features=digits_features(),
    )
