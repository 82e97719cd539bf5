"""Forward passes on example inputs, and rollback: what channel and head pruning share to check each step.

A pruning step is checked with a forward pass (:func:`check_forward`); when it fails, the model is put back
as it was (:func:`snapshot` before, :func:`restore` after). Parameter tensors are never modified in place
(pruning builds new ones), so a snapshot only keeps references to every module's attribute dictionaries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tools.models.base import logits_of

#: Example inputs: a tensor, a sequence of positional tensors, or a mapping of keyword tensors.
ExampleInputs = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model`` called on a tensor, positional tensors or keyword tensors."""
    if isinstance(inputs, torch.Tensor):
        return model(inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(*inputs)


def forward_logits(model: nn.Module, inputs: Any) -> torch.Tensor:
    return logits_of(call_model(model, inputs))


def forward_with_hooks(model: nn.Module, inputs: Any, handles: list[Any]) -> torch.Tensor:
    """``model``'s logits on ``inputs`` (eval mode, no grad) with the hooks of ``handles`` registered; the hooks are
    removed afterwards, also when the forward pass fails."""
    try:
        with torch.no_grad():
            return forward_logits(model.eval(), inputs)
    finally:
        for handle in handles:
            handle.remove()


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def check_forward(model: nn.Module, inputs: Any, num_classes: int) -> str | None:
    """Run the model; None when it gives logits with ``num_classes`` classes, else the problem."""
    try:
        with torch.no_grad():
            logits = forward_logits(model, inputs)
    except Exception as exc:
        return f"forward pass fails: {one_line(exc)}"
    if logits.shape[-1] != num_classes:
        return f"logits have {logits.shape[-1]} classes instead of {num_classes}"
    return None


Snapshot = list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]]


def snapshot(model: nn.Module) -> Snapshot:
    """References to every module's state; valid because pruning replaces tensors instead of editing them."""
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in model.modules()]


def restore(snap: Snapshot) -> None:
    """Put every module of a :func:`snapshot` back as it was."""
    for module, attrs, params, buffers, children in snap:
        module.__dict__.clear()
        module.__dict__.update(attrs)
        module._parameters = dict(params)
        module._buffers = dict(buffers)
        module._modules = dict(children)


__all__ = [
    "ExampleInputs",
    "Snapshot",
    "call_model",
    "check_forward",
    "forward_logits",
    "forward_with_hooks",
    "one_line",
    "restore",
    "snapshot",
]
