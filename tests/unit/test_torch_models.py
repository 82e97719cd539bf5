"""tools.models: ``--model module:factory`` specs, safe state-dict loading, factory artifacts."""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from tests.helpers_torch import GREY_LABELS, NotAllowed, TiedNet, TinyGreyCNN
from tools.models.base import IMAGENET_MEAN, IMAGENET_STD, LoadedModel, ModelLoadError
from tools.models.checkpoints import load_state_dict_file
from tools.models.factory import (
    FactoryModel,
    build_factory_model,
    import_factory,
    is_factory_artifact,
    load_factory_original,
    save_factory_original,
)
from tools.models.specs import (
    FactorySpec,
    is_factory_spec,
    parse_floats,
    parse_image_size,
    parse_labels,
    preprocess_for,
)

GREY = "tests.helpers_torch:tiny_grey_cnn"
TIED = "tests.helpers_torch:tied_net"


def grey_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {k: v.clone() for k, v in TinyGreyCNN().state_dict().items()}


def grey_spec(weights: Path | None = None, **options: object) -> FactorySpec:
    opts: dict[str, object] = {"labels": ",".join(GREY_LABELS), "image_size": "12x16", "channels": 1}
    opts.update(options)
    return FactorySpec.from_options(GREY, weights=weights, **opts)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- parsing


def test_parse_labels_comma_file_and_errors(tmp_path: Path) -> None:
    assert parse_labels("cat, dog ,bird") == ["cat", "dog", "bird"]
    assert parse_labels(None) == []
    assert parse_labels(["a", "b"]) == ["a", "b"]
    file = tmp_path / "labels.txt"
    file.write_text("tench, Tinca tinca\n\ngoldfish\n")
    assert parse_labels(str(file)) == ["tench, Tinca tinca", "goldfish"]  # a file: one name per line
    with pytest.raises(ModelLoadError, match=r"neither a file nor a comma-separated list"):
        parse_labels("missing-labels.txt")
    with pytest.raises(ModelLoadError, match=r"empty class name"):
        parse_labels("a,,b")
    assert parse_labels("crane,b,crane") == ["crane", "b", "crane"]  # ImageNet-1k repeats names
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ModelLoadError, match=r"no class names"):
        parse_labels(str(tmp_path / "empty.txt"))


def test_parse_image_size_and_floats() -> None:
    assert parse_image_size("32") == (32, 32)
    assert parse_image_size("32x48") == (32, 48)
    assert parse_image_size(" 28 X 28 ") == (28, 28)
    assert parse_image_size(64) == (64, 64)
    assert parse_image_size((10, 20)) == (10, 20)
    for bad in ("", "32x", "axb", "0", "-3x4", "1x2x3"):
        with pytest.raises(ModelLoadError, match=r"image-size"):
            parse_image_size(bad)
    assert parse_floats("0.5") == [0.5]
    assert parse_floats("0.485,0.456,0.406") == [0.485, 0.456, 0.406]
    assert parse_floats("(0.1, 0.2)") == [0.1, 0.2]
    assert parse_floats(1) == [1.0]
    for bad_value in ("", "a,b", "nan", "0.5,,0.5"):
        with pytest.raises(ModelLoadError, match=r"--mean"):
            parse_floats(bad_value, "mean")


def test_spec_defaults_and_broadcasting(tmp_path: Path) -> None:
    spec = FactorySpec.from_options(GREY)
    assert (spec.channels, spec.image_size, spec.mean, spec.std) == (3, (224, 224), IMAGENET_MEAN, IMAGENET_STD)
    assert spec.weights is None and spec.labels == []
    # channels follow the number of mean values when there are several
    assert FactorySpec.from_options(GREY, mean="0.1,0.2,0.3", std="0.5").std == [0.5, 0.5, 0.5]
    grey = FactorySpec.from_options(GREY, channels=1)
    assert (grey.mean, grey.std) == ([0.5], [0.5])
    assert FactorySpec.from_options(GREY, channels="1", mean="0.1307", std="0.3081").mean == [0.1307]
    assert FactorySpec.from_options(GREY, mean="0.5").mean == [0.5, 0.5, 0.5]
    with pytest.raises(ModelLoadError, match=r"3 mean values for 1 channels"):
        FactorySpec.from_options(GREY, channels=1, mean="0.1,0.2,0.3")
    with pytest.raises(ModelLoadError, match=r"2 std values for 3 channels"):
        FactorySpec.from_options(GREY, mean="0.1,0.2,0.3", std="0.2,0.3")
    with pytest.raises(ModelLoadError, match=r"channels must be 1 .greyscale. or 3 .RGB., not 2"):
        FactorySpec.from_options(GREY, std="0.2,0.3")  # two values mean two channels
    with pytest.raises(ModelLoadError, match=r"1 .greyscale. or 3 .RGB."):
        FactorySpec.from_options(GREY, channels=4)
    with pytest.raises(ModelLoadError, match=r"std values must be positive"):
        FactorySpec.from_options(GREY, std="0")
    with pytest.raises(ModelLoadError, match=r"no such file"):
        FactorySpec.from_options(GREY, weights=tmp_path / "nope.pt")
    with pytest.raises(ModelLoadError, match=r"not a factory"):
        FactorySpec.from_options("google/vit-base-patch16-224")
    weights = tmp_path / "w.safetensors"
    save_file(grey_state(), str(weights))
    assert FactorySpec.from_options(GREY, weights=str(weights)).weights == str(weights.resolve())


def test_is_factory_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_factory_spec("tools.zoo.cifar_resnet:resnet20")
    assert is_factory_spec("torchvision.models:resnet18")
    assert is_factory_spec("my_models:Net")
    for spec in ("google/vit-base-patch16-224", "digits-vit", "./models:net", "mod:1net", "mod:", ":f", "a.b:c.d"):
        assert not is_factory_spec(spec), spec
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg:fn").mkdir()
    assert not is_factory_spec("pkg:fn")  # an existing directory is a model directory


# --------------------------------------------------------------------------------------------- weights


@pytest.mark.parametrize(
    ("wrap", "suffix"),
    [
        (lambda s: s, ".pt"),
        (lambda s: {"state_dict": s, "best_prec1": 91.2, "epoch": 3}, ".th"),
        (lambda s: {"model": s, "optimizer": {"lr": 0.1}}, ".pth"),
        (lambda s: {"model_state_dict": OrderedDict(s)}, ".ckpt"),
        (lambda s: OrderedDict((f"module.{k}", v) for k, v in s.items()), ".bin"),
        (lambda s: {"state_dict": {f"module._orig_mod.{k}": v for k, v in s.items()}}, ".pt"),
    ],
)
def test_load_state_dict_file_torch_variants(tmp_path: Path, wrap: object, suffix: str) -> None:
    state = grey_state()
    path = tmp_path / f"weights{suffix}"
    torch.save(wrap(state), path)  # type: ignore[operator]
    loaded = load_state_dict_file(path)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) and loaded[k].device.type == "cpu" for k in state)


def test_load_state_dict_file_safetensors(tmp_path: Path) -> None:
    state = grey_state()
    plain = tmp_path / "w.safetensors"
    save_file({f"module.{k}": v for k, v in state.items()}, str(plain))
    assert load_state_dict_file(plain).keys() == state.keys()
    odd_name = tmp_path / "weights.bin"  # detected by its header, not its name
    odd_name.write_bytes(plain.read_bytes())
    assert load_state_dict_file(odd_name).keys() == state.keys()


def test_load_state_dict_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"not found"):
        load_state_dict_file(tmp_path / "missing.pt")
    torch.save({"epoch": 3, "best": 0.9}, tmp_path / "meta.pt")
    with pytest.raises(ModelLoadError, match=r"is not a state dict: it holds a dict of epoch \(int\)"):
        load_state_dict_file(tmp_path / "meta.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ModelLoadError, match=r"is not a state dict: it holds a list"):
        load_state_dict_file(tmp_path / "list.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ModelLoadError, match=r"cannot read weights file"):
        load_state_dict_file(tmp_path / "garbage.pt")


def test_pickle_with_custom_class_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": grey_state(), "extra": NotAllowed()}, path)
    with pytest.raises(ModelLoadError, match=r"refusing to unpickle .*tests\.helpers_torch\.NotAllowed") as info:
        load_state_dict_file(path)
    assert "\n" not in str(info.value)
    torch.save(TinyGreyCNN(), tmp_path / "whole-model.pt")  # a whole pickled module: refused as well
    with pytest.raises(ModelLoadError, match=r"save model.state_dict"):
        load_state_dict_file(tmp_path / "whole-model.pt")


# --------------------------------------------------------------------------------------------- building


def test_build_greyscale_factory_model(tmp_path: Path) -> None:
    weights = tmp_path / "grey.th"
    torch.save({"state_dict": {f"module.{k}": v for k, v in grey_state().items()}}, weights)
    loaded = build_factory_model(grey_spec(weights))
    assert isinstance(loaded, LoadedModel) and isinstance(loaded, FactoryModel)
    assert (loaded.source, loaded.family, loaded.spec, loaded.processor) == ("factory", "cnn", GREY, None)
    assert not loaded.untrained
    assert loaded.id2label == dict(enumerate(GREY_LABELS))
    assert loaded.preprocessing == {"image_size": [12, 16], "channels": 1, "mean": [0.5], "std": [0.5], "crop": None}
    assert torch.equal(loaded.model.state_dict()["conv.weight"], grey_state()["conv.weight"])

    preprocess = preprocess_for(grey_spec(weights))
    images = [Image.new("RGB", (40, 30), (255, 0, 0)), Image.new("L", (8, 8), 255)]
    batch = preprocess(images)
    assert batch.shape == (2, 1, 12, 16)
    # 'L' conversion: pure red is luma 76; white is 1.0 -> (1 - 0.5) / 0.5
    assert torch.allclose(batch[0], torch.full((1, 12, 16), (76 / 255 - 0.5) / 0.5), atol=1e-6)
    assert torch.allclose(batch[1], torch.ones(1, 12, 16))
    model = loaded.model
    assert isinstance(model, TinyGreyCNN)
    model.seen_shapes.clear()
    assert model(batch).shape == (2, 3)
    assert model.seen_shapes == [(2, 1, 12, 16)]


def test_preprocess_for_rgb_matches_to_tensor_normalize() -> None:
    spec = FactorySpec.from_options(GREY, image_size=4, mean="0.485,0.456,0.406", std="0.229,0.224,0.225")
    image = Image.new("RGB", (4, 4), (10, 200, 30))
    got = preprocess_for(spec)([image])
    pixels = torch.tensor([10, 200, 30], dtype=torch.float32) / 255
    expected = (pixels - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert got.shape == (1, 3, 4, 4)
    assert torch.allclose(got[0, :, 0, 0], expected, atol=1e-6)
    assert torch.equal(preprocess_for(spec.preprocessing())([image]), got)
    assert torch.equal(preprocess_for(spec.preprocessing().model_dump())([image]), got)


def test_build_without_weights_is_untrained_with_generic_labels() -> None:
    loaded = build_factory_model(FactorySpec.from_options(GREY, image_size=8, channels=1))
    assert loaded.untrained
    assert loaded.id2label == {0: "class_0", 1: "class_1", 2: "class_2"}  # from a dry run
    again = build_factory_model(FactorySpec.from_options(GREY, image_size=8, channels=1))
    assert torch.equal(loaded.model.state_dict()["conv.weight"], again.model.state_dict()["conv.weight"])  # seeded


def test_build_reports_key_and_shape_mismatches(tmp_path: Path) -> None:
    state = grey_state()
    missing = {k: v for k, v in state.items() if not k.startswith("head.")}
    torch.save(missing, tmp_path / "missing.pt")
    with pytest.raises(ModelLoadError, match=r"2 missing keys \(head.weight, head.bias\)") as info:
        build_factory_model(grey_spec(tmp_path / "missing.pt"))
    assert "unexpected" not in str(info.value)
    extra = dict(state) | {"aux.weight": torch.zeros(2), "aux.bias": torch.zeros(2)}
    torch.save(extra, tmp_path / "extra.pt")
    with pytest.raises(ModelLoadError, match=r"2 unexpected keys \(aux.weight, aux.bias\)"):
        build_factory_model(grey_spec(tmp_path / "extra.pt"))
    prefixed = {f"backbone.{k}": v for k, v in state.items()}
    torch.save(prefixed, tmp_path / "prefixed.pt")
    with pytest.raises(ModelLoadError, match=r"extra 'backbone.' prefix"):
        build_factory_model(grey_spec(tmp_path / "prefixed.pt"))
    wrong = dict(state) | {"head.weight": torch.zeros(5, 4), "head.bias": torch.zeros(5)}
    torch.save(wrong, tmp_path / "wrong.pt")
    with pytest.raises(ModelLoadError, match=r"shape mismatches \(head.weight \(5, 4\) vs model \(3, 4\)"):
        build_factory_model(grey_spec(tmp_path / "wrong.pt"))
    no_counter = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    torch.save(no_counter, tmp_path / "no-counter.pt")
    assert not build_factory_model(grey_spec(tmp_path / "no-counter.pt")).untrained  # tolerated


def test_build_checks_labels_and_input_shape() -> None:
    with pytest.raises(ModelLoadError, match=r"2 labels given but .* has 3 outputs"):
        build_factory_model(grey_spec(labels="a,b"))
    with pytest.raises(ModelLoadError, match=r"does not run on a \(1, 3, 12, 16\) input.*--channels"):
        build_factory_model(grey_spec(channels=3))


def test_factory_import_errors() -> None:
    with pytest.raises(ModelLoadError, match=r"cannot import module 'no_such_module_xyz'"):
        import_factory("no_such_module_xyz:build")
    with pytest.raises(ModelLoadError, match=r"has no 'missing'.*callables there: .*tiny_grey_cnn"):
        import_factory("tests.helpers_torch:missing")
    with pytest.raises(ModelLoadError, match=r"is a int, not a callable"):
        import_factory("tests.helpers_torch:NOT_CALLABLE")
    with pytest.raises(ModelLoadError, match=r"calling tests.helpers_torch:needs_arguments\(\) failed: TypeError"):
        build_factory_model(FactorySpec.from_options("tests.helpers_torch:needs_arguments"))
    with pytest.raises(ModelLoadError, match=r"returned a str, not a torch.nn.Module"):
        build_factory_model(FactorySpec.from_options("tests.helpers_torch:not_a_module"))


def test_factory_module_found_in_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_local_models_xyz.py").write_text(
        "from torch import nn\n\ndef net():\n    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2))\n"
    )
    (tmp_path / "broken_models_xyz.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    try:
        loaded = build_factory_model(FactorySpec.from_options("my_local_models_xyz:net", image_size=4, labels="no,yes"))
        assert loaded.id2label == {0: "no", 1: "yes"}
        assert sys.path == path_before  # the current directory was on sys.path only for the import
        with pytest.raises(ModelLoadError, match=r"importing module 'broken_models_xyz' .* failed: RuntimeError: boom"):
            import_factory("broken_models_xyz:net")
    finally:
        sys.modules.pop("my_local_models_xyz", None)
        sys.modules.pop("broken_models_xyz", None)


# --------------------------------------------------------------------------------------------- artifacts


def test_save_and_load_factory_original_round_trip(tmp_path: Path) -> None:
    weights = tmp_path / "grey.safetensors"
    save_file(grey_state(), str(weights))
    spec = grey_spec(weights)
    loaded = build_factory_model(spec)
    out = save_factory_original(loaded, spec, tmp_path / "original")
    assert sorted(p.name for p in out.iterdir()) == ["artifact.json", "factory.json", "model.safetensors"]
    assert is_factory_artifact(out)
    assert "grey.safetensors" not in (out / "factory.json").read_text()  # the weights path is not kept
    weights.unlink()
    again = load_factory_original(out)
    assert (again.source, again.spec, again.untrained, again.id2label) == ("factory", GREY, False, loaded.id2label)
    assert again.preprocessing == loaded.preprocessing
    assert again.factory_spec is not None and again.factory_spec.weights is None
    x = preprocess_for(spec)([Image.new("L", (16, 12), 90), Image.new("RGB", (7, 9), (1, 2, 3))])
    with torch.inference_mode():
        assert torch.equal(loaded.model(x), again.model(x))


def test_round_trip_with_shared_tensors_and_generic_labels(tmp_path: Path) -> None:
    spec = FactorySpec.from_options(TIED, image_size=6)
    loaded = build_factory_model(spec)
    assert loaded.untrained and loaded.num_labels == 5
    out = save_factory_original(loaded, spec, tmp_path / "original")
    again = load_factory_original(out)
    assert again.untrained and again.id2label == loaded.id2label
    model = again.model
    assert isinstance(model, TiedNet)
    assert model.head.weight is model.proj.weight  # still tied after loading
    x = torch.randn(2, 3, 6, 6)
    with torch.inference_mode():
        assert torch.equal(loaded.model(x), again.model(x))


def test_load_factory_original_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"not a factory model artifact"):
        load_factory_original(tmp_path)
    assert not is_factory_artifact(tmp_path)
    spec = grey_spec()
    out = save_factory_original(build_factory_model(spec), spec, tmp_path / "original")
    save_file({"conv.weight": torch.zeros(4, 1, 3, 3)}, str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"does not fit .* any more"):
        load_factory_original(out)
