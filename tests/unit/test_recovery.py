"""Training-free recovery: least-squares reconstruction, BatchNorm re-calibration, activation-aware importance."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.unit.test_pruning import ResidualCNN, rec, vit
from tools.compression.calibration import input_channel_rms, input_rows, output_rows
from tools.compression.pruning import apply_pruning
from tools.compression.recipes import PruningConfig
from tools.compression.recovery import RecoveryConfig, recalibrate_batchnorm_, reconstruct_, recover_


class DuplicatedMLP(nn.Module):
    """fc1 -> ReLU -> fc2 whose hidden units come in identical pairs: half of them carry no information."""

    def __init__(self, width: int = 8, pairs: int = 6) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * pairs)
        self.fc2 = nn.Linear(2 * pairs, 4)
        with torch.no_grad():
            self.fc1.weight[pairs:] = self.fc1.weight[:pairs]
            self.fc1.bias[pairs:] = self.fc1.bias[:pairs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _error(a: nn.Module, b: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((a(x) - b(x)).abs().max())


def test_reconstruction_recovers_redundant_channels_exactly() -> None:
    """Dropping one copy of each duplicated hidden unit loses nothing: the refit of fc2 finds that."""
    torch.manual_seed(0)
    original = DuplicatedMLP().eval()
    pruned = copy.deepcopy(original)
    with torch.no_grad():  # keep the first copies only, as structured pruning would slice them
        pruned.fc1 = nn.Linear(8, 6)
        pruned.fc1.weight.copy_(original.fc1.weight[:6])
        pruned.fc1.bias.copy_(original.fc1.bias[:6])
        pruned.fc2 = nn.Linear(6, 4)
        pruned.fc2.weight.copy_(original.fc2.weight[:, :6])
        pruned.fc2.bias.copy_(original.fc2.bias)
    calib, held_out = torch.randn(512, 8), torch.randn(256, 8)
    assert _error(original, pruned, held_out) > 0.05
    done, skipped = reconstruct_(pruned, original, calib, ["fc2"], ridge=1e-9)
    assert done == ["fc2"] and not skipped
    assert _error(original, pruned, held_out) < 1e-3
    # the consumers a structured prune of fc1 reports are what recovery refits
    report = apply_pruning(copy.deepcopy(original), [rec(r"^fc1$", 0.5)], calib[:1], PruningConfig(importance="l2"))
    assert report.consumers() == ["fc2"]


def test_reconstruction_reduces_error_of_a_pruned_conv_block() -> None:
    torch.manual_seed(0)
    original = ResidualCNN().eval()
    calib, held_out = torch.randn(64, 3, 16, 16), torch.randn(32, 3, 16, 16)
    plain = copy.deepcopy(original)
    apply_pruning(plain, [rec(r"^conv1$", 0.5)], calib[:1])
    repaired = copy.deepcopy(original)
    report = apply_pruning(repaired, [rec(r"^conv1$", 0.5)], calib[:1])
    assert report.consumers() == ["conv2"]
    result = recover_(repaired, original, calib, report.consumers(), RecoveryConfig())
    assert result.reconstructed == ["conv2"] and result.batchnorm_layers >= 1
    assert _error(original, repaired, held_out) < 0.7 * _error(original, plain, held_out)


class Chain(nn.Module):
    """fc1 -> ReLU -> fc2 -> ReLU -> fc3: fc2 consumes fc1's channels and has channels of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_a_consumer_whose_own_outputs_were_pruned_too_is_fit_to_the_outputs_it_kept() -> None:
    torch.manual_seed(0)
    original = Chain().eval()
    calib, held_out = torch.randn(256, 8), torch.randn(128, 8)
    plain = copy.deepcopy(original)
    config = PruningConfig(importance="l2")
    report = apply_pruning(plain, [rec(r"^fc1$", 0.5), rec(r"^fc2$", 0.5)], calib[:1], config)
    assert set(report.consumers()) == {"fc2", "fc3"} and sum(report.kept_outputs()["fc2"]) == 8
    unknown = copy.deepcopy(plain)  # which outputs it kept not given: it stays as pruned and says why
    result = recover_(unknown, original, calib, report.consumers(), RecoveryConfig())
    assert result.reconstructed == ["fc3"]
    assert "its own outputs were pruned too (8 of 16 kept)" in result.skipped["fc2"]
    repaired = copy.deepcopy(plain)
    result = recover_(
        repaired, original, calib, report.consumers(), RecoveryConfig(), kept_outputs=report.kept_outputs()
    )
    assert set(result.reconstructed) == {"fc2", "fc3"} and "fc2" not in result.skipped
    mask = torch.tensor(report.kept_outputs()["fc2"])
    with torch.no_grad():
        wanted = original.fc2(torch.relu(original.fc1(held_out)))[:, mask]
        before = (plain.fc2(torch.relu(plain.fc1(held_out))) - wanted).pow(2).mean()
        after = (repaired.fc2(torch.relu(repaired.fc1(held_out))) - wanted).pow(2).mean()
    assert after < 0.8 * before


def test_conv_rows_match_the_convolution() -> None:
    """Unfolded input rows times the weight give the conv's output rows: what the fit relies on."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1, stride=2, bias=False)
    x = torch.randn(20, 3, 9, 9)
    rows_in = input_rows(conv, x, max_rows=50, image_chunk=3)
    rows_out = output_rows(conv, conv(x), max_rows=50)
    assert rows_in.shape == (50, 27) and rows_out.shape == (50, 5)
    torch.testing.assert_close(rows_in @ conv.weight.reshape(5, -1).T, rows_out, atol=1e-4, rtol=1e-4)


def test_differential_batchnorm_leaves_an_unpruned_model_unchanged() -> None:
    torch.manual_seed(0)
    model = ResidualCNN().eval()
    with torch.no_grad():  # training-set statistics unlike the calibration batch's
        model.bn1.running_mean.fill_(0.3)
        model.bn1.running_var.fill_(2.0)
    reference = copy.deepcopy(model)
    batch = torch.randn(16, 3, 16, 16)
    assert recalibrate_batchnorm_(model, batch, reference=reference) == 3
    torch.testing.assert_close(model.bn1.running_mean, reference.bn1.running_mean)
    torch.testing.assert_close(model.bn1.running_var, reference.bn1.running_var)
    # outright re-estimation replaces them with the batch's statistics
    assert recalibrate_batchnorm_(model, batch) == 3
    assert not torch.allclose(model.bn1.running_mean, reference.bn1.running_mean)
    assert not model.training


def test_recovery_without_images_or_with_none_changes_nothing() -> None:
    torch.manual_seed(0)
    original = ResidualCNN().eval()
    model = copy.deepcopy(original)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert recover_(model, original, None, ["conv2"], RecoveryConfig()).method == "none"
    assert recover_(model, original, torch.randn(4, 3, 8, 8), ["conv2"], RecoveryConfig(method="none")).method == "none"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key])


def test_activation_importance_prunes_the_silent_channel_first() -> None:
    """A hidden unit that never fires on the calibration data goes first, even with the largest weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    with torch.no_grad():
        model[0].weight[2] = 5.0  # the largest weights ...
        model[0].bias[2] = -1000.0  # ... but ReLU keeps it at zero
        model[2].weight[:, 2] = 5.0
    calib = torch.randn(64, 6)
    assert float(input_channel_rms(model, calib)["2"][2]) == 0.0
    act, l2 = copy.deepcopy(model), copy.deepcopy(model)
    apply_pruning(act, [rec(r"^0$", 0.25)], calib[:1], PruningConfig(importance="act"), calibration=calib)
    apply_pruning(l2, [rec(r"^0$", 0.25)], calib[:1], PruningConfig(importance="l2"))
    assert float(act[0].bias.detach().min()) > -1000.0  # the silent unit is gone
    assert float(l2[0].bias.detach().min()) == -1000.0  # magnitude kept it


@pytest.mark.parametrize("importance", ["act", "l2"])
def test_head_pruning_with_reconstruction_runs_and_helps(importance: str) -> None:
    torch.manual_seed(0)
    original = vit()
    calib, held_out = torch.randn(48, 3, 32, 32), torch.randn(16, 3, 32, 32)
    plain = copy.deepcopy(original)
    config = PruningConfig(importance=importance)
    apply_pruning(plain, [rec("attention", 0.5, "head")], calib[:1], config, calibration=calib)
    repaired = copy.deepcopy(original)
    report = apply_pruning(repaired, [rec("attention", 0.5, "head")], calib[:1], config, calibration=calib)
    assert all(c.endswith("o_proj") for c in report.consumers()) and len(report.consumers()) == 2
    recover_(repaired, original, calib, report.consumers(), RecoveryConfig())

    def err(m: nn.Module) -> float:
        with torch.no_grad():
            return float((m(held_out).logits - original(held_out).logits).pow(2).mean())

    assert err(repaired) < err(plain)


def test_taylor_importance_prunes_the_channel_the_loss_does_not_use() -> None:
    """First-order Taylor: a hidden unit whose output weights are zero changes no loss and goes first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    with torch.no_grad():
        model[0].weight[1] = 5.0  # large weights in: magnitude keeps it ...
        model[2].weight[:, 1] = 0.0  # ... but nothing reads it
    calib, targets = torch.randn(64, 6), torch.randint(0, 3, (64,))
    taylor, l2 = copy.deepcopy(model), copy.deepcopy(model)
    config = PruningConfig(importance="taylor")
    apply_pruning(taylor, [rec(r"^0$", 0.25)], calib[:1], config, calibration=calib, calibration_targets=targets)
    apply_pruning(l2, [rec(r"^0$", 0.25)], calib[:1], PruningConfig(importance="l2"))
    assert float(taylor[0].weight.detach().max()) < 5.0  # the unused unit is gone
    assert float(l2[0].weight.detach().max()) == 5.0  # magnitude kept it
    # without labels taylor has nothing to rank by: it falls back to the weight magnitude, and still prunes
    unlabelled = copy.deepcopy(model)
    report = apply_pruning(unlabelled, [rec(r"^0$", 0.25)], calib[:1], config, calibration=calib)
    assert report.params_after < report.params_before
