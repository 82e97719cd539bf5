"""Dataset resolution, split/column choice, seeded subsets and error messages (temporary data only)."""

from __future__ import annotations

import time
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from tools.evaluation.datasets import EvalDataset, load_eval_dataset, subset_indices, to_pil
from tools.evaluation.sources import DATASET_SOURCES, DatasetError, choose_split, resolve_source

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def _write_images(root: Path, per_class: int = 4, classes: dict[str, tuple[int, int, int]] = COLOURS) -> None:
    for name, rgb in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), rgb).save(root / name / f"{i:03d}.png")


@pytest.fixture()
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "colours"
    _write_images(root)
    return root


def _features(names: list[str]) -> datasets.Features:
    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})


def _colour_rows(count: int) -> dict[str, list[object]]:
    names = list(COLOURS)
    return {
        "image": [Image.new("RGB", (4, 4), COLOURS[names[i % 3]]) for i in range(count)],
        "label": [i % 3 for i in range(count)],
    }


def test_registry_is_a_dict_of_named_sources() -> None:
    assert list(DATASET_SOURCES) == ["builtin", "disk", "imagefolder", "localrepo", "hub"]
    assert resolve_source("digits").name == "builtin"
    assert resolve_source("uoft-cs/cifar10").name == "hub"
    assert resolve_source("cifar10:plain_text").name == "hub"


def test_image_folder_labels_from_class_dirs(image_folder: Path) -> None:
    data = load_eval_dataset(str(image_folder), samples=100)
    assert isinstance(data, EvalDataset)
    assert data.label_names == ["blue", "green", "red"]
    assert data.size_total == 12 and len(data.images) == 12 and len(data) == 12
    assert data.source == f"imagefolder:{image_folder}"
    for image, label in zip(data.images, data.labels, strict=True):
        assert image.mode == "RGB"
        assert image.getpixel((0, 0)) == COLOURS[data.label_names[label]]


def test_image_folder_matches_load_dataset_imagefolder(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast folder index gives the same rows, order and labels as load_dataset("imagefolder")."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    reference = datasets.load_dataset("imagefolder", data_dir=str(image_folder), split="train")
    ours = load_eval_dataset(str(image_folder), samples=5, seed=3)
    expected = reference.shuffle(seed=3).select(range(5))
    assert ours.label_names == reference.features["label"].names
    assert ours.labels == list(expected["label"])
    assert [np.asarray(i).tolist() for i in ours.images] == [
        np.asarray(i.convert("RGB")).tolist() for i in expected["image"]
    ]


def test_metadata_folder_goes_through_load_dataset(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    flat = tmp_path / "flat"
    flat.mkdir()
    lines = ["file_name,label"]
    for i, name in enumerate(["cat", "dog", "cat", "dog"]):
        Image.new("RGB", (4, 4), (i * 60, 0, 0)).save(flat / f"{i}.png")
        lines.append(f"{i}.png,{name}")
    (flat / "metadata.csv").write_text("\n".join(lines) + "\n")
    data = load_eval_dataset(str(flat), samples=10)
    assert data.label_names == ["cat", "dog"]  # string labels become sorted class names
    assert sorted(data.labels) == [0, 0, 1, 1]


def test_seeded_subsets_reproducible_and_seed_dependent(image_folder: Path) -> None:
    first = load_eval_dataset(str(image_folder), samples=6, seed=7)
    again = load_eval_dataset(str(image_folder), samples=6, seed=7)
    other = load_eval_dataset(str(image_folder), samples=6, seed=8)
    assert len(first.images) == 6 and first.size_total == 12
    assert first.indices == again.indices and first.labels == again.labels
    assert first.indices != other.indices


def test_subset_indices_equal_dataset_shuffle() -> None:
    rows = datasets.Dataset.from_dict({"i": list(range(50))})
    assert subset_indices(50, 10, 5) == rows.shuffle(seed=5)["i"][:10]
    assert sorted(subset_indices(5, 10, 0)) == [0, 1, 2, 3, 4]
    assert len(subset_indices(50, None, 1)) == 50


def test_split_folders(tmp_path: Path) -> None:
    root = tmp_path / "splits"
    _write_images(root / "train", per_class=3)
    _write_images(root / "test", per_class=2)
    assert load_eval_dataset(str(root)).size_total == 6
    assert load_eval_dataset(str(root)).split == "test"
    chosen = load_eval_dataset(str(root), split="train")
    assert chosen.size_total == 9 and chosen.split == "train"
    with pytest.raises(DatasetError, match="split 'validation' not found"):
        load_eval_dataset(str(root), split="validation")


def test_choose_split_preference() -> None:
    assert choose_split(["train", "validation", "test"], None) == "test"
    assert choose_split(["train", "validation"], None) == "validation"
    assert choose_split(["train", "val"], None) == "val"
    assert choose_split(["train"], None) == "train"
    assert choose_split(["other"], None) == "other"
    assert choose_split(["train", "validation"], "val") == "validation"


def test_save_to_disk_dataset(tmp_path: Path) -> None:
    path = tmp_path / "saved"
    datasets.Dataset.from_dict(_colour_rows(9), features=_features(list(COLOURS))).save_to_disk(str(path))
    assert resolve_source(str(path)).name == "disk"
    data = load_eval_dataset(str(path), samples=4, seed=1)
    assert data.label_names == ["red", "green", "blue"]
    assert len(data.images) == 4 and data.size_total == 9
    for image, label in zip(data.images, data.labels, strict=True):
        assert image.getpixel((0, 0)) == COLOURS[data.label_names[label]]


def test_save_to_disk_dataset_dict_picks_test(tmp_path: Path) -> None:
    path = tmp_path / "saved_dict"
    features = _features(list(COLOURS))
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(_colour_rows(6), features=features),
        test=datasets.Dataset.from_dict(_colour_rows(3), features=features),
    ).save_to_disk(str(path))
    data = load_eval_dataset(str(path))
    assert data.split == "test" and data.size_total == 3
    assert load_eval_dataset(str(path), split="train").size_total == 6


def test_conventional_column_names_without_features(tmp_path: Path) -> None:
    path = tmp_path / "arrays"
    arrays = [np.full((3, 5, 6), v, dtype=np.uint8) for v in (0, 128, 255)]  # CHW uint8
    datasets.Dataset.from_dict({"img": arrays, "fine_label": ["b", "a", "b"]}).save_to_disk(str(path))
    data = load_eval_dataset(str(path), samples=3, seed=0)
    assert data.label_names == ["a", "b"]
    assert all(image.size == (6, 5) and image.mode == "RGB" for image in data.images)


def test_missing_label_column(tmp_path: Path) -> None:
    path = tmp_path / "no_label"
    datasets.Dataset.from_dict(
        {"image": _colour_rows(3)["image"], "caption": ["a", "b", "c"]},
        features=datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")}),
    ).save_to_disk(str(path))
    with pytest.raises(DatasetError, match="no label column"):
        load_eval_dataset(str(path))


def test_missing_image_column(tmp_path: Path) -> None:
    path = tmp_path / "no_image"
    datasets.Dataset.from_dict(
        {"text": ["a", "b"], "label": [0, 1]},
        features=datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["x", "y"])}),
    ).save_to_disk(str(path))
    with pytest.raises(DatasetError, match="no image column"):
        load_eval_dataset(str(path))


def test_empty_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    (empty / "notes.txt").write_text("nothing here")
    with pytest.raises(DatasetError, match="no images"):
        load_eval_dataset(str(empty))


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_eval_dataset(str(tmp_path / "nowhere" / "data"))
    with pytest.raises(DatasetError, match="does not exist"):
        load_eval_dataset("./no/such/folder")


def test_images_without_class_folders_are_unlabelled(tmp_path: Path) -> None:
    """A folder with the images directly in it is read as unlabelled: one class, and the label matching says so."""
    from tools.evaluation.labels import match_labels

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        Image.new("RGB", (4, 4), (i, i, i)).save(flat / f"{i}.png")
    data = load_eval_dataset(str(flat), samples=None)
    assert len(data) == 3 and data.unlabelled and data.labels == [0, 0, 0]
    match = match_labels({0: "cat", 1: "dog"}, data.label_names)
    assert match.unlabelled and match.mapping == {0: 0}


def test_images_at_mixed_depths(tmp_path: Path) -> None:
    (tmp_path / "mixed" / "cat").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "mixed" / "a.png")
    Image.new("RGB", (4, 4)).save(tmp_path / "mixed" / "cat" / "b.png")
    with pytest.raises(DatasetError, match="different depths"):
        load_eval_dataset(str(tmp_path / "mixed"))


def test_bad_sample_count(image_folder: Path) -> None:
    with pytest.raises(DatasetError, match="samples must be >= 1"):
        load_eval_dataset(str(image_folder), samples=0)


def test_hub_failure_is_a_dataset_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*_args: object, **_kwargs: object) -> list[str]:
        raise ConnectionError("hub unreachable\nmore detail")

    monkeypatch.setattr(datasets, "get_dataset_split_names", offline)
    with pytest.raises(DatasetError, match=r"loaded from the Hugging Face Hub: hub unreachable$"):
        load_eval_dataset("someone/some-dataset")


def test_modes_grey_kept_others_rgb(tmp_path: Path) -> None:
    assert to_pil(Image.new("L", (2, 2), 7)).mode == "L"
    assert to_pil(Image.new("RGBA", (2, 2))).mode == "RGB"
    assert to_pil(Image.new("P", (2, 2))).mode == "RGB"
    assert to_pil(Image.new("1", (2, 2))).mode == "L"
    assert to_pil(np.zeros((5, 6), dtype=np.uint8)).size == (6, 5)
    assert to_pil(np.ones((3, 5, 6), dtype=np.float32)).getpixel((0, 0)) == (255, 255, 255)
    root = tmp_path / "grey"
    for name, value in (("dark", 10), ("light", 240)):
        (root / name).mkdir(parents=True)
        Image.new("L", (4, 4), value).save(root / name / "0.png")
    data = load_eval_dataset(str(root))
    assert {image.mode for image in data.images} == {"L"}


def test_builtin_digits() -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("tools.evaluation.digits")
    data = load_eval_dataset("digits", samples=20, seed=0)
    assert data.label_names[:3] == ["zero", "one", "two"]
    assert len(data.images) == 20 and data.split == "test" and data.size_total > 20


@pytest.mark.shared
def test_cifar10_folder_500_samples_fast(shared_dir: Path) -> None:
    start = time.perf_counter()
    data = load_eval_dataset(str(shared_dir / "data" / "cifar10-test"), samples=500, seed=0)
    elapsed = time.perf_counter() - start
    assert len(data.images) == 500 and data.size_total == 10_000
    assert data.label_names[:3] == ["airplane", "automobile", "bird"]
    assert len(set(data.labels)) == 10
    assert elapsed < 5.0, f"loading 500 CIFAR-10 samples took {elapsed:.2f}s"


def test_automatic_evaluation_size_follows_the_budget_and_the_model_macs() -> None:
    """--eval-samples 0: at least what the budget test needs (2,000 images for 1 point), small models more (up to
    5,000)."""
    from agents.context import Context
    from agents.evaluation import eval_spec
    from tests.helpers import typed_state
    from tools.stages.run_data import auto_eval_samples

    assert auto_eval_samples(15_000_000) == 5000  # cifar10-vit-tiny
    assert auto_eval_samples(17_600_000_000) == 2000  # ViT-B/16: what a 1-point budget needs
    assert auto_eval_samples(17_600_000_000, budget_points=2.0) == 1000  # the floor
    assert auto_eval_samples(150_000_000) == 3333  # between the bounds: about 10 s at 5e10 MAC/s
    assert auto_eval_samples(None) == 2000
    state = typed_state({"dataset": "d", "profile_summary": {"total_macs": 15_000_000}})
    assert eval_spec(state, Context()).samples == 5000
    assert eval_spec(state, Context(eval_samples=300)).samples == 300
    assert (
        eval_spec(typed_state({"dataset": "d"}), Context()).samples == 2000
    )  # before the profile: what the budget needs
    # the automatic size takes the spare rows; a size given, or a run judged on exactly the asked rows, does not
    assert eval_spec(state, Context()).spare_to_evaluation
    assert not eval_spec(state, Context(eval_samples=300)).spare_to_evaluation
    summary = {"total_macs": 128_000_000}
    made_before = typed_state(
        {"dataset": "d", "profile_summary": summary, "baseline": {"data_parts": {"evaluation": 3906}}}
    )
    assert (
        eval_spec(made_before, Context()).samples == 3906 and not eval_spec(made_before, Context()).spare_to_evaluation
    )
    made_now = typed_state(
        {"dataset": "d", "profile_summary": summary, "baseline": {"data_parts": {"evaluation": 4744}}}
    )
    assert eval_spec(made_now, Context()).spare_to_evaluation


def test_the_automatic_evaluation_size_takes_the_rows_no_part_takes() -> None:
    from tools.evaluation.datasets import SPARE_ROWS_SHARE, split_indices

    # CIFAR ResNet-56 on 5,000 images: the time cap asked for 3,909 and left 835 rows that served nothing
    sizes = {"calibration": 256, "evaluation": 3909}
    asked = split_indices(5000, sizes, seed=0)
    spare = split_indices(5000, sizes, seed=0, spare_to_evaluation=True)
    assert len(asked["evaluation"]) == 3909 and len(spare["evaluation"]) == 4744
    assert spare["evaluation"][:3909] == asked["evaluation"] and spare["calibration"] == asked["calibration"]
    # many rows beyond what was asked (ViT-B/16's 2,000 of 50,000): the time cap holds
    vit_b = split_indices(50_000, {**sizes, "evaluation": 2000}, seed=0, spare_to_evaluation=True)
    assert len(vit_b["evaluation"]) == 2000
    over = int(3909 * (1 + SPARE_ROWS_SHARE)) + 256 + 1
    assert len(split_indices(over, sizes, seed=0, spare_to_evaluation=True)["evaluation"]) == 3909
    # distillation's images are not taken from
    tuned = split_indices(5000, {**sizes, "finetune": 500}, seed=0, spare_to_evaluation=True)
    assert [len(tuned[k]) for k in ("calibration", "evaluation", "finetune")] == [256, 4244, 500]


def test_the_run_spec_takes_the_spare_rows_only_at_the_automatic_size(image_folder: Path) -> None:
    from tools.stages.run_data import EvalSpec, check_data

    spec = EvalSpec(dataset=str(image_folder), samples=6, calibration_samples=4, spare_to_evaluation=True)
    total = check_data(spec).total
    assert total - 4 == 8  # two rows beyond the six asked for: evaluation takes them
    assert len(spec.part("evaluation")) == 8 == check_data(spec).parts["evaluation"]
    given = spec.model_copy(update={"spare_to_evaluation": False})
    assert len(given.part("evaluation")) == 6 == check_data(given).parts["evaluation"]
