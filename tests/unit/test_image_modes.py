"""Decoding images of every mode, and leaving out the ones that cannot be decoded (temporary files only)."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from tools.evaluation.datasets import (
    MAX_UNREADABLE_FRACTION,
    load_eval_dataset,
    split_indices,
    to_pil,
    too_many_unreadable,
)
from tools.evaluation.sources import DatasetError
from tools.stages.run_data import EvalSpec, _in_mode, check_data, confirming, part_sizes

RNG = np.random.default_rng(0)


def _rgb(size: int = 12) -> Image.Image:
    return Image.fromarray(RNG.integers(0, 255, (size, size, 3), dtype=np.uint8))


def _jpeg_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG")
    return buffer.getvalue()


MODES = {
    "L": ("L", lambda im: im.convert("L")),
    "LA": ("L", lambda im: im.convert("LA")),
    "1": ("L", lambda im: im.convert("1")),
    "RGBA": ("RGB", lambda im: im.convert("RGBA")),
    "CMYK": ("RGB", lambda im: im.convert("CMYK")),
    "P": ("RGB", lambda im: im.convert("P")),
    "I;16": ("L", lambda im: Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257)),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_becomes_rgb_or_l(mode: str, tmp_path: Path) -> None:
    expected, make = MODES[mode]
    image = make(_rgb())
    assert image.mode == mode
    suffix = ".jpg" if mode == "CMYK" else ".png"
    path = tmp_path / f"image{suffix}"
    image.save(path)
    for cell in (image, {"bytes": None, "path": str(path)}, {"bytes": path.read_bytes(), "path": None}):
        decoded = to_pil(cell)
        assert decoded.mode == expected and decoded.size == (12, 12)
        assert np.asarray(decoded).shape[:2] == (12, 12)  # the pixels are there after the file was closed
    if mode == "I;16":  # 16-bit values are scaled to 8 bits, not clipped to white
        assert np.array_equal(np.asarray(to_pil(image)), np.asarray(_grey_of(image)))


def _grey_of(wide: Image.Image) -> Image.Image:
    return Image.fromarray((np.asarray(wide, dtype=np.float64) / 257).round().astype(np.uint8))


def test_palette_with_transparency_is_rgb() -> None:
    image = _rgb().convert("P")
    image.info["transparency"] = 0
    assert to_pil(image).mode == "RGB"


def test_truncated_jpeg_is_an_error_not_padding(tmp_path: Path) -> None:
    assert not ImageFile.LOAD_TRUNCATED_IMAGES, "truncated files must fail, not be padded with grey"
    data = _jpeg_bytes(_rgb(64))
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    Image.open(path)  # PIL opens lazily: only decoding finds the damage
    with pytest.raises(OSError):
        to_pil({"bytes": None, "path": str(path)})
    with pytest.raises(OSError):
        to_pil({"bytes": data[: len(data) // 2], "path": None})


def _broken_folder(root: Path, per_class: int = 30) -> Path:
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            _rgb().save(root / name / f"{i:02d}.png")
    data = _jpeg_bytes(_rgb(64))
    (root / "cat" / "cut.jpg").write_bytes(data[: len(data) // 2])
    (root / "dog" / "notes.jpg").write_text("a text file, not a JPEG\n")
    (root / "dog" / "empty.jpg").write_bytes(b"")
    _rgb().convert("CMYK").save(root / "dog" / "cmyk.jpg")
    _rgb().convert("L").save(root / "cat" / "grey.png")
    return root


def test_unreadable_images_are_left_out_and_named(tmp_path: Path) -> None:
    root = _broken_folder(tmp_path / "pets")
    data = load_eval_dataset(str(root), samples=None)
    assert data.size_total == 65 and len(data) == 62 and data.looked_at == 65
    assert sorted((u.where, u.reason) for u in data.unreadable) == [
        ("cat/cut.jpg", "truncated file"),
        ("dog/empty.jpg", "empty file"),
        ("dog/notes.jpg", "not an image file PIL can read"),
    ]
    assert len(data.labels) == len(data.indices) == len(data.images)
    assert not {u.row for u in data.unreadable} & set(data.indices)
    assert {image.mode for image in data.images} == {"RGB", "L"}
    again = load_eval_dataset(str(root), samples=None)
    assert again.indices == data.indices, "the same rows are left out every time"


def test_too_many_unreadable_images_fail_with_examples(tmp_path: Path) -> None:
    root = _broken_folder(tmp_path / "pets", per_class=10)  # 3 of 25: 12 %
    with pytest.raises(DatasetError, match=r"^3 of 25 images of .* cannot be read \(more than 5%\): .*cut\.jpg"):
        load_eval_dataset(str(root), samples=None)
    assert len(load_eval_dataset(str(root), samples=None, max_unreadable=None)) == 22
    assert too_many_unreadable("x", [], 10, MAX_UNREADABLE_FRACTION) is None


def test_hf_dataset_with_broken_bytes(tmp_path: Path) -> None:
    good = [_jpeg_bytes(_rgb()) for _ in range(40)]
    good[7] = good[7][:100]  # truncated
    good[11] = b"not an image"
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    rows = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": f"img{i}.jpg"} for i, b in enumerate(good)],
            "label": [i % 2 for i in range(40)],
        },
        features=features,
    )
    rows.save_to_disk(str(tmp_path / "saved"))
    data = load_eval_dataset(str(tmp_path / "saved"), samples=None)
    assert len(data) == 38
    assert sorted(u.where for u in data.unreadable) == ["row 11 (img11.jpg)", "row 7 (img7.jpg)"]


def test_parts_skip_unreadable_images_and_the_share_is_checked_over_all_parts(tmp_path: Path) -> None:
    root = _broken_folder(tmp_path / "pets", per_class=40)  # 85 images, 3 unreadable: 3.5 %
    broken = {u.row for u in load_eval_dataset(str(root), samples=None).unreadable}
    # a seed whose calibration part of 4 holds a broken file: 25 % of that part, 3.5 % of all images looked at
    seed = next(
        s for s in range(100) if broken & set(split_indices(85, {"calibration": 4, "evaluation": 70}, s)["calibration"])
    )
    spec = EvalSpec(dataset=str(root), samples=70, calibration_samples=4, confirm_samples=11, seed=seed)
    check = check_data(spec)
    assert check.total == 85 and check.looked_at == 85 - 11  # the confirm part is read at the confirmation
    with confirming():  # the confirm part is decoded only when the confirmation reads it
        parts = {name: spec.part(name) for name in ("calibration", "evaluation", "confirm")}
    decoded = {name: len(data) for name, data in parts.items() if name != "confirm"}
    assert check.parts == decoded | {"confirm": 11, "finetune": 0}  # the confirm part as planned: read later
    assert check.unreadable_parts["calibration"] >= 1
    assert check.unreadable_parts == {
        name: len(d.unreadable) for name, d in parts.items() if d.unreadable and name != "confirm"
    }
    seen = [row for data in parts.values() for row in data.indices]
    assert len(seen) == len(set(seen)) and not broken & set(seen), "disjoint parts, none of them broken"
    assert part_sizes(spec) == {**check.parts, "total": 85, "unreadable": check.unreadable}
    note = check.note()
    assert note is not None and note.startswith("3 of 74 images could not be read and were left out (calibration ")
    assert all(name in note for name in ("cat/cut.jpg", "dog/notes.jpg", "dog/empty.jpg"))


def test_greyscale_and_colour_images_reach_the_model_in_its_mode() -> None:
    seen: list[str] = []

    def preprocess(images: list[Image.Image]) -> torch.Tensor:
        seen.extend(image.mode for image in images)
        return torch.zeros(len(images), 1)

    images = [_rgb(), _rgb().convert("L")]
    _in_mode(preprocess, 3)(images)
    _in_mode(preprocess, 1)(images)
    assert seen == ["RGB", "RGB", "L", "L"]
