"""The input shape resolver: channels and image size from the model's layers, config, processor and data,
each candidate proven by a dry forward pass; the user's flags win; the shape says where each number came from."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from torch import nn

from tools.models.base import IMAGENET_MEAN, LoadedModel, ModelLoadError
from tools.models.factory import build_factory_model
from tools.models.input_shape import (
    ImageHints,
    channel_candidates,
    image_hints,
    resolve_factory_spec,
    resolve_loaded_shape,
    resolve_shape,
    size_candidates,
)
from tools.models.specs import FactorySpec
from tools.reporting.html_parts import shape_text
from tools.schemas import InputShape

#: The PyTorch MNIST example's LeNet: one input channel, and ``view(-1, 320)`` fixes the size at 28.
LENET_CODE = """
import torch.nn.functional as F
from torch import nn


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        return F.log_softmax(self.fc2(x), dim=1)


def lenet():
    return LeNet()
"""
_namespace: dict[str, object] = {}
exec(compile(LENET_CODE, "lenet", "exec"), _namespace)
LeNet: type[nn.Module] = _namespace["LeNet"]  # type: ignore[assignment]


def _loaded(model: nn.Module, processor: object = None, labels: int = 4) -> LoadedModel:
    return LoadedModel(
        model=model.eval(),
        processor=processor,
        family="t",
        source="t",
        spec="t",
        id2label=dict.fromkeys(range(labels), "x"),
    )


class PixelMean(nn.Module):
    """Runs on any number of channels and any size: nothing in it says what it takes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(1, 2, 3))[:, None] @ self.weight


class ConfiguredCNN(nn.Module):
    """A fully convolutional model (any size runs) whose config says its size."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(image_size=40, num_channels=3)
        self.stem = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean(dim=(2, 3)))


def tiny_vit(image_size: int, patch: int = 8, distilled: bool = False) -> Any:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher, ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    small: dict[str, Any] = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"intermediate_size": 32, "num_labels": 4}
    if distilled:
        return DeiTForImageClassificationWithTeacher(
            DeiTConfig(image_size=image_size, patch_size=patch, **small)
        ).eval()
    return ViTForImageClassification(ViTConfig(image_size=image_size, patch_size=patch, **small)).eval()


# --------------------------------------------------------------------------------------------- the model


def test_lenet_channels_from_first_convolution_and_size_from_first_linear() -> None:
    model = LeNet().eval()
    assert channel_candidates(model)[0] == (1, "first convolution conv1")
    shape = resolve_shape(model, channel_candidates(model))
    assert shape.as_tuple() == (1, 28, 28)
    assert shape.channels_source == "first convolution conv1"
    assert shape.size_source == "first Linear fc1 (320 inputs)"  # 224 and 32 failed, 28 gives fc1 its features
    with_size = resolve_shape(model, channel_candidates(model), [((28, 28), "--image-size")])
    assert (with_size.channels, with_size.size_source) == (1, "--image-size")
    with pytest.raises(ModelLoadError, match=r"no input shape runs the model \(1 tried; the first: \(1, 1, 32, 32\)"):
        resolve_shape(model, channel_candidates(model)[:1], [((32, 32), "--image-size")])


def test_flattened_image_mlp_says_both_numbers() -> None:
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    shape = resolve_loaded_shape(_loaded(mlp, labels=10))
    assert shape.as_tuple() == (1, 28, 28)
    assert shape.channels_source == shape.size_source == "first Linear 1 (784 = 1×28×28 inputs)"
    rgb = resolve_loaded_shape(_loaded(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)), labels=10))
    assert rgb.as_tuple() == (3, 32, 32)


def test_vit_size_from_position_embeddings_when_the_config_is_wrong() -> None:
    vit = tiny_vit(32)
    vit.config.image_size = 224  # a config that does not match the weights: the dry run rejects it
    shape = resolve_loaded_shape(_loaded(vit))
    assert shape.as_tuple() == (3, 32, 32)
    assert shape.channels_source == "patch embedding vit.embeddings.patch_embeddings.projection"
    assert shape.size_source == (
        "position embeddings vit.embeddings.position_embeddings (17 = 4×4 patches of 8 + 1 class token)"
    )
    deit = tiny_vit(48, distilled=True)
    deit.config.image_size = 224
    position = next(c for c in size_candidates(deit) if c[1].startswith("position embeddings"))
    assert position == (
        (48, 48),
        "position embeddings deit.embeddings.position_embeddings (38 = 6×6 patches of 8 + 2 class tokens)",
    )


def test_config_image_size_and_processor_come_before_the_default() -> None:
    model = ConfiguredCNN()
    shape = resolve_loaded_shape(_loaded(model))
    assert (shape.as_tuple(), shape.channels_source, shape.size_source) == (
        (3, 40, 40),
        "first convolution stem",
        "config.image_size",
    )
    processor = SimpleNamespace(crop_size={"height": 36, "width": 44}, size={"shortest_edge": 50})
    by_processor = resolve_loaded_shape(_loaded(model, processor))
    assert (by_processor.height, by_processor.width, by_processor.size_source) == (36, 44, "processor.crop_size")
    assert [s for _, s in size_candidates(model, processor)[:3]] == [
        "processor.crop_size",
        "processor.size",
        "config.image_size",
    ]


def test_dataset_images_decide_what_the_model_does_not_say() -> None:
    grey = image_hints([Image.new("L", (20, 24)), Image.new("L", (20, 24))])
    assert (grey.channels, grey.size, grey.images) == (1, (24, 20), 2)
    mixed = image_hints([Image.new("L", (20, 24)), Image.new("RGB", (30, 30))])
    assert (mixed.channels, mixed.size) == (3, None)
    assert image_hints([]) == ImageHints()

    model = PixelMean()
    without = resolve_loaded_shape(_loaded(model))
    assert (without.as_tuple(), without.channels_source) == ((3, 224, 224), "default 3 (RGB)")
    shape = resolve_loaded_shape(_loaded(model), grey)
    assert shape.as_tuple() == (1, 24, 20)
    assert (shape.channels_source, shape.size_source) == (
        "dataset images are greyscale",
        "dataset images are all this size",
    )
    # what the model says comes before the data
    lenet = resolve_loaded_shape(_loaded(LeNet(), labels=10), ImageHints(channels=3, size=(64, 64)))
    assert lenet.as_tuple() == (1, 28, 28)


def test_shape_says_where_each_number_came_from() -> None:
    shape = InputShape(
        channels=1, height=28, width=28, channels_source="first convolution conv1", size_source="--image-size"
    )
    assert shape.describe() == "channels: 1 (first convolution conv1); image size: 28 × 28 (--image-size)"
    assert (
        shape_text(shape.model_dump()) == "1 × 28 × 28 (channels from first convolution conv1; size from --image-size)"
    )
    assert shape_text({"channels": 3, "height": 16, "width": 16, "source": "llm"}) == "3 × 16 × 16 (from llm)"


# --------------------------------------------------------------------------------------------- factories

LENET = "lenet_mnist_xyz:lenet"


@pytest.fixture
def lenet_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``lenet_mnist_xyz.py`` in a directory of its own, the current directory (as a user's file would be)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "lenet_mnist_xyz.py").write_text(LENET_CODE)
    monkeypatch.chdir(folder)
    yield folder
    sys.modules.pop("lenet_mnist_xyz", None)


def test_factory_spec_records_flags_and_defaults() -> None:
    spec = FactorySpec.from_options(LENET, image_size=28, mean="0", std="1")
    assert spec.sources == {
        "image_size": "--image-size",
        "mean": "--mean",
        "std": "--std",
        "channels": "default",
        "crop": "default",
    }
    assert spec.channels == 3 and not spec.given("channels") and spec.given("image_size")
    assert FactorySpec.from_options(LENET, mean="0.1,0.2,0.3").sources["channels"] == "--mean (3 values)"
    one = spec.with_shape(1, (28, 28), channels_source="first convolution conv1", size_source="--image-size")
    assert (one.channels, one.mean, one.std) == (1, [0.0], [1.0])  # one value given: kept for one channel
    defaults = FactorySpec.from_options(LENET).with_shape(1, (28, 28), channels_source="x", size_source="y")
    assert (defaults.mean, defaults.std) == ([0.5], [0.5])
    back = defaults.with_shape(3, (32, 32), channels_source="x", size_source="y")
    assert back.mean == IMAGENET_MEAN
    old = FactorySpec.model_validate({**spec.model_dump(), "sources": {}})  # saved before sources existed
    assert old.given("channels") and old.given("image_size")


class _TimmStyle(nn.Module):
    """A model as timm builds it: its ``pretrained_cfg`` says its input size and normalisation."""

    def __init__(self) -> None:
        super().__init__()
        self.pretrained_cfg = {"input_size": (3, 16, 16), "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def test_a_timm_models_pretrained_cfg_gives_its_normalisation_and_flags_win() -> None:
    spec = resolve_factory_spec(_TimmStyle().eval(), FactorySpec.from_options("m:timm_style"))
    assert (spec.image_size, spec.mean, spec.std) == ((16, 16), [0.5] * 3, [0.5] * 3)
    assert spec.sources["mean"] == "pretrained_cfg.mean" and spec.sources["image_size"] == "pretrained_cfg.input_size"
    flagged = resolve_factory_spec(_TimmStyle().eval(), FactorySpec.from_options("m:timm_style", mean="0.4"))
    assert (flagged.mean, flagged.std, flagged.sources["mean"]) == ([0.4] * 3, [0.5] * 3, "--mean")
    plain = resolve_factory_spec(LeNet().eval(), FactorySpec.from_options(LENET, image_size=28))
    assert plain.sources["mean"] == "default"


def test_lenet_factory_without_channels(lenet_module: Path) -> None:
    loaded = build_factory_model(FactorySpec.from_options(LENET, image_size=28, mean="0", std="1"))
    assert loaded.preprocessing == {"image_size": [28, 28], "channels": 1, "mean": [0.0], "std": [1.0], "crop": None}
    assert loaded.factory_spec is not None
    assert loaded.factory_spec.sources["channels"] == "first convolution conv1"
    assert loaded.id2label[9] == "class_9"
    shape = resolve_loaded_shape(loaded)
    assert shape.describe() == "channels: 1 (first convolution conv1); image size: 28 × 28 (--image-size)"

    no_size = build_factory_model(FactorySpec.from_options(LENET, mean="0", std="1"))
    assert no_size.preprocessing is not None and no_size.preprocessing["image_size"] == [28, 28]
    assert no_size.factory_spec is not None
    assert no_size.factory_spec.sources["image_size"] == "first Linear fc1 (320 inputs)"


def test_factory_flags_win_and_a_wrong_flag_says_what_the_model_takes(lenet_module: Path) -> None:
    with pytest.raises(
        ModelLoadError, match=r"\(1, 3, 28, 28\) input: .*suggests 1 channel \(first convolution conv1\)"
    ):
        build_factory_model(FactorySpec.from_options(LENET, image_size=28, channels=3))
    with pytest.raises(ModelLoadError, match=r"suggests 1 channel .*give --image-size and --channels"):
        build_factory_model(FactorySpec.from_options(LENET, channels=3))
    with pytest.raises(ModelLoadError, match=r"no input shape runs the model"):
        build_factory_model(FactorySpec.from_options(LENET, image_size=32))
    spec = FactorySpec.from_options(LENET, image_size=28, channels=1)
    assert resolve_factory_spec(LeNet().eval(), spec) == spec  # both flags given and they run: unchanged


def test_cli_runs_lenet_on_greyscale_folder_without_channels(
    lenet_module: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from graph.cli import main

    torch.manual_seed(0)
    weights = tmp_path / "lenet.safetensors"
    save_file(LeNet().state_dict(), str(weights))
    data = tmp_path / "digits28"
    for digit in range(10):
        (data / str(digit)).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (28, 28), 20 * digit + i).save(data / str(digit) / f"{i}.png")
    run_dir = tmp_path / "run"
    argv = ["run", "--model", LENET, "--weights", str(weights), "--labels", ",".join(map(str, range(10)))]
    argv += ["--image-size", "28", "--mean", "0", "--std", "1", "--dataset", str(data), "--run-dir", str(run_dir)]
    argv += ["--no-prune", "--no-quantize", "--eval-samples", "10", "--calibration-samples", "4", "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    shape = report["model"]["input_shape"]
    assert (shape["channels"], shape["height"], shape["width"]) == (1, 28, 28)
    assert (shape["channels_source"], shape["size_source"]) == ("first convolution conv1", "--image-size")
    assert "channels from first convolution conv1; size from --image-size" in (run_dir / "report.md").read_text()
    assert (
        "preprocessing: 28 × 28 px, the whole image resized (no crop); mean [0.0] (--mean), std [1.0] (--std)"
        in (report["notes"])
    )
