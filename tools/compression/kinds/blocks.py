"""Blocks: a whole block or layer removed, its output replaced by its input (``block``).

At batch 1 an int8 CNN costs per layer, so narrower channels barely speed it up, while a block removed saves all of
its layers' calls: CIFAR ResNet-20 with two of its nine blocks removed and distilled ran 1.25x OpenVINO int8 of the
original (``benchmarks/block_removal.py``) where channel pruning reached parity.

A *removable block* is a child of an ``nn.Sequential`` or ``nn.ModuleList``, called once per forward pass, whose
output has its first input's shape (a tensor, or a tuple whose first element is that tensor and whose others are
``None``), that holds at least two weight layers, and without which the model still runs
(checked once): a residual block with an identity shortcut (torchvision's, timm's, Hugging Face's and plain-PyTorch
ResNets), an inverted residual with a skip, a transformer encoder layer (Hugging Face ViT and DeiT, Swin within a
stage, ``nn.TransformerEncoderLayer``). Of nested ones, a stage (holding two or more such blocks) gives way to its
blocks, and a block is removed whole, not a part of it (the squeeze-excitation that
torchvision's inverted residual holds in its ``Sequential``). Removing it replaces it by a
:class:`SkippedBlock`, which returns a copy of its input in the block's output layout; the saved structure records the
replacement (:mod:`tools.artifacts.structure`), so a reloaded, exported or served model is rebuilt the same. A block is
removed whole (ratio 1) or not at all; its sensitivity is measured removed alone, like any other unit's, and a plan may
mix blocks with channels and heads (a unit inside a removed block is not pruned as well).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tools.compression.forward import check_forward, forward_logits, restore, snapshot
from tools.compression.kinds.base import PruningSession, UnitKind, exact_name
from tools.compression.reports import AppliedPruning, PrunableLayers, SkippedPruning
from tools.compression.shortcuts import replace_module
from tools.schemas import LayerProfile, PruningRecommendation, SensitivityUnit

logger = logging.getLogger(__name__)

__all__ = ["Blocks", "SkippedBlock", "removable_blocks"]


class SkippedBlock(nn.Module):
    """A removed block: a copy of its first input (a new tensor, as the block's output was: a caller that adds the
    shortcut in place, as Hugging Face's ResNet does, must not change the input), as a tensor when ``outputs`` is 0,
    else first of a tuple of ``outputs`` whose others are ``None`` (Swin's layers return their attention weights)."""

    def __init__(self, outputs: int = 0) -> None:
        super().__init__()
        self.outputs = int(outputs)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        copied = x.clone()
        return copied if self.outputs == 0 else (copied, *([None] * (self.outputs - 1)))


def _layout(first: Any, output: Any) -> int | None:
    """The output layout :class:`SkippedBlock` must give (0: a tensor, n: a tuple of n), or None where the block's
    output is not its input's shape (or carries more than that tensor)."""
    if not isinstance(first, torch.Tensor):
        return None
    if isinstance(output, torch.Tensor):
        return 0 if output.shape == first.shape else None
    ok = isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor)
    return len(output) if ok and output[0].shape == first.shape and all(o is None for o in output[1:]) else None


#: The blocks found in the latest models, by their structure (:func:`_structure`): every probe of the sensitivity
#: profile prunes a fresh copy of one original, and finding its blocks again took EfficientNet-Lite2 at 260 px two
#: forward passes for each of its 16 candidates, per block probe (10 s of a profile).
_FOUND: dict[tuple[Any, ...], dict[str, int]] = {}
_FOUND_KEPT = 8


def _structure(model: nn.Module, example: Any) -> tuple[Any, ...]:
    """What the removable blocks of ``model`` on ``example`` depend on: its modules' names, classes and parameter
    shapes, and the input's shapes (not the weights or the pixels)."""
    values = example.values() if isinstance(example, dict) else [example]
    shapes = [tuple(v.shape) for v in values if hasattr(v, "shape")]
    modules = tuple(
        (name, type(m).__qualname__, tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
        for name, m in model.named_modules()
    )
    return modules, tuple(shapes)


def removable_blocks(model: nn.Module, example: Any) -> dict[str, int]:
    """Every removable block of ``model`` (see module doc), by name, with its output layout (:class:`SkippedBlock`),
    found on one forward pass of ``example`` (once for models of the same structure: :data:`_FOUND`)."""
    key = _structure(model, example)
    if key not in _FOUND:
        if len(_FOUND) >= _FOUND_KEPT:
            _FOUND.clear()
        _FOUND[key] = _find_blocks(model, example)
    return dict(_FOUND[key])


def _find_blocks(model: nn.Module, example: Any) -> dict[str, int]:
    candidates = {
        f"{name}.{child}" if name else child: module
        for name, container in model.named_modules()
        if isinstance(container, nn.Sequential | nn.ModuleList)
        for child, module in container.named_children()
        if not isinstance(module, SkippedBlock)
    }
    calls: dict[str, int] = {}
    layouts: dict[str, int | None] = {}

    def hook(name: str) -> Any:
        def check(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            calls[name] = calls.get(name, 0) + 1
            layouts[name] = _layout(args[0] if args else None, output)

        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in candidates.items()]
    try:
        with torch.no_grad():
            forward_logits(model.eval(), example)
    finally:
        for handle in handles:
            handle.remove()
    same = {n: layout for n, layout in layouts.items() if layout is not None and calls.get(n) == 1}
    # a block holds at least two weight layers: a single convolution (with its norm and activation) is a layer of
    # a block, not one (Hugging Face's ResNet keeps a block's convolutions in a Sequential of its own), and
    # parameter-free children (activations, pooling) save nothing
    same = {n: layout for n, layout in same.items() if _weight_layers(candidates[n]) >= 2}
    # nested ones: a stage (holding two or more such blocks) gives way to its blocks, and a block to nothing inside
    # it (torchvision's inverted residual holds its squeeze-excitation in a Sequential: a part of the block)
    stages = {n for n in same if sum(o.startswith(n + ".") for o in same) >= 2}
    blocks = {
        n: layout
        for n, layout in same.items()
        if n not in stages and not any(n.startswith(o + ".") for o in same if o not in stages)
    }
    return {n: layout for n, layout in blocks.items() if _still_runs(model, n, layout, example)}


def _weight_layers(module: nn.Module) -> int:
    return sum(1 for m in module.modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear))


def _still_runs(model: nn.Module, name: str, layout: int, example: Any) -> bool:
    """Whether ``model`` still runs with the block ``name`` replaced (its caller may read the block's attributes:
    ``nn.TransformerEncoder`` reads its first layer's attention settings); the block is put back."""
    block = model.get_submodule(name)
    replace_module(model, name, SkippedBlock(layout))
    try:
        with torch.no_grad():
            forward_logits(model, example)
        return True
    except Exception as exc:  # any failure of the forward: not removable
        logger.info("block %s is not removable: %s", name, exc)
        return False
    finally:
        replace_module(model, name, block)


class Blocks(UnitKind):
    name = "block"
    label = "blocks"
    counts = "blocks"
    flavour = "blocks"
    removes = "the whole block (replaced by its input)"
    keywords = ("block", "layer removal", "remove layer", "whole layer")
    whole = True
    sheds_layers = True
    noun = "removable block"
    description = "removes each selected block whole (its output becomes its input), pruning_ratio 1"

    def find(self, prunable: PrunableLayers, layers: Sequence[LayerProfile]) -> list[SensitivityUnit]:
        return [
            SensitivityUnit(pattern=exact_name(name), pruning_type=self.name, kind=self.flavour, modules=[name], size=1)
            for name in prunable.blocks
        ]

    def selectable(self, prunable: PrunableLayers) -> dict[str, list[str]]:
        return {name: [name] for name in prunable.blocks}

    def size(self, model: nn.Module, unit: SensitivityUnit) -> int:
        return 1

    def admits(
        self, unit: SensitivityUnit, chosen: Sequence[SensitivityUnit], units: Sequence[SensitivityUnit]
    ) -> bool:
        """Not the last removable block of its container: a stage (or a transformer's encoder) keeps at least one
        (removing them all leaves no model: a tiny ViT without its two layers is its patch embedding and classifier)."""
        parent = unit.modules[0].rpartition(".")[0]
        siblings = [u for u in units if u.pruning_type == self.name and u.modules[0].rpartition(".")[0] == parent]
        taken = [u for u in chosen if u.pruning_type == self.name and u.modules[0].rpartition(".")[0] == parent]
        return len(taken) + 1 < len(siblings)

    def involved(self, unit: SensitivityUnit, layers: Sequence[str], consumers: Sequence[str]) -> list[str]:
        return [name for name in layers if any(name.startswith(m + ".") for m in unit.modules)]

    def _blocks(self, session: PruningSession) -> dict[str, int]:
        if self.name not in session.memo:
            session.memo[self.name] = removable_blocks(session.model, session.inputs)
        found: dict[str, int] = session.memo[self.name]
        return found

    def matches(self, session: PruningSession, regex: re.Pattern[str]) -> bool:
        return any(regex.search(n) for n in self._blocks(session))

    def apply(
        self, session: PruningSession, rec: PruningRecommendation, regex: re.Pattern[str]
    ) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
        model, blocks = session.model, self._blocks(session)
        chosen = [n for n in blocks if regex.search(n)]
        snap = snapshot(model)
        for name in chosen:
            replace_module(model, name, SkippedBlock(blocks[name]))
            blocks.pop(name)
        problem = check_forward(model, session.inputs, session.context.num_classes) if chosen else None
        if problem:
            restore(snap)
            return None, [SkippedPruning(target=n, reason=f"removing it breaks the model: {problem}") for n in chosen]
        if not chosen:
            return None, []
        session.context.dg = None  # the graph changed: retrace when channels are pruned next
        logger.debug("block %r: removed %s", rec.layer, ", ".join(chosen))
        return (
            AppliedPruning(
                pattern=rec.layer,
                pruning_type=self.name,
                ratio=1.0,
                modules=chosen,
                before=len(chosen),
                after=0,
                consumers=[],
            ),
            [],
        )
