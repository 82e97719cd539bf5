"""Bad input: a one-line error saying what was wrong and what to do, a non-zero exit, nothing lost."""

from __future__ import annotations

import json
import shlex
import shutil
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
    # the one line names the dataset's classes, says none matches the model's, and what to do
    assert "no dataset class ('apple', 'pear') matches a model class" in message
    assert message.rstrip().endswith("use a dataset of the model's classes")
    split_folders = tmp_path / "splits"
    _folder(split_folders / "train", ["one", "two"])
    _folder(split_folders / "test", ["one", "two"])
    argv = ["run", "--model", str(model_dir), "--dataset", str(split_folders), "--split", "nope"]
    message = _error(capsys, *argv, "--run-dir", str(tmp_path / "r3"))
    assert f"dataset {split_folders}: split 'nope' not found" in message, "the error names the dataset"


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


def test_damaged_model_weights_name_the_file(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "vit"
    shutil.copytree(model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # an interrupted copy
    message = _error(capsys, "run", "--model", str(damaged), "--dataset", "digits", "--run-dir", str(tmp_path / "run"))
    assert f"cannot read weights file {weights}" in message and "copy it again" in message
    assert not (tmp_path / "run").exists()


def test_an_image_processor_that_cannot_be_read_is_an_error_not_a_guessed_normalisation(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged = tmp_path / "vit"
    shutil.copytree(model_dir, damaged)
    processor = damaged / "preprocessor_config.json"
    processor.write_text("{not json")
    message = _error(capsys, "run", "--model", str(damaged), "--dataset", "digits", "--run-dir", str(tmp_path / "r1"))
    assert f"cannot read {processor}" in message and "fix or remove it" in message
    assert not (tmp_path / "r1").exists()

    # transformers 5.17 reads no image processor without torchvision: say so, do not fall back to mean 0.5
    import transformers

    def needs_torchvision(*args: object, **kwargs: object) -> None:
        raise ImportError("\nAutoImageProcessor requires the Torchvision library but it was not found")

    monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", needs_torchvision)
    message = _error(capsys, "run", "--model", str(model_dir), "--dataset", "digits", "--run-dir", str(tmp_path / "r2"))
    assert "requires the Torchvision library" in message and "install transformers>=" in message
    from tools.models.pretrained import MIN_TRANSFORMERS

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"transformers>={MIN_TRANSFORMERS},' in pyproject  # the error names what the install asks for


def test_factory_weights_missing_or_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = "tests.helpers_torch:tiny_grey_cnn"
    run = ["run", "--model", model, "--dataset", "digits", "--run-dir", str(tmp_path / "r")]
    missing = tmp_path / "absent.pt"
    message = _error(capsys, *run, "--weights", str(missing))
    assert str(missing) in message and "no such file" in message and "leave --weights out" in message
    for name, data in (("cut.pt", b"PK\x03\x04 not a whole zip"), ("cut.safetensors", b"\x10\x00\x00\x00\x00\x00")):
        (tmp_path / name).write_bytes(data)
        message = _error(capsys, *run, "--weights", str(tmp_path / name))
        assert f"file {tmp_path / name}" in message and "damaged" in message, message
    assert not (tmp_path / "r").exists()


def _run_dir_with_settings(run_dir: Path) -> Path:
    from graph import Context

    run_dir.mkdir()
    settings = {"thread_id": "t", "input": {"model": "m"}, "context": Context(run_dir=str(run_dir)).to_dict()}
    (run_dir / "settings.json").write_text(json.dumps(settings))
    return run_dir


def test_damaged_checkpoints_and_settings_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _run_dir_with_settings(tmp_path / "run")
    checkpoints = run_dir / "checkpoints.sqlite"
    checkpoints.write_bytes(b"not a database " * 100)
    for command in ("resume", "status"):
        message = _error(capsys, command, "--run-dir", str(run_dir))
        assert f"checkpoint database {checkpoints} is damaged" in message and "new --run-dir" in message, message
    assert checkpoints.read_bytes() == b"not a database " * 100
    (run_dir / "settings.json").write_text('{"thread_id": ')
    message = _error(capsys, "status", "--run-dir", str(run_dir))
    assert f"{run_dir / 'settings.json'} is not valid JSON" in message


def test_interrupt_prints_the_real_resume_command(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import graph.cli
    import graph.runner

    run_dir = tmp_path / "my run"  # a space: the command must quote it
    argv = ["run", "--model", str(model_dir), "--dataset", "digits", "--run-dir", str(run_dir), "--iterations", "0"]
    argv += ["--eval-samples", "20", "--no-sensitivity", "--no-quantize"]

    def ctrl_c(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(graph.runner, "check_planner", ctrl_c)
        assert main(argv) == 130
    assert "stopped before anything was saved" in capsys.readouterr().err
    assert not run_dir.exists()

    def ctrl_c_after(self: object, node: str, update: dict[str, object]) -> None:
        if node == "profile_model":
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(graph.cli._Progress, "__call__", ctrl_c_after)
        assert main(argv) == 130
    err = capsys.readouterr().err
    command = f"profiling-agent resume --run-dir {shlex.quote(str(run_dir.resolve()))}"
    assert f"interrupted: continue with `{command}`" in err, err
    assert not (run_dir / ".lock").exists()
    assert main(shlex.split(command)[1:]) == 0, "the printed command continues the run"
    assert (run_dir / "report.json").exists()
