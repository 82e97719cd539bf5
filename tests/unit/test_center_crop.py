"""Center crops for plain PyTorch models: ``--crop``, a timm model's ``crop_pct``, torchvision's 224 of 256, and the
transform itself (aspect kept, size / crop covered, the center cut), which the run and a deployed artifact share."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from tools.models.base import ModelLoadError
from tools.models.input_shape import TORCHVISION_CROP, resolve_factory_spec
from tools.models.specs import FactorySpec, Preprocessing, preprocess_for


class _Net(nn.Module):
    def __init__(self, cfg: dict[str, object] | None = None) -> None:
        super().__init__()
        if cfg is not None:
            self.pretrained_cfg = cfg
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def _image() -> Image.Image:
    """40 wide, 20 high, every pixel different."""
    pixels = np.arange(20 * 40 * 3, dtype=np.int64).reshape(20, 40, 3) % 251
    return Image.fromarray(pixels.astype(np.uint8))


def _resolved(factory: str, cfg: dict[str, object] | None = None, **flags: str) -> FactorySpec:
    return resolve_factory_spec(_Net(cfg).eval(), FactorySpec.from_options(factory, image_size=8, **flags))


def test_a_crop_covers_size_over_crop_with_the_aspect_kept_and_cuts_the_center() -> None:
    pre = Preprocessing(image_size=(8, 8), channels=3, mean=[0.0], std=[1.0], crop=0.5)
    got = preprocess_for(pre)([_image()])
    # 8 / 0.5 = 16 covered: the 40x20 image becomes 32x16, and 8x8 is cut from its center
    expected = _image().resize((32, 16), Image.Resampling.BILINEAR).crop((12, 4, 20, 12))
    want = torch.from_numpy(np.asarray(expected, dtype=np.float32) / 255.0).permute(2, 0, 1)
    assert got.shape == (1, 3, 8, 8) and torch.allclose(got[0], want)
    squashed = preprocess_for(pre.model_copy(update={"crop": None}))([_image()])
    assert not torch.allclose(squashed, got)  # without a crop the whole image is resized


def test_crop_of_one_keeps_the_aspect_and_cuts_the_longer_side() -> None:
    pre = Preprocessing(image_size=(8, 8), channels=3, mean=[0.0], std=[1.0], crop=1.0)
    expected = _image().resize((16, 8), Image.Resampling.BILINEAR).crop((4, 0, 12, 8))
    want = torch.from_numpy(np.asarray(expected, dtype=np.float32) / 255.0).permute(2, 0, 1)
    assert torch.allclose(preprocess_for(pre)([_image()])[0], want)


def test_a_timm_crop_pct_is_taken_unless_the_flag_says_otherwise() -> None:
    spec = _resolved("m:net", {"crop_pct": 0.95, "crop_mode": "center"})
    assert spec.crop == 0.95 and spec.sources["crop"] == "pretrained_cfg.crop_pct"
    assert spec.preprocessing().crop == 0.95
    assert _resolved("m:net", {"crop_pct": 0.95}, crop="0.8").crop == 0.8
    assert _resolved("m:net", {"crop_pct": 0.95, "crop_mode": "squash"}).crop is None  # not a center crop
    assert _resolved("m:net").crop is None  # plain models: the whole image, as before


def test_torchvision_factories_take_its_imagenet_crop() -> None:
    spec = _resolved("torchvision.models:mobilenet_v2")
    assert spec.crop == TORCHVISION_CROP == 0.875 and "torchvision" in spec.sources["crop"]
    assert _resolved("torchvision.models:mobilenet_v2", crop="1").crop == 1.0


@pytest.mark.parametrize("value", ["0", "1.5", "0.8,0.9", "wide"])
def test_a_bad_crop_says_what_to_give(value: str) -> None:
    with pytest.raises(ModelLoadError, match="crop"):
        FactorySpec.from_options("m:net", crop=value)


def test_the_report_line_says_each_setting_and_where_it_came_from() -> None:
    line = _resolved("torchvision.models:mobilenet_v2").describe_preprocessing()
    assert line.startswith("preprocessing: 8 × 8 px, the center cut from the image resized to cover 9 px")
    assert "crop 0.875: torchvision's ImageNet evaluation (224 of 256)" in line and "(default)" in line
    assert "the whole image resized (no crop)" in _resolved("m:net", crop=None).describe_preprocessing()
