"""Importance criteria for pruning, by name: how channels (Torch-Pruning groups) and attention heads are ranked.

``IMPORTANCE`` maps a name to a factory of a Torch-Pruning group importance (structured pruning), given the
calibration statistics (input-channel RMS per layer, :func:`tools.compression.calibration.input_channel_rms`)
or None. ``HEAD_NORM_P`` gives the norm degree that ranks attention heads for the magnitude criteria.

* ``act`` (activation-aware, data-aware: :data:`DATA_AWARE`): a channel scores what it feeds forward,
  ``sum over the layers consuming it of ||W[:, j]||_2 * rms(x_j)`` -- the column of the consumer's weight
  times the channel's RMS on the calibration images (Wanda's weight-times-activation score at the level of
  whole channels). A head scores ``sqrt(sum over its channels of (||W_o[:, j]|| * rms(x_j))^2)`` at the
  output projection. Without calibration statistics it falls back to ``l2``.
* ``l1`` / ``l2``: group weight magnitude (data-free; kept for the uniform baselines).
* ``random``: seeded random ranking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch_pruning as tp
from torch import nn
from torch_pruning.pruner import function

#: Per layer, the RMS of each of its input channels on the calibration images.
ChannelRMS = dict[nn.Module, torch.Tensor]


class ActivationImportance:
    """Activation-aware channel importance (``act``); see the module doc."""

    def __init__(self, rms: ChannelRMS | None) -> None:
        self.rms = rms or {}
        self.fallback = tp.importance.GroupMagnitudeImportance(p=2)

    def __call__(self, group: Any) -> torch.Tensor | None:
        total: torch.Tensor | None = None
        size = len(group[0].idxs)
        for i, (dep, idxs) in enumerate(group):
            layer, fn = dep.layer, dep.pruning_fn
            if fn not in (function.prune_conv_in_channels, function.prune_linear_in_channels):
                continue
            per_input = input_column_norms(layer)
            rms = self.rms.get(layer)
            if per_input is None or rms is None or rms.numel() != per_input.numel():
                continue
            score = (per_input * rms)[torch.as_tensor(idxs, dtype=torch.long)]
            root = torch.as_tensor(group[i].root_idxs, dtype=torch.long)
            total = torch.zeros(size) if total is None else total
            total.index_add_(0, root, score)
        return total if total is not None else self.fallback(group)


def input_column_norms(layer: nn.Module) -> torch.Tensor | None:
    """L2 norm of the weights reading each input channel of a Conv2d (groups=1) / Linear, on the CPU."""
    if isinstance(layer, nn.Linear):
        return layer.weight.detach().float().norm(dim=0).cpu()
    if isinstance(layer, nn.Conv2d) and layer.groups == 1:
        return layer.weight.detach().float().transpose(0, 1).flatten(1).norm(dim=1).cpu()
    return None


#: Group importance criteria for structured pruning, by name: factories given the calibration RMS (or None).
IMPORTANCE: dict[str, Callable[[ChannelRMS | None], Any]] = {
    "act": ActivationImportance,
    "l1": lambda _rms: tp.importance.GroupMagnitudeImportance(p=1),
    "l2": lambda _rms: tp.importance.GroupMagnitudeImportance(p=2),
    "random": lambda _rms: tp.importance.RandomImportance(),
}

#: Criteria that need calibration images.
DATA_AWARE: frozenset[str] = frozenset({"act"})

#: Norm degree used to rank attention heads for each magnitude criterion; other criteria rank randomly.
HEAD_NORM_P: dict[str, int] = {"l1": 1, "l2": 2}


def unknown_importance(name: str) -> str:
    """The message for an importance name that is not in ``IMPORTANCE``; it lists the valid names."""
    return f"unknown importance {name!r}; valid names: {', '.join(sorted(IMPORTANCE))}"


def get_importance(name: str, rms: ChannelRMS | None = None) -> Any:
    """Instantiate the importance criterion ``name``; ``ValueError`` lists the valid names."""
    try:
        factory = IMPORTANCE[name]
    except KeyError:
        raise ValueError(unknown_importance(name)) from None
    return factory(rms)


__all__ = [
    "DATA_AWARE",
    "HEAD_NORM_P",
    "IMPORTANCE",
    "ActivationImportance",
    "ChannelRMS",
    "get_importance",
    "input_column_norms",
    "unknown_importance",
]
