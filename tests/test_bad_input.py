"""Bad input: a one-line error saying what was wrong and what to do, a non-zero exit, nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from graph.cli import main
from tests.helpers import save_tiny, tiny_vit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error:")]
    assert len(err) == 1
    return err[0]


def _folder(root: Path, classes: list[str]) -> Path:
    for name in classes:
        (root / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (10, 200, 30)).save(root / name / "a.png")
    return root


def test_not_an_image_classifier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path / "bert"
    )
    message = _error(
        capsys, "run", "--model", str(tmp_path / "bert"), "--dataset", "digits", "--run-dir", str(tmp_path / "run")
    )
    assert "not an image classifier" in message
    assert not (tmp_path / "run").exists(), "a failed start leaves no half-made run behind"


def test_dataset_problems(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    assert "no images" in _error(
        capsys,
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        str(tmp_path / "empty"),
        "--run-dir",
        str(tmp_path / "r1"),
    )
    fruit = _folder(tmp_path / "fruit", ["apple", "pear"])
    message = _error(
        capsys, "run", "--model", str(model_dir), "--dataset", str(fruit), "--run-dir", str(tmp_path / "r2")
    )
    assert "matches a model class" in message or "match" in message


def test_run_dir_that_cannot_be_written(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    message = _error(capsys, "run", "--model", str(model_dir), "--dataset", "digits", "--run-dir", str(blocker / "run"))
    assert "cannot write to run dir" in message


def test_invalid_edited_plan_keeps_the_run_paused(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--model",
                str(model_dir),
                "--dataset",
                "digits",
                "--run-dir",
                str(run_dir),
                "--approve-plan",
                "--iterations",
                "0",
                "--eval-samples",
                "20",
                "--no-progress",
            ]
        )
        == 0
    )
    plans = {
        "ratio": {"pruning_recommendations": [{"layer": "fc1", "pruning_type": "structured", "pruning_ratio": 1.5}]},
        "regex": {"pruning_recommendations": [{"layer": "(", "pruning_type": "structured", "pruning_ratio": 0.2}]},
        "nothing": {"pruning_recommendations": [{"layer": "nope", "pruning_type": "structured", "pruning_ratio": 0.2}]},
        "classifier": {
            "pruning_recommendations": [{"layer": "^classifier$", "pruning_type": "structured", "pruning_ratio": 0.2}]
        },
    }
    for name, plan in plans.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(plan))
        message = _error(capsys, "resume", "--run-dir", str(run_dir), "--plan", str(path))
        assert "not accepted" in message, name
    assert main(["resume", "--run-dir", str(run_dir), "--approve"]) == 0
    assert (run_dir / "report.json").exists()
