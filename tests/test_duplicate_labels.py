"""An ImageNet-style class list naming ``crane`` and ``maillot`` twice: accepted by ``--labels``, matched, and
the report says how the duplicates were matched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from graph.cli import main

# ImageNet-1k repeats 'crane' (134 the bird, 517 the machine) and 'maillot' (638, 639 'maillot, tank suit')
IMAGENET_STYLE = [
    "tench, Tinca tinca",
    "goldfish, Carassius auratus",
    "crane",
    "great white shark",
    "crane",
    "maillot",
    "tiger shark",
    "maillot, tank suit",
    "hammerhead",
    "stingray",
]


def ten_class_cnn() -> nn.Module:
    """A plain 3-channel CNN with one output per class of :data:`IMAGENET_STYLE` (seeded weights)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
    )


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    for name in ("crane", "goldfish", "maillot", "tench"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                tmp_path / "data" / name / f"{i}.png"
            )
    return tmp_path / "data"


def test_labels_with_duplicates_run_and_the_report_says_how_they_were_matched(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    labels = tmp_path / "imagenet-style.txt"
    labels.write_text("\n".join(IMAGENET_STYLE) + "\n")
    weights = tmp_path / "weights.safetensors"
    save_file(ten_class_cnn().state_dict(), str(weights))
    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--model",
        "tests.test_duplicate_labels:ten_class_cnn",
        "--weights",
        str(weights),
        "--labels",
        str(labels),
        "--image-size",
        "16",
        "--mean",
        "0.5",
        "--std",
        "0.5",
        "--dataset",
        str(folder),
        "--run-dir",
        str(run_dir),
        "--eval-samples",
        "30",
        "--calibration-samples",
        "8",
        *("--iterations", "0", "--no-prune", "--no-quantize", "--no-sensitivity", "--no-progress"),
    ]
    assert main(argv) == 0
    report = json.loads((run_dir / "report.json").read_text())
    match = report["dataset"]["label_match"]
    assert match["unmatched"] == []
    assert match["mapping"] == {"0": 2, "1": 1, "2": 5, "3": 0}  # crane, goldfish, maillot, tench
    assert match["same_class"] == {"4": 2, "7": 5} and match["duplicates_matched"] == "merged"
    note = next(n for n in report["notes"] if "more than once" in n)
    assert "'crane' (2, 4)" in note and "'maillot' (5, 7)" in note and "treated as one class" in note
    assert note in (run_dir / "report.md").read_text()
