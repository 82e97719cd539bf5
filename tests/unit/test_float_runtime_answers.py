"""A float runtime whose logits match its PyTorch model's on the first evaluation images takes the model's answers;
one that differs, or a model whose own evaluation stopped early, is evaluated on every image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tools.evaluation.paired import ImagePredictions
from tools.stages import deployment

LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 3.0, 0.2], [1.0, 1.1, 0.9]])


class _Spec:
    def part_label(self, part: str) -> str:
        return part

    def part(self, part: str) -> str:
        return part

    def model_dump(self) -> dict[str, Any]:
        return {}


def _twin(monkeypatch: pytest.MonkeyPatch, runtime_logits: torch.Tensor, stopped: bool = False) -> tuple[Any, list]:
    source = ImagePredictions(key={}, predictions=[0, 1, 1], correct=[1, 1, 0], stopped_early=stopped)
    adopted: list[Any] = []
    monkeypatch.setattr("tools.stages.run_data.first_evaluated_images", lambda *a: torch.zeros(3, 3, 4, 4))
    monkeypatch.setattr(deployment.ops, "predictions_on", lambda *a, **k: source)
    models = {"model": lambda x: LOGITS, "runtime": lambda x: runtime_logits}
    monkeypatch.setattr(deployment, "load_compressed", lambda path: models[Path(path).name])
    monkeypatch.setattr("tools.evaluation.paired.adopt_predictions", lambda *a: adopted.append(a))
    how = deployment._float_twin(Path("runtime"), Path("model"), Path("model"), None, _Spec())  # type: ignore[arg-type]
    return how, adopted


def test_matching_logits_take_the_models_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    how, adopted = _twin(monkeypatch, LOGITS + 1e-6)
    assert how and "first 3 evaluation images" in how and len(adopted) == 1
    assert adopted[0][4].predictions == [0, 1, 1]


def test_a_runtime_that_differs_or_a_stopped_model_is_evaluated_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    shifted = LOGITS.clone()
    shifted[2, 0] += 0.2  # the third image's answer changes: 1 -> 0
    assert _twin(monkeypatch, shifted) == (None, [])
    assert _twin(monkeypatch, LOGITS + 0.05) == (None, []), "within rounding of every answer, but 2.5 % off"
    assert _twin(monkeypatch, LOGITS, stopped=True) == (None, [])


def test_a_build_copied_from_one_of_the_same_recipe_takes_its_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's builds made by the int8 profile are copied into the deployment: their answers come with them
    (a stopped evaluation does not)."""
    for stopped, wanted in ((False, 1), (True, 0)):
        source = ImagePredictions(key={}, predictions=[0, 1, 1], correct=[1, 1, 0], stopped_early=stopped)
        adopted: list[Any] = []
        monkeypatch.setattr(deployment.ops, "predictions_on", lambda *a, **k: source)  # noqa: B023
        monkeypatch.setattr("tools.evaluation.paired.adopt_predictions", lambda *a: adopted.append(a))  # noqa: B023
        deployment.answers_of_copy(Path("copy"), Path("built"), Path("original"), None, _Spec())  # type: ignore[arg-type]
        assert len(adopted) == wanted
        assert not adopted or (adopted[0][0] == Path("copy") and adopted[0][4] is source and "built" in adopted[0][5])


def test_quantize_says_which_build_it_copied(tmp_path: Path) -> None:
    from tests.helpers import save_tiny, tiny_resnet
    from tools.deploy.config import QuantizationConfig
    from tools.stages import ops

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_resnet(), tmp_path / "src", 16)), original)
    shape, config = ops.resolve_input_shape(original), QuantizationConfig(backend="onnxruntime-fp32")
    first = ops.quantize(original, original, [], tmp_path / "a", config, shape=shape)
    again = ops.quantize(original, original, [], tmp_path / "b", config, shape=shape, reuse=[tmp_path / "a"])
    assert first["copied_from"] is None and again["copied_from"] == str(tmp_path / "a")
    assert ops.quantize(original, original, [], tmp_path / "b", config, shape=shape)["copied_from"] is None
