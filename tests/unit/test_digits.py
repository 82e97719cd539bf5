"""The bundled digits data (tools.digits) and the committed demo models (tools/assets/digits-*)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from tools.evaluation.digits import DIGIT_NAMES, IMAGE_SIZE, digits_dataset, split_indices
from tools.models.builtin import ASSETS

MODELS = ("digits-vit", "digits-cnn")


@pytest.fixture(scope="module")
def test_split():
    return digits_dataset("test")


def test_split_sizes_and_labels(test_split) -> None:
    assert len(digits_dataset("train")) == 1257
    assert len(test_split) == 540
    assert len(digits_dataset("all")) == 1797
    assert DIGIT_NAMES == ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    assert test_split.features["label"].names == list(DIGIT_NAMES)
    assert test_split.column_names == ["image", "label"]
    counts = Counter(test_split["label"])
    assert sorted(counts) == list(range(10))
    assert all(52 <= n <= 55 for n in counts.values())  # stratified


def test_split_is_deterministic_and_disjoint() -> None:
    first = split_indices()
    split_indices.cache_clear()
    second = split_indices()
    assert first == second
    train, test = set(first["train"]), set(first["test"])
    assert not train & test
    assert train | test == set(first["all"]) == set(range(1797))


def test_images_are_rgb_uint8_pixel_replicas(test_split) -> None:
    from sklearn.datasets import load_digits

    index = split_indices()["test"][0]
    image = test_split[0]["image"]
    assert image.mode == "RGB" and image.size == (IMAGE_SIZE, IMAGE_SIZE)
    pixels = np.asarray(image)
    assert pixels.dtype == np.uint8
    assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 0] == pixels[..., 2]).all()
    native = np.rint(load_digits().images[index] * 255 / 16).astype(np.uint8)
    assert (pixels[::4, ::4, 0] == native).all()
    assert (pixels[..., 0] == np.kron(native, np.ones((4, 4), dtype=np.uint8))).all()
    assert test_split[0]["label"] == int(load_digits().target[index])
    again = digits_dataset("test")[0]["image"]
    assert np.array_equal(np.asarray(again), pixels)


@pytest.mark.parametrize("name", MODELS)
def test_committed_model_accuracy(name: str, test_split) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    folder = ASSETS / name
    for file in ("config.json", "model.safetensors", "preprocessor_config.json", "training_result.json"):
        assert (folder / file).is_file(), f"missing {folder / file}"
    assert (folder / "model.safetensors").stat().st_size < 2_000_000
    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    processor = AutoImageProcessor.from_pretrained(folder)
    assert [model.config.id2label[i] for i in range(10)] == list(DIGIT_NAMES)

    pixels = processor(images=list(test_split["image"]), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (540, 3, IMAGE_SIZE, IMAGE_SIZE)
    with torch.no_grad():
        predicted = model(pixel_values=pixels).logits.argmax(-1)
    accuracy = (predicted == torch.tensor(test_split["label"])).float().mean().item()
    assert accuracy >= 0.95
    recorded = json.loads((folder / "training_result.json").read_text())
    assert abs(recorded["test_accuracy"] - accuracy) < 0.01
