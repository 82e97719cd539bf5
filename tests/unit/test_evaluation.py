"""Accuracy with a model whose predictions are known, logits plumbing, timing and file sizes."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from tools.evaluation.accuracy import (
    accuracy_from_predictions,
    evaluate_accuracy,
    predict_logits,
    prediction_agreement,
)
from tools.evaluation.common import EvaluationError
from tools.evaluation.cost import compare_latencies, file_size_mb, measure_latency, measure_throughput
from tools.evaluation.datasets import EvalDataset, load_eval_dataset
from tools.evaluation.labels import LabelMatch, match_labels

MODEL_LABELS = {0: "red", 1: "green", 2: "blue"}  # the logit of class c is the mean of channel c
RGB = {"red": (200, 10, 10), "green": (10, 200, 10), "blue": (10, 10, 200), "purple": (150, 0, 160)}


class MeanColour(nn.Module):
    """Predicts the dominant channel: logits = per-channel mean."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) * self.scale


def preprocess(images: list[Image.Image]) -> torch.Tensor:
    arrays = [np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0 for image in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def make_dataset(colours: list[str], labels: list[str], names: list[str]) -> EvalDataset:
    """Images coloured ``colours[i]`` labelled ``labels[i]`` (so a label may disagree with the colour)."""
    return EvalDataset(
        images=[Image.new("RGB", (4, 4), RGB[c]) for c in colours],
        labels=[names.index(label) for label in labels],
        label_names=names,
        source="test",
        size_total=len(colours),
    )


NAMES = ["blue", "green", "purple", "red"]  # sorted, like an image folder; order differs from the model


@pytest.fixture()
def known() -> tuple[EvalDataset, LabelMatch]:
    # 8 matched samples, 6 labelled with their colour -> accuracy 0.75; 2 "purple" samples are unmatched
    colours = ["red", "green", "blue", "red", "green", "blue", "red", "blue", "purple", "purple"]
    labels = ["red", "green", "blue", "red", "green", "blue", "green", "red", "purple", "purple"]
    data = make_dataset(colours, labels, NAMES)
    match = match_labels(MODEL_LABELS, NAMES)
    assert match.unmatched == ["purple"]
    return data, match


@pytest.mark.parametrize("batch_size", [1, 3, 8, 100])
def test_accuracy_known_and_batch_independent(known: tuple[EvalDataset, LabelMatch], batch_size: int) -> None:
    data, match = known
    accuracy, counted = evaluate_accuracy(MeanColour(), preprocess, data, match, batch_size=batch_size, progress=False)
    assert counted == 8
    assert accuracy == pytest.approx(0.75)


def test_progress_bar_and_model_mode_restored(known: tuple[EvalDataset, LabelMatch]) -> None:
    data, match = known
    model = MeanColour().train()
    accuracy, _ = evaluate_accuracy(model, preprocess, data, match, batch_size=4, progress=True, desc="t")
    assert accuracy == pytest.approx(0.75)
    assert model.training


def test_only_unmatched_or_empty_gives_none(known: tuple[EvalDataset, LabelMatch]) -> None:
    _, match = known
    purple = make_dataset(["purple", "purple"], ["purple", "purple"], NAMES)
    assert evaluate_accuracy(MeanColour(), preprocess, purple, match, progress=False) == (None, 0)
    empty = make_dataset([], [], NAMES)
    assert evaluate_accuracy(MeanColour(), preprocess, empty, match, progress=False) == (None, 0)


def test_model_output_kinds(known: tuple[EvalDataset, LabelMatch]) -> None:
    data, match = known
    inner = MeanColour()

    def hf_like(x: torch.Tensor) -> Any:
        return SimpleNamespace(logits=inner(x))

    def tuple_like(x: torch.Tensor) -> Any:
        return (inner(x),)

    for model in (hf_like, tuple_like):
        assert evaluate_accuracy(model, preprocess, data, match, progress=False) == (pytest.approx(0.75), 8)

    def broken(x: torch.Tensor) -> Any:
        return "no logits"

    with pytest.raises(EvaluationError, match="cannot find logits"):
        evaluate_accuracy(broken, preprocess, data, match, progress=False)


def test_argmax_is_over_all_model_classes() -> None:
    # the model's top class is "blue" (index 2), which no dataset class maps to: counted as wrong
    data = make_dataset(["blue", "red"], ["red", "red"], ["red"])
    match = match_labels(MODEL_LABELS, ["red"])
    assert evaluate_accuracy(MeanColour(), preprocess, data, match, progress=False) == (0.5, 2)


def test_bad_batch_size(known: tuple[EvalDataset, LabelMatch]) -> None:
    data, match = known
    with pytest.raises(EvaluationError, match="batch_size must be >= 1"):
        evaluate_accuracy(MeanColour(), preprocess, data, match, batch_size=0, progress=False)


def test_predict_logits_and_agreement(known: tuple[EvalDataset, LabelMatch]) -> None:
    data, _ = known
    logits = predict_logits(MeanColour(), preprocess, data, batch_size=3)
    assert logits.shape == (10, 3) and logits.dtype == torch.float32
    assert predict_logits(MeanColour(), preprocess, []).shape == (0, 0)
    assert prediction_agreement(logits, logits.clone()) == 1.0
    flipped = logits.clone()
    flipped[0] = -flipped[0]
    assert prediction_agreement(logits, flipped) == pytest.approx(0.9)


def test_accuracy_from_predictions() -> None:
    match = LabelMatch(mapping={0: 2, 1: 0})
    assert accuracy_from_predictions([2, 0, 1, 5], [0, 1, 1, 7], match) == (pytest.approx(2 / 3), 3)
    with pytest.raises(EvaluationError):
        accuracy_from_predictions([1], [0, 1], match)


def test_compare_latencies_interleaves_in_varying_orders() -> None:
    calls: list[str] = []

    def recorder(name: str) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            calls.append(name)
            return x

        return run

    models = {"a": recorder("a"), "b": recorder("b"), "c": recorder("c")}
    result = compare_latencies(models, torch.zeros(1, 3, 4, 4), warmup=1, repeats=12)
    assert set(result) == {"a", "b", "c"} and all(v > 0 for v in result.values())
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    rounds = [tuple(calls[i : i + 3]) for i in range(3, len(calls), 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds), "every repetition runs every model once"
    predecessors = {(r[i - 1], r[i]) for r in rounds for i in range(1, 3)}
    assert len(predecessors) > 3, "models do not always follow the same neighbour"
    calls.clear()
    compare_latencies(models, torch.zeros(1, 3, 4, 4), warmup=1, repeats=12)
    assert [tuple(calls[i : i + 3]) for i in range(3, len(calls), 3)] == rounds, "the order is seeded"
    calls.clear()
    compare_latencies(models, torch.zeros(1, 3, 4, 4), warmup=1, repeats=12, block=4)  # warm: runs of 4 calls
    blocks = [tuple(calls[i : i + 4]) for i in range(3, len(calls), 4)]
    assert len(blocks) == 36 and all(len(set(b)) == 1 for b in blocks)
    assert [b[0] for b in blocks] == [name for r in rounds for name in r], "the blocks keep the seeded order"
    with pytest.raises(EvaluationError, match="block"):
        compare_latencies(models, torch.zeros(1, 3, 4, 4), block=0)


def test_compare_latencies_times_fast_models_for_at_least_min_seconds() -> None:
    """Twenty repetitions of a sub-millisecond model leave its ratio to another 2 % uncertain: ``min_seconds`` grows
    the repetitions until the fastest model's calls add up to about that much."""
    calls: list[str] = []

    def sleeper(name: str, seconds: float) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            calls.append(name)
            time.sleep(seconds)
            return x

        return run

    models = {"fast": sleeper("fast", 0.001), "slow": sleeper("slow", 0.002)}
    compare_latencies(models, torch.zeros(1), warmup=1, repeats=3, min_seconds=0.05)
    repetitions = calls.count("fast") - 1  # less the warm-up call
    assert 10 <= repetitions <= 50 and calls.count("slow") == repetitions + 1, "every model takes part in all"
    calls.clear()
    compare_latencies(models, torch.zeros(1), warmup=1, repeats=3)
    assert calls.count("fast") == 4, "without it: the repetitions asked for"


def test_compare_latencies_modules_and_callables() -> None:
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x

    result = compare_latencies({"module": module, "slow": slow}, torch.rand(1, 3, 16, 16), repeats=5)
    assert set(result) == {"module", "slow"}
    assert all(value > 0 for value in result.values())
    assert result["slow"] >= 0.002


def test_measure_latency_and_throughput() -> None:
    model = MeanColour()
    assert measure_latency(model, torch.rand(1, 3, 8, 8), warmup=1, repeats=3) > 0
    assert measure_throughput(model, torch.rand(16, 3, 8, 8)) > 0
    with pytest.raises(EvaluationError, match="repeats must be >= 1"):
        measure_latency(model, torch.rand(1, 3, 8, 8), repeats=0)
    with pytest.raises(EvaluationError, match="no models"):
        compare_latencies({}, torch.rand(1, 3, 8, 8))


def test_file_size_mb(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 1_000_000)
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.bin").write_bytes(b"x" * 250_000)
    (folder / "sub" / "c.bin").write_bytes(b"x" * 250_000)
    assert file_size_mb(tmp_path / "a.bin") == pytest.approx(1.0)
    assert file_size_mb(folder) == pytest.approx(0.5)
    assert file_size_mb(tmp_path / "a.bin", str(folder)) == pytest.approx(1.5)
    assert file_size_mb() == 0.0
    with pytest.raises(FileNotFoundError, match="does not exist"):
        file_size_mb(tmp_path / "missing.onnx")


@pytest.mark.shared
def test_cifar10_resnet_tiny_accuracy(shared_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model_dir = shared_dir / "models" / "cifar10-resnet-tiny"
    data_dir = shared_dir / "data" / "cifar10-test"
    if not model_dir.is_dir() or not data_dir.is_dir():
        pytest.skip("cifar10-resnet-tiny or cifar10-test is absent from ../shared")
    model = transformers.AutoModelForImageClassification.from_pretrained(model_dir)
    processor = transformers.AutoImageProcessor.from_pretrained(model_dir)

    def hf_preprocess(images: list[Image.Image]) -> torch.Tensor:
        return processor(images=images, return_tensors="pt")["pixel_values"]

    data = load_eval_dataset(str(data_dir), samples=500, seed=0)
    match = match_labels(model.config.id2label, data.label_names)
    assert match.unmatched == [] and match.mapping == {i: i for i in range(10)}
    accuracy, counted = evaluate_accuracy(model, hf_preprocess, data, match, batch_size=250, progress=False)
    assert counted == 500
    assert accuracy is not None and abs(accuracy - 0.81) < 0.04  # 0.81 is its full test-set top-1
