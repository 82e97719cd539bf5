"""The bundled digits data (tools.evaluation.digits) and the committed demo models (tools/models/assets/digits-*)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from tools.evaluation.digits import DIGIT_NAMES, IMAGE_SIZE, digits_dataset, split_indices
from tools.models.builtin import ASSETS

MODELS = ("digits-vit", "digits-cnn")
# What scripts/train_demo_models.py may tune: optimisation and ordinary augmentation, nothing aimed at pruning.
PLAIN_SETTINGS = {
    "epochs",
    "lr",
    "weight_decay",
    "batch_size",
    "warmup_epochs",
    "label_smoothing",
    "max_rotation_deg",
    "max_scale",
    "max_shift_px",
}


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


@pytest.mark.parametrize("name", MODELS)
def test_committed_model_was_selected_on_validation_data_from_the_train_split(name: str) -> None:
    recorded = json.loads((ASSETS / name / "training_result.json").read_text())
    assert set(recorded["settings"]) == PLAIN_SETTINGS, "only plain optimisation settings, no pruning regulariser"
    selection = recorded["selection"]
    validation = selection["validation_indices"]
    train, test = set(split_indices()["train"]), set(split_indices()["test"])
    assert len(set(validation)) == len(validation) == selection["validation_size"] >= 200
    assert set(validation) <= train and not set(validation) & test
    assert selection["fit_size"] + selection["validation_size"] == recorded["train_size"] == len(train)
    candidates = selection["candidates"]
    assert len(candidates) >= 2
    ranked = sorted(candidates, key=lambda c: (-c["validation_accuracy"], c["validation_cross_entropy"]))
    chosen = candidates[selection["chosen"]]
    assert chosen == ranked[0], "the chosen settings are the best on validation"
    for key in selection["grid"]:
        assert recorded["settings"][key] == chosen[key]
    assert all(
        recorded["settings"][k] == v for k, v in selection["base_settings"].items() if k not in selection["grid"]
    )


def _head_norms(attention: torch.nn.Module) -> torch.Tensor:
    """L2 norm of each head's weights: its q, k, v rows and its output-projection columns."""
    d = attention.head_dim
    rows = [
        getattr(attention, n).weight.reshape(-1, d * attention.q_proj.in_features)
        for n in ("q_proj", "k_proj", "v_proj")
    ]
    out = attention.o_proj.weight.reshape(attention.o_proj.out_features, -1, d).transpose(0, 1)
    return torch.cat([*rows, out.reshape(len(rows[0]), -1)], dim=1).norm(dim=1)


@torch.no_grad()
def test_committed_vit_has_no_head_switched_off_in_training() -> None:
    """A regulariser that drives a head to zero norm makes head pruning free; a plain model has none such."""
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(ASSETS / "digits-vit")
    for i, layer in enumerate(model.vit.layers):
        norms = _head_norms(layer.attention)
        assert norms.min() > 0.5 * norms.median(), f"layer {i} head norms {norms.tolist()}"


@torch.no_grad()
def test_committed_cnn_has_no_batchnorm_channels_switched_off_in_training() -> None:
    """Network slimming (L1 on BatchNorm scales) zeroes whole channels; a plain model keeps them alive."""
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(ASSETS / "digits-cnn")
    scales = torch.cat([m.weight.abs() for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)])
    assert (scales < 1e-2).float().mean() < 0.02, f"{int((scales < 1e-2).sum())} of {len(scales)} near zero"
