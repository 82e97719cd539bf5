"""What the evaluation modules share: :class:`EvaluationError` and :func:`eval_mode`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["EvaluationError", "eval_mode"]


class EvaluationError(ValueError):
    """Bad input to an evaluation or timing function (one line, actionable)."""


@contextmanager
def eval_mode(models: Sequence[Any]) -> Iterator[None]:
    """nn.Modules in eval mode for the duration, each restored to its previous mode afterwards."""
    modules = [m for m in models if isinstance(m, nn.Module)]
    previous = [m.training for m in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, was_training in zip(modules, previous, strict=True):
            module.train(was_training)
