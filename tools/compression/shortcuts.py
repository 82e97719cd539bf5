"""Parameter-free channel shortcuts made prunable: a padding shortcut becomes a selection, then an index map.

CIFAR ResNets' "option A" shortcut (``F.pad(x[:, :, ::2, ::2], ...)`` with zero channels on each side, as a small
module such as ``LambdaLayer`` or ``PadShortcut``) joins two residual streams of different widths through an op
Torch-Pruning's dependency graph does not model: it takes the pad for an element-wise op and couples every stage's
stream into one group of mixed widths, which cannot be pruned at all. Such a module computes, exactly, a 1x1
convolution with stride ``s`` whose weight is a 0/1 selection matrix (each output channel a copy of one input
channel, or zero). So:

* :func:`find_channel_shortcuts` finds the parameter-free modules that compute such a selection, by running them
  on a random input (no model code is read or special-cased);
* :func:`to_selection_convs_` swaps each for a :class:`SelectionConv` (an ``nn.Conv2d``) before the dependency
  graph is traced, so each stage's stream is a group of its own; pruning removes the selection's rows and columns
  with the stream channels on either side, and recovery leaves it alone (it stays an exact selection);
* :func:`to_channel_selects_` turns every :class:`SelectionConv` back into a parameter-free :class:`ChannelSelect`
  (an index buffer: gather, zeros where nothing is selected), which the saved structure records and
  :func:`replace_module` rebuilds on load.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MAX_SEGMENTS",
    "ChannelSelect",
    "SelectionConv",
    "channel_segments",
    "find_channel_shortcuts",
    "replace_module",
    "to_channel_selects_",
    "to_selection_convs_",
]


class SelectionConv(nn.Conv2d):
    """A 1x1, bias-free convolution with stride whose weight selects input channels (a shortcut while pruning)."""


class ChannelSelect(nn.Module):
    """``x[:, :, ::stride, ::stride]`` with output channel ``j`` = input channel ``index[j]`` (-1: zeros).

    Computed as slices of contiguous input channels padded with zero channels (:func:`channel_segments`): a padding
    shortcut stays one ``Slice`` + ``Pad`` when exported, as the original's is, where a gather of a computed index
    (``ShapeOf``/``Select``/``Gather``) ran CIFAR ResNet-20's pruned rounds 2-6 % slower in OpenVINO int8 and ONNX
    Runtime static int8 (AMD EPYC, AVX512-VNNI, batch 1), slower than the unpruned original. An index of more than
    :data:`MAX_SEGMENTS` runs is gathered (a constant index)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, index: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.register_buffer("index", torch.full((out_channels,), -1, dtype=torch.long) if index is None else index)
        self.segments = channel_segments(self._index().tolist())

    def _index(self) -> torch.Tensor:
        index = self.index
        assert isinstance(index, torch.Tensor)
        return index

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.segments = channel_segments(self._index().tolist())  # the index loaded: its runs again

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        if self.segments is None:
            padded = F.pad(x, (0, 0, 0, 0, 0, 1))  # one zero channel at the end, for index -1
            index = self._index()
            return padded.index_select(1, torch.where(index < 0, self.in_channels, index))
        parts = [
            F.pad(x if (start, stop) == (0, self.in_channels) else x[:, start:stop], (0, 0, 0, 0, before, after))
            for start, stop, before, after in self.segments
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, stride={self.stride}"


#: The most runs of contiguous input channels a :class:`ChannelSelect` computes as slices (more: one gather).
MAX_SEGMENTS = 4


def channel_segments(index: list[int]) -> list[tuple[int, int, int, int]] | None:
    """``index`` (input channel of each output channel, -1: zero) as runs of contiguous input channels, each
    ``(start, stop, zeros before, zeros after)``; None where that takes more than :data:`MAX_SEGMENTS` runs or
    nothing is selected."""
    segments: list[list[int]] = []
    leading = 0
    for i in index:
        if i < 0:
            if segments:
                segments[-1][3] += 1
            else:
                leading += 1
        elif segments and segments[-1][3] == 0 and segments[-1][1] == i:
            segments[-1][1] += 1
        else:
            segments.append([i, i + 1, 0, 0])
    if not segments or len(segments) > MAX_SEGMENTS:
        return None
    segments[0][2] = leading
    return [(start, stop, before, after) for start, stop, before, after in segments]


def _selection(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, list[int]] | None:
    """(stride, input channel of each output channel or -1) when ``module`` maps ``x`` to such a selection."""
    if x.ndim != 4 or y.ndim != 4 or y.shape[1] <= x.shape[1] or y.shape[0] != x.shape[0]:
        return None
    stride = next(
        (s for s in range(1, 5) if -(-x.shape[2] // s) == y.shape[2] and -(-x.shape[3] // s) == y.shape[3]), 0
    )
    if not stride:
        return None
    probe = torch.randn(2, *x.shape[1:], generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    with torch.no_grad():
        out = module(probe)
    if not isinstance(out, torch.Tensor) or out.shape[1:] != y.shape[1:]:
        return None
    sub = probe[:, :, ::stride, ::stride].transpose(0, 1).reshape(probe.shape[1], -1)
    index = []
    for channel in out.transpose(0, 1).reshape(out.shape[1], -1):
        if not bool(channel.abs().max() > 0):
            index.append(-1)
            continue
        hits = (sub == channel).all(1).nonzero()
        if hits.numel() == 0:
            return None
        index.append(int(hits[0]))
    return stride, index


def find_channel_shortcuts(model: nn.Module, example: Any) -> dict[str, tuple[int, int, int, list[int]]]:
    """Parameter-free leaf modules computing a channel selection with stride, found on one forward pass of
    ``example``: name -> (in_channels, out_channels, stride, index)."""
    from tools.compression.forward import forward_with_hooks

    names = {m: n for n, m in model.named_modules()}
    leaves = [
        m
        for m in model.modules()
        if not list(m.children()) and not list(m.parameters(recurse=False)) and type(m).forward is not nn.Module.forward
    ]
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            seen.setdefault(names[module], (args[0], out))

    handles = [m.register_forward_hook(hook) for m in leaves]
    forward_with_hooks(model, example, handles)
    found = {}
    for name, (x, y) in seen.items():
        selection = _selection(model.get_submodule(name), x, y)
        if selection is not None:
            found[name] = (int(x.shape[1]), int(y.shape[1]), *selection)
    return found


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def to_selection_convs_(
    model: nn.Module, example: Any, found: dict[str, tuple[int, int, int, list[int]]] | None = None
) -> list[str]:
    """Swap every parameter-free channel shortcut of ``model`` for an equal :class:`SelectionConv` (IN PLACE);
    ``found``: :func:`find_channel_shortcuts` of ``model`` where the caller has it."""
    found = find_channel_shortcuts(model, example) if found is None else found
    reference = next(model.parameters(), None)
    for name, (c_in, c_out, stride, index) in found.items():
        conv = SelectionConv(c_in, c_out, kernel_size=1, stride=stride, bias=False)
        weight = torch.zeros(c_out, c_in, 1, 1)
        for j, i in enumerate(index):
            if i >= 0:
                weight[j, i] = 1.0
        conv.weight = nn.Parameter(weight, requires_grad=False)
        if reference is not None:
            conv.to(reference.device, reference.dtype)
        replace_module(model, name, conv)
    return list(found)


def to_channel_selects_(model: nn.Module) -> list[str]:
    """Turn every :class:`SelectionConv` of ``model`` into a parameter-free :class:`ChannelSelect` (IN PLACE)."""
    done = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, SelectionConv):
            continue
        weight = module.weight.detach().reshape(module.out_channels, module.in_channels)
        index = torch.where(weight.abs().sum(1) > 0, weight.abs().argmax(1), -1).to(torch.long).cpu()
        stride = int(module.stride[0])
        select = ChannelSelect(module.in_channels, module.out_channels, stride, index)
        replace_module(model, name, select.to(weight.device))
        done.append(name)
    return done
