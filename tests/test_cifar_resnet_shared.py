"""Real checkpoints through ``--model module:factory``: the CIFAR ResNets in ../shared (skipped when absent).

``cifar10-resnet{20,56}.th`` are torch pickles of CUDA tensors, nested under ``state_dict`` with a
``module.`` prefix and no ``num_batches_tracked``; ``tools.zoo.cifar_resnet`` rebuilds their
architecture. Accuracies on the JPEG CIFAR-10 test set (../shared/README.md): 81.0 % and 83.2 %.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tools.compression.pruning import apply_pruning, count_params
from tools.compression.recovery import RecoveryConfig, recover_
from tools.compression.shortcuts import ChannelSelect
from tools.evaluation.accuracy import evaluate_accuracy
from tools.evaluation.datasets import EvalDataset, load_eval_dataset
from tools.evaluation.labels import match_labels
from tools.models.factory import FactoryModel, build_factory_model
from tools.models.specs import FactorySpec, preprocess_for
from tools.schemas import PruningRecommendation
from tools.zoo.cifar_resnet import CIFAR10_CLASSES, PadShortcut

pytestmark = pytest.mark.shared

SAMPLES = 500
README_ACCURACY = {20: 0.810, 56: 0.832}
TOLERANCE = 0.04


def cifar_spec(shared: Path, depth: int) -> FactorySpec:
    return FactorySpec.from_options(
        f"tools.zoo.cifar_resnet:resnet{depth}",
        weights=shared / "models" / f"cifar10-resnet{depth}.th",
        labels=",".join(CIFAR10_CLASSES),  # the folder order of data/cifar10-test
        image_size="32",
        mean="0.485,0.456,0.406",
        std="0.229,0.224,0.225",
    )


@pytest.fixture(scope="module")
def cifar_test(shared_dir: Path) -> EvalDataset:
    return load_eval_dataset(str(shared_dir / "data" / "cifar10-test"), samples=SAMPLES, seed=0)


@pytest.fixture(scope="module")
def resnet20(shared_dir: Path) -> FactoryModel:
    return build_factory_model(cifar_spec(shared_dir, 20))


def accuracy(model: torch.nn.Module, spec: FactorySpec, data: EvalDataset) -> float:
    match = match_labels(dict(enumerate(spec.labels)), data.label_names)
    assert match.is_complete() and match.mapping == {i: i for i in range(10)}
    value, counted = evaluate_accuracy(model, preprocess_for(spec), data, match, batch_size=100, progress=False)
    assert counted == len(data) and value is not None
    return value


def test_resnet20_checkpoint_loads(resnet20: FactoryModel) -> None:
    assert (resnet20.source, resnet20.family, resnet20.untrained) == ("factory", "cnn", False)
    assert resnet20.id2label == dict(enumerate(CIFAR10_CLASSES))
    assert resnet20.preprocessing == {
        "image_size": [32, 32],
        "channels": 3,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "crop": None,
    }
    assert count_params(resnet20.model) == 269_722  # the published ResNet-20 size (0.27 M)
    assert sum(isinstance(m, PadShortcut) for m in resnet20.model.modules()) == 2


@pytest.mark.parametrize("depth", [20, 56])
def test_cifar_resnet_accuracy_matches_readme(
    shared_dir: Path, cifar_test: EvalDataset, resnet20: FactoryModel, depth: int
) -> None:
    spec = cifar_spec(shared_dir, depth)
    loaded = resnet20 if depth == 20 else build_factory_model(spec)
    measured = accuracy(loaded.model, spec, cifar_test)
    assert measured == pytest.approx(README_ACCURACY[depth], abs=TOLERANCE), f"resnet{depth}: {measured:.3f}"


def test_structured_pruning_of_resnet20_prunes_every_stage_and_recovers(
    shared_dir: Path, cifar_test: EvalDataset, resnet20: FactoryModel
) -> None:
    """All convs at 0.2: the zero-padding shortcuts are exact channel selections (tools.compression.shortcuts), so
    every stage's stream is pruned with its blocks, and the shortcuts stay parameter-free; reconstruction on 128
    other images repairs what pruning without fine-tuning costs."""
    model = copy.deepcopy(resnet20.model)
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    example = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    rec = PruningRecommendation(layer=r"conv", pruning_type="structured", pruning_ratio=0.2)
    report = apply_pruning(model, [rec], example)

    pruned = {name for applied in report.applied for name in applied.modules}
    skipped = {s.target: s.reason for s in report.skipped}
    assert pruned and pruned.isdisjoint(skipped)
    assert pruned | skipped.keys() == set(convs)  # every conv is accounted for
    assert {"conv1", "layer2.0.conv2", "layer3.0.conv2"} | {n for n in convs if n.endswith(".conv1")} <= pruned
    assert all("already pruned with" in reason for reason in skipped.values())  # the other members of a stage
    assert sum(isinstance(m, ChannelSelect) for m in model.modules()) == 2
    assert report.params_after < 0.7 * report.params_before and report.params_before == 269_722
    with torch.inference_mode():
        assert model(example).shape == (1, 10)
    spec = cifar_spec(shared_dir, 20)
    before = accuracy(model, spec, cifar_test)
    data = str(shared_dir / "data" / "cifar10-test")  # the permutation's first 500 rows are cifar_test's
    calibration_data = load_eval_dataset(data, samples=SAMPLES, seed=0, part="confirm", sizes={"confirm": 128})
    calibration = preprocess_for(spec)(calibration_data.images)
    recover_(model, resnet20.model, calibration, report.consumers(), RecoveryConfig())
    after = accuracy(model, spec, cifar_test)
    assert after > max(0.4, before + 0.1), f"pruned resnet20 accuracy {before:.3f} -> {after:.3f} after recovery"
