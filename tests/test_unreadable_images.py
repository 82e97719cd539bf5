"""A run on an image folder holding broken files and images of every mode: the unreadable ones are left out
and named in the report, the others are converted to what the model takes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from graph.cli import main
from tests.helpers import save_tiny, tiny_vit

FAST = ["--iterations", "0", "--no-prune", "--no-quantize", "--no-sensitivity", "--no-progress"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _folder(root: Path, per_class: int) -> Path:
    """Classes the tiny ViT knows (zero, one, two), a truncated JPEG, a text file named .jpg, an empty .jpg,
    and greyscale, greyscale+alpha, RGBA, CMYK, palette and 16-bit images."""
    rng = np.random.default_rng(0)

    def rgb() -> Image.Image:
        return Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))

    for name in ("zero", "one", "two"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            rgb().save(root / name / f"{i:02d}.jpg")
    buffer = io.BytesIO()
    rgb().resize((64, 64)).save(buffer, "JPEG")
    (root / "one" / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (root / "two" / "notes.jpg").write_text("not a JPEG\n")
    (root / "two" / "empty.jpg").write_bytes(b"")
    rgb().convert("L").save(root / "zero" / "grey.png")
    rgb().convert("LA").save(root / "zero" / "grey-alpha.png")
    rgb().convert("RGBA").save(root / "one" / "rgba.png")
    rgb().convert("CMYK").save(root / "one" / "cmyk.jpg")
    rgb().convert("P").save(root / "two" / "palette.png")
    Image.fromarray(np.asarray(rgb().convert("L")).astype(np.uint16) * 257).save(root / "two" / "grey16.png")
    return root


def test_run_leaves_out_and_names_unreadable_images(model_dir: Path, tmp_path: Path) -> None:
    data = _folder(tmp_path / "data", per_class=25)  # 75 + 6 readable images of other modes + 3 unreadable
    run_dir = tmp_path / "run"
    argv = ["run", "--model", str(model_dir), "--dataset", str(data), "--run-dir", str(run_dir)]
    assert main([*argv, "--eval-samples", "200", "--calibration-samples", "16", *FAST]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["dataset"]["unreadable_images"] == 3
    assert report["dataset"]["calibration_samples"] + report["dataset"]["evaluation_samples"] == 81
    assert report["baseline"]["accuracy"] is not None
    markdown = (run_dir / "report.md").read_text()
    note = next(line for line in markdown.splitlines() if "could not be read" in line)
    assert "3 of 84 images" in note
    for name in ("one/truncated.jpg", "two/notes.jpg", "two/empty.jpg"):
        assert name in note


def test_too_many_unreadable_images_stop_the_run(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _folder(tmp_path / "data", per_class=4)  # 3 of 21 unreadable
    argv = ["run", "--model", str(model_dir), "--dataset", str(data), "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "--eval-samples", "200", "--calibration-samples", "4", *FAST]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert "3 of 21 images" in error[0] and "cannot be read" in error[0] and "truncated.jpg" in error[0]
    assert "repair or remove" in error[0]
