"""ImageNet image folders named by WordNet ID (``n01440764``): matched to a model of ImageNet-1k's classes by their
index, to any other model by their WordNet names, through the run's own data path too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tools.evaluation.labels import BY_WORDNET_ID, LabelMatch, match_labels
from tools.evaluation.wordnet import IMAGENET_1K_CLASSES, imagenet_1k, is_wordnet_id
from tools.stages import ops

TENCH, BIRD_CRANE, MACHINE_CRANE, MAILLOT, TANK_SUIT = "n01440764", "n02012849", "n03126707", "n03710637", "n03710721"
HF_NAMES = {c.index: c.name for c in imagenet_1k().values()}  # the id2label of Hugging Face's ImageNet checkpoints


def torchvision_names() -> dict[int, str]:
    """torchvision's categories: the first lemma, and the bird crane renamed."""
    names = {i: name.split(",")[0] for i, name in HF_NAMES.items()}
    return names | {134: "crane bird"}


def test_the_table_is_imagenet_1k_in_the_models_order() -> None:
    table = imagenet_1k()
    assert len(table) == IMAGENET_1K_CLASSES and list(table) == sorted(table)
    assert [c.index for c in table.values()] == list(range(IMAGENET_1K_CLASSES))
    assert table[TENCH].index == 0 and table[TENCH].name == "tench, Tinca tinca"
    assert all(is_wordnet_id(wnid) for wnid in table) and not is_wordnet_id("tench")


@pytest.mark.parametrize("names", [HF_NAMES, torchvision_names()], ids=["hugging-face", "torchvision"])
def test_ids_take_their_imagenet_index_and_repeated_names_stay_apart(names: dict[int, str]) -> None:
    ids = [TENCH, BIRD_CRANE, MACHINE_CRANE, MAILLOT, TANK_SUIT, "n99999999"]
    match = match_labels(names, ids)
    assert match.mapping == {0: 0, 1: 134, 2: 517, 3: 638, 4: 639}  # both cranes, both maillots, each its own
    assert match.unmatched == ["n99999999"]
    assert set(match.match_kinds.values()) == {BY_WORDNET_ID} and match.same_class == {}
    assert match.matched_names[BIRD_CRANE] == names[134]
    assert match.wordnet_ids is not None and "ImageNet-1k index" in match.wordnet_ids
    assert match.notes() == [match.wordnet_ids]
    assert LabelMatch.model_validate(match.model_dump()) == match


def test_a_background_class_first_shifts_every_index() -> None:
    names = {0: "background"} | {i + 1: name for i, name in HF_NAMES.items()}  # google/mobilenet_v2_1.0_224
    match = match_labels(names, [TENCH, MACHINE_CRANE])
    assert match.mapping == {0: 1, 1: 518}
    assert "background" in (match.wordnet_ids or "")


def test_a_model_of_other_classes_is_matched_by_the_ids_wordnet_names() -> None:
    cifar = {0: "airplane", 1: "automobile", 2: "bird", 3: "cat", 4: "dog"}
    match = match_labels(cifar, ["n02123045", "n02085620", TENCH])  # tabby cat, Chihuahua, tench
    assert match.mapping == {0: 3}
    assert match.matched_names == {"n02123045": "cat"}  # keyed by the dataset's own names
    assert match.unmatched == ["n02085620", TENCH]
    assert "WordNet names" in (match.wordnet_ids or "")


def test_imagenet_order_needs_the_names_to_agree() -> None:
    shuffled = {i: HF_NAMES[(i + 7) % IMAGENET_1K_CLASSES] for i in HF_NAMES}  # 1,000 ImageNet names, another order
    match = match_labels(shuffled, [TENCH, "n01443537"])
    assert match.mapping == {0: IMAGENET_1K_CLASSES - 7, 1: IMAGENET_1K_CLASSES - 6}  # found by name, not by index
    assert set(match.match_kinds.values()) == {"exact"}


def test_model_labels_given_as_ids_match_by_name() -> None:
    ids = list(imagenet_1k())
    match = match_labels(dict(enumerate(ids)), [ids[5], ids[900]])  # --labels synsets.txt
    assert match.mapping == {0: 5, 1: 900} and match.wordnet_ids is None


def test_an_image_folder_of_ids_is_evaluated_through_the_run_data_path(tmp_path: Path) -> None:
    from tests.helpers import save_tiny, tiny_vit

    model = tiny_vit(num_labels=IMAGENET_1K_CLASSES)
    model.config.id2label, model.config.label2id = dict(HF_NAMES), {n: i for i, n in HF_NAMES.items()}
    original = tmp_path / "original"
    ops.acquire(str(save_tiny(model, tmp_path / "model", 16)), original)
    rng = np.random.default_rng(0)
    for wnid in (TENCH, BIRD_CRANE, MACHINE_CRANE):
        (tmp_path / "val" / wnid).mkdir(parents=True)
        for k in range(3):
            pixels = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "val" / wnid / f"{k}.png")
    match = LabelMatch.model_validate(ops.match_dataset_labels(original, str(tmp_path / "val"), None, 9, 0))
    assert match.mapping == {0: 0, 1: 134, 2: 517} and not match.unmatched
