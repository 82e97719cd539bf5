"""The structure of a compressed model: how it differs from the original, described and applied again.

A pruned model is saved as its weights plus :func:`describe_structure` (per module, the attributes and
parameter/buffer shapes that differ from the original); :func:`apply_structure` resizes a fresh original to
that structure, so the model is rebuilt from the original's config, resized, and loaded, without unpickling. A
parameter-free padding shortcut that pruning turned into an index map (:mod:`tools.compression.shortcuts`) is
recorded as ``replace`` and rebuilt as a :class:`ChannelSelect`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tools.compression.shortcuts import ChannelSelect, replace_module

_SIMPLE = (int, float, bool, str)


def _simple_attrs(module: nn.Module) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, _SIMPLE):
            attrs[key] = value
        elif isinstance(value, tuple | list) and all(isinstance(v, _SIMPLE) for v in value):
            attrs[key] = list(value)
    return attrs


def describe_structure(model: nn.Module, reference: nn.Module) -> dict[str, dict[str, Any]]:
    """Per module: the attributes and parameter/buffer shapes that differ from ``reference``."""
    ref_modules = dict(reference.named_modules())
    structure: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        ref = ref_modules.get(name)
        if ref is None:
            continue
        if isinstance(module, ChannelSelect) and not isinstance(ref, ChannelSelect):  # a padding shortcut, pruned
            structure[name] = {"replace": {"type": "ChannelSelect", **_simple_attrs(module)}}
            continue
        ref_attrs = _simple_attrs(ref)
        attrs = {k: v for k, v in _simple_attrs(module).items() if k in ref_attrs and ref_attrs[k] != v}
        shapes = {}
        for kind in ("_parameters", "_buffers"):
            mine, theirs = getattr(module, kind), getattr(ref, kind)
            for key, tensor in mine.items():
                other = theirs.get(key)
                if tensor is not None and other is not None and tensor.shape != other.shape:
                    shapes[key] = list(tensor.shape)
        if attrs or shapes:
            structure[name] = {"attrs": attrs, "shapes": shapes}
    return structure


def apply_structure(model: nn.Module, structure: dict[str, dict[str, Any]]) -> None:
    """Resize ``model`` in place to the described structure (values are placeholders: zeros)."""
    for name, change in structure.items():
        if "replace" in change:
            attrs = change["replace"]
            select = ChannelSelect(int(attrs["in_channels"]), int(attrs["out_channels"]), int(attrs["stride"]))
            replace_module(model, name, select)
    modules = dict(model.named_modules())
    for name, change in structure.items():
        if "replace" in change:
            continue
        module = modules[name]
        for key, value in change.get("attrs", {}).items():
            current = getattr(module, key, None)
            setattr(module, key, tuple(value) if isinstance(current, tuple) else value)
        for key, shape in change.get("shapes", {}).items():
            if key in module._parameters and module._parameters[key] is not None:
                old = module._parameters[key]
                assert old is not None
                module._parameters[key] = nn.Parameter(
                    torch.zeros(shape, dtype=old.dtype, device=old.device), requires_grad=old.requires_grad
                )
            elif key in module._buffers and module._buffers[key] is not None:
                old_buf = module._buffers[key]
                assert old_buf is not None
                module._buffers[key] = torch.zeros(shape, dtype=old_buf.dtype, device=old_buf.device)


__all__ = ["apply_structure", "describe_structure"]
