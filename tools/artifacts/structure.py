"""The structure of a compressed model: how it differs from the original, described and applied again.

A pruned model is saved as its weights plus :func:`describe_structure` (per module, the attributes and
parameter/buffer shapes that differ from the original); :func:`apply_structure` resizes a fresh original to
that structure, so the model is rebuilt from the original's config, resized, and loaded, without unpickling.

A module pruning replaced by another class (:data:`REPLACEMENTS`) is recorded as ``replace``: its class and simple
attributes, from which it is rebuilt, its descendants not described apart. So are a parameter-free padding shortcut
turned into an index map (:class:`ChannelSelect`, :mod:`tools.compression.shortcuts`) and an
``nn.MultiheadAttention`` split into q/k/v/o layers (:class:`SplitMultiheadAttention`, :mod:`tools.compression.mha`:
its head count, head width and sizes are attributes), and a block removed whole (:class:`SkippedBlock`,
:mod:`tools.compression.kinds.blocks`: its output layout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tools.compression.kinds.blocks import SkippedBlock
from tools.compression.mha import SplitMultiheadAttention
from tools.compression.shortcuts import ChannelSelect, replace_module

_SIMPLE = (int, float, bool, str)

#: Classes a pruned model may hold where its original holds another, by class name: how one is rebuilt from its
#: recorded attributes and the module it replaces.
REPLACEMENTS: dict[str, Callable[[dict[str, Any], nn.Module], nn.Module]] = {
    "ChannelSelect": lambda attrs, _old: ChannelSelect(
        int(attrs["in_channels"]), int(attrs["out_channels"]), int(attrs["stride"])
    ),
    "SplitMultiheadAttention": lambda attrs, old: SplitMultiheadAttention.from_attrs(attrs, like=old),
    "SkippedBlock": lambda attrs, _old: SkippedBlock(int(attrs.get("outputs", 0))),
}


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
    replaced: list[str] = []
    for name, module in model.named_modules():
        ref = ref_modules.get(name)
        if ref is None or any(name.startswith(f"{r}.") for r in replaced):
            continue
        kind = type(module).__name__
        if kind in REPLACEMENTS and kind != type(ref).__name__:  # rebuilt whole from its attributes
            structure[name] = {"replace": {"type": kind, **_simple_attrs(module)}}
            replaced.append(name)
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
            build = REPLACEMENTS.get(str(attrs.get("type")))
            if build is None:
                raise ValueError(f"the structure replaces {name} by an unknown class {attrs.get('type')!r}")
            replace_module(model, name, build(attrs, model.get_submodule(name)))
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


def blocks_added(structure: dict[str, dict[str, Any]], start: dict[str, dict[str, Any]]) -> dict[str, int] | None:
    """The blocks ``structure`` removes whole (:class:`SkippedBlock`) beyond ``start`` (name -> output layout), where
    it differs from ``start`` by those alone: every module ``start`` changed is changed alike in ``structure`` or lies
    in a block it removes, and it changes nothing else; None otherwise, or where it removes no block more. A model of
    ``start``'s structure becomes one of ``structure``'s by replacing those blocks (a depth ladder's step from the
    step before it: ``tools.stages.cross_fit``)."""

    def skipped(entry: dict[str, Any]) -> bool:
        return bool(entry.get("replace", {}).get("type") == "SkippedBlock")

    added = {n: int(e["replace"].get("outputs", 0)) for n, e in structure.items() if skipped(e) and n not in start}
    if not added:
        return None
    inside = tuple(f"{name}." for name in added)
    if any(structure.get(n) != entry for n, entry in start.items() if n not in added and not n.startswith(inside)):
        return None
    return None if any(n not in start and n not in added for n in structure) else added


__all__ = ["REPLACEMENTS", "apply_structure", "blocks_added", "describe_structure"]
