"""Importance criteria for pruning, by name: how channels (Torch-Pruning groups) and attention heads are ranked.

``IMPORTANCE`` maps a name to a factory of a Torch-Pruning group importance (structured pruning), given the
data-aware per-layer input-channel scores (:data:`DATA_AWARE`: how each data-aware criterion computes
them from the calibration images) or None. ``HEAD_NORM_P`` gives the norm degree that ranks attention
heads for the magnitude criteria.

* ``act`` (activation-aware, data-aware: :data:`DATA_AWARE`): a channel scores what it feeds forward,
  ``sum over the layers consuming it of ||W[:, j]||_2 * rms(x_j)`` -- the column of the consumer's weight
  times the channel's RMS on the calibration images (Wanda's weight-times-activation score at the level of
  whole channels). A head scores ``sqrt(sum over its channels of (||W_o[:, j]|| * rms(x_j))^2)`` at the
  output projection. Without calibration images it falls back to ``l2``.
* ``taylor`` (data- and label-aware): first-order Taylor, ``|sum of w * dL/dw|`` over the weights that read
  the channel, with the cross-entropy loss on the labelled calibration images; heads likewise at the output
  projection. Without labels it falls back to ``l2``.
* ``l1`` / ``l2``: group weight magnitude (data-free; kept for the uniform baselines).
* ``random``: seeded random ranking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch_pruning as tp
from torch import nn
from torch_pruning.pruner import function

from tools.compression.calibration import input_channel_rms
from tools.compression.forward import forward_logits

#: Per layer, a data-aware score for each of its input channels (see :data:`DATA_AWARE`).
ChannelScores = dict[nn.Module, torch.Tensor]

_IN_CHANNEL_FUNCTIONS = (function.prune_conv_in_channels, function.prune_linear_in_channels)


class InputChannelImportance:
    """A channel scores the sum, over the layers that consume it, of their score for that input channel.

    The per-layer scores come from the calibration images (:data:`DATA_AWARE`); a group none of whose
    consumers has scores is ranked by ``l2`` weight magnitude instead.
    """

    def __init__(self, scores: ChannelScores | None) -> None:
        self.scores = scores or {}
        self.fallback = tp.importance.GroupMagnitudeImportance(p=2)

    def __call__(self, group: Any) -> torch.Tensor | None:
        total: torch.Tensor | None = None
        size = len(group[0].idxs)
        for i, (dep, idxs) in enumerate(group):
            layer_scores = self.scores.get(dep.layer)
            in_channels = getattr(dep.layer, "in_channels", getattr(dep.layer, "in_features", -1))
            if dep.pruning_fn not in _IN_CHANNEL_FUNCTIONS or layer_scores is None:
                continue
            if layer_scores.numel() != in_channels:  # already pruned on its inputs: scores no longer align
                continue
            score = layer_scores[torch.as_tensor(idxs, dtype=torch.long)]
            root = torch.as_tensor(group[i].root_idxs, dtype=torch.long)
            total = torch.zeros(size) if total is None else total
            total.index_add_(0, root, score.float())
        return total if total is not None else self.fallback(group)


def input_column_norms(layer: nn.Module) -> torch.Tensor | None:
    """L2 norm of the weights reading each input channel of a Conv2d (groups=1) / Linear, on the CPU."""
    if isinstance(layer, nn.Linear):
        return layer.weight.detach().float().norm(dim=0).cpu()
    if isinstance(layer, nn.Conv2d) and layer.groups == 1:
        return layer.weight.detach().float().transpose(0, 1).flatten(1).norm(dim=1).cpu()
    return None


def activation_scores(
    model: nn.Module, images: torch.Tensor, targets: torch.Tensor | None, batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """``act``: per layer and input channel, ``||W[:, j]|| * rms(x_j)`` on ``images`` (by layer name)."""
    rms = input_channel_rms(model, images, batch_size)
    scores = {}
    for name, module in model.named_modules():
        norms = input_column_norms(module)
        if norms is not None and name in rms and rms[name].numel() == norms.numel():
            scores[name] = norms * rms[name]
    return scores


def taylor_scores(
    model: nn.Module, images: torch.Tensor, targets: torch.Tensor | None, batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """``taylor``: per layer and input channel, ``|sum of w * dL/dw|`` over the weights reading that channel.

    The first-order estimate of the change of the cross-entropy loss on the labelled calibration images
    when the channel is removed. Empty without labels (images of unmatched classes, target -1, are left out).
    """
    layers = {n: m for n, m in model.named_modules() if input_column_norms(m) is not None}
    if targets is None or not bool((targets >= 0).any()) or not layers:
        return {}
    weights = [m.weight for m in layers.values()]
    frozen = [w for w in weights if not w.requires_grad]
    sums = [torch.zeros_like(w, dtype=torch.float32) for w in weights]
    model.eval()
    try:
        for w in frozen:
            w.requires_grad_(True)
        with torch.enable_grad():
            for start in range(0, images.shape[0], batch_size):
                part, wanted = images[start : start + batch_size], targets[start : start + batch_size]
                known = (wanted >= 0).to(part.device)
                if not bool(known.any()):
                    continue
                logits = forward_logits(model, part)
                loss = F.cross_entropy(logits[known].float(), wanted.to(part.device)[known], reduction="sum")
                grads = torch.autograd.grad(loss, weights, allow_unused=True)
                for total, grad in zip(sums, grads, strict=True):
                    if grad is not None:
                        total += grad.float()
    finally:
        for w in frozen:
            w.requires_grad_(False)
    scores = {}
    for (name, module), grad in zip(layers.items(), sums, strict=True):
        product = module.weight.detach().float() * grad
        dims = [d for d in range(product.ndim) if d != 1]
        scores[name] = product.sum(dims).abs().cpu()
    return scores


#: Data-aware criteria: how each computes its per-layer input-channel scores from calibration images
#: (and labels, for ``taylor``), by layer name.
DATA_AWARE: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor | None, int], dict[str, torch.Tensor]]] = {
    "act": activation_scores,
    "taylor": taylor_scores,
}

#: Group importance criteria for structured pruning, by name: factories given the data-aware scores (or None).
IMPORTANCE: dict[str, Callable[[ChannelScores | None], Any]] = {
    "act": InputChannelImportance,
    "taylor": InputChannelImportance,
    "l1": lambda _scores: tp.importance.GroupMagnitudeImportance(p=1),
    "l2": lambda _scores: tp.importance.GroupMagnitudeImportance(p=2),
    "random": lambda _scores: tp.importance.RandomImportance(),
}

#: Norm degree used to rank attention heads for each magnitude criterion; other criteria rank randomly.
HEAD_NORM_P: dict[str, int] = {"l1": 1, "l2": 2}


def unknown_importance(name: str) -> str:
    """The message for an importance name that is not in ``IMPORTANCE``; it lists the valid names."""
    return f"unknown importance {name!r}; valid names: {', '.join(sorted(IMPORTANCE))}"


def get_importance(name: str, scores: ChannelScores | None = None) -> Any:
    """Instantiate the importance criterion ``name``; ``ValueError`` lists the valid names."""
    try:
        factory = IMPORTANCE[name]
    except KeyError:
        raise ValueError(unknown_importance(name)) from None
    return factory(scores)


__all__ = [
    "DATA_AWARE",
    "HEAD_NORM_P",
    "IMPORTANCE",
    "ChannelScores",
    "InputChannelImportance",
    "activation_scores",
    "get_importance",
    "input_column_norms",
    "taylor_scores",
    "unknown_importance",
]
