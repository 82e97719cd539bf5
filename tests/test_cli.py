"""The command line: a run end to end, and one-line errors with a non-zero exit for bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from graph.cli import main
from tests.helpers import save_tiny, tiny_vit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tiny_vit(), tmp_path_factory.mktemp("tiny") / "vit", 16)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ")
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_run_writes_report_and_prints_summary(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--model",
        str(model_dir),
        "--dataset",
        "digits",
        "--run-dir",
        str(run_dir),
        "--iterations",
        "1",
        "--eval-samples",
        "30",
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr()
    out = printed.out
    assert "baseline" in out and "quantized" in out
    # every evaluation stage says how many images it judged and at what rate
    assert re.search(r"done evaluate_baseline .* original, 30 images, \d+ img/s", printed.err)
    assert re.search(r"done evaluate_model .* round 0: accuracy .*, 30 images, \d+ img/s", printed.err)
    report = json.loads((run_dir / "report.json").read_text())
    assert len(report["rounds"]) == 2
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["context"]["iterations"] == 1 and settings["thread_id"]
    assert "already holds a finished run" in _error(capsys, *argv)
    assert main(["status", "--run-dir", str(run_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is True


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--model", "no/such-model-here", "--dataset", "digits"], "no/such-model-here"),
        (["run", "--model", "./missing-dir", "--dataset", "digits"], "not found"),
        (["run", "--model", "vit-b16", "--iterations", "-1"], "--iterations must be 0 or more"),
        (["run", "--model", "vit-b16", "--eval-samples", "-1"], "--eval-samples must be 0 (automatic) or more"),
        (["run", "--model", "vit-b16", "--finetune-steps", "-2"], "--finetune-steps must be auto or 0 or more"),
    ],
)
def test_bad_input_gives_one_line(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in _error(capsys, *argv, "--run-dir", str(tmp_path / "run"))


def test_dataset_required_for_trained_models(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--dataset" in _error(capsys, "run", "--model", str(model_dir), "--run-dir", str(tmp_path / "r"))


def test_resume_without_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "holds no run" in _error(capsys, "resume", "--run-dir", str(tmp_path))
