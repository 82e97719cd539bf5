"""Importance criteria for pruning, by name: how channels (Torch-Pruning groups) and attention heads are ranked.

``IMPORTANCE`` maps a name to a Torch-Pruning group importance (structured pruning); ``HEAD_NORM_P`` gives the
norm degree that ranks attention heads for the magnitude criteria (other criteria rank heads randomly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch_pruning as tp

#: Group importance criteria for structured pruning, by name. ``taylor`` is deliberately absent: it needs
#: gradients from a labelled batch, and Torch-Pruning's implementation fails on ``weight.grad is None``.
IMPORTANCE: dict[str, Callable[[], Any]] = {
    "l1": lambda: tp.importance.GroupMagnitudeImportance(p=1),
    "l2": lambda: tp.importance.GroupMagnitudeImportance(p=2),
    "random": lambda: tp.importance.RandomImportance(),
}

#: Norm degree used to rank attention heads for each magnitude criterion; other criteria rank randomly.
HEAD_NORM_P: dict[str, int] = {"l1": 1, "l2": 2}


def unknown_importance(name: str) -> str:
    """The message for an importance name that is not in ``IMPORTANCE``; it lists the valid names."""
    return f"unknown importance {name!r}; valid names: {', '.join(sorted(IMPORTANCE))}"


def get_importance(name: str) -> Any:
    """Instantiate the importance criterion ``name``; ``ValueError`` lists the valid names."""
    try:
        factory = IMPORTANCE[name]
    except KeyError:
        raise ValueError(unknown_importance(name)) from None
    return factory()


__all__ = ["HEAD_NORM_P", "IMPORTANCE", "get_importance", "unknown_importance"]
