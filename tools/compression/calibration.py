"""What a calibration batch tells about a model's layers: the rows each Conv2d/Linear sees and produces.

Data-aware importance (:mod:`tools.compression.importance`) and training-free recovery
(:mod:`tools.compression.recovery`) both look at the *inputs* of the layers that consume pruned channels,
as a matrix of rows: for a ``Linear`` every token's input vector, for a ``Conv2d`` every output position's
receptive field (``F.unfold``; columns ordered channel-major, ``k*k`` per input channel). Rows are
subsampled to at most ``max_rows`` with a seeded choice that depends only on the number of rows, so the
original and a pruned copy of a model (same batch, same spatial sizes) pick the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tools.compression.forward import forward_logits, forward_with_hooks

__all__ = [
    "DEFAULT_MAX_ROWS",
    "capture",
    "chunks",
    "conv_padding",
    "input_channel_rms",
    "input_rows",
    "input_rows_with_images",
    "output_rows",
    "row_index",
    "run_with_pre_hooks",
]

#: Rows kept per layer: enough for a least-squares fit of a few thousand inputs, bounded memory.
DEFAULT_MAX_ROWS = 16384


#: The most input elements one chunk of a pass over many images holds: past it, a large model's activations fall out of
#: the CPU's caches and memory-bound layers slow the pass several times over. EfficientNet-Lite2 at 260 px on one
#: AMD EPYC Zen 4 core: 64 images in 11.2 s as one chunk, 5.0 s in chunks of 8, 3.4 of 4, 2.7 of 2, 3.1 of 1
#: (batch norm alone took as long as the convolutions at 64). 32-px CIFAR images still go 64 at a time.
PASS_INPUT_ELEMENTS = 600_000


def pass_images(batch: torch.Tensor, most: int = 64) -> int:
    """Images of ``batch`` one chunk of a pass holds: ``most``, fewer where an image is large
    (:data:`PASS_INPUT_ELEMENTS`)."""
    return max(1, min(most, PASS_INPUT_ELEMENTS // max(1, batch[:1].numel())))


def chunks(batch: torch.Tensor, size: int) -> Iterable[torch.Tensor]:
    """``batch`` in chunks of at most ``size`` images, fewer where an image is large (:func:`pass_images`)."""
    size = pass_images(batch, size)
    for start in range(0, batch.shape[0], size):
        yield batch[start : start + size]


def row_index(total: int, max_rows: int, seed: int = 0) -> torch.Tensor | None:
    """Rows kept out of ``total`` (sorted), or None to keep every row."""
    if total <= max_rows:
        return None
    gen = torch.Generator().manual_seed(seed + total)
    return torch.sort(torch.randperm(total, generator=gen)[:max_rows]).values


def _take(rows: torch.Tensor, max_rows: int) -> torch.Tensor:
    index = row_index(rows.shape[0], max_rows)
    return rows if index is None else rows.index_select(0, index.to(rows.device))


def input_rows(
    module: nn.Module, x: torch.Tensor, max_rows: int = DEFAULT_MAX_ROWS, image_chunk: int = 16
) -> torch.Tensor:
    """The rows ``module`` multiplies by its weight: (rows, in_features) or (rows, C_in * k * k).

    Convolutions are unfolded ``image_chunk`` images at a time, keeping only the chosen rows, so a large
    batch of large images never holds its whole unfolded input.
    """
    return input_rows_with_images(module, x, max_rows, image_chunk)[0]


def input_rows_with_images(
    module: nn.Module, x: torch.Tensor, max_rows: int = DEFAULT_MAX_ROWS, image_chunk: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`input_rows` and, for each row, the index of the image (along ``x``'s first axis) it came from."""
    if not isinstance(module, nn.Conv2d):
        flat = x.detach().reshape(-1, x.shape[-1])
        index = row_index(flat.shape[0], max_rows)
        rows = flat.float() if index is None else flat.index_select(0, index.to(x.device)).float()
        return rows, _images_of(index, flat.shape[0], int(x.shape[0]) if x.ndim > 1 else 1)
    pads = conv_padding(module, x)

    def unfold(part: torch.Tensor) -> torch.Tensor:
        part = F.pad(part.detach().float(), pads) if any(pads) else part.detach().float()
        cols = F.unfold(part, module.kernel_size, module.dilation, 0, module.stride)
        return cols.transpose(1, 2).reshape(-1, cols.shape[1])

    first = unfold(x[:1])
    per_image = first.shape[0]
    total = per_image * x.shape[0]
    index = row_index(total, max_rows)
    if index is None:
        return torch.cat([unfold(part) for part in chunks(x, image_chunk)]), _images_of(None, total, x.shape[0])
    pieces = []
    for start in range(0, x.shape[0], image_chunk):
        lo, hi = start * per_image, min(x.shape[0], start + image_chunk) * per_image
        local = index[(index >= lo) & (index < hi)] - lo
        if local.numel():
            pieces.append(unfold(x[start : start + image_chunk]).index_select(0, local.to(x.device)))
    return torch.cat(pieces), _images_of(index, total, x.shape[0])


Pads = tuple[int, int, int, int]
"""Zero padding as ``F.pad`` takes it for an image: (left, right, top, bottom)."""

#: Padding modules a convolution subclass may apply to its input before convolving (efficientnet_pytorch's static
#: "same" padding is a ``ZeroPad2d`` child).
_PAD_MODULES = (nn.ZeroPad2d, nn.ConstantPad2d)


def _declared_padding(module: nn.Conv2d) -> Pads | None:
    """The padding ``module``'s attributes declare (None: not zeros, or a string this cannot resolve)."""
    if module.padding_mode != "zeros":
        return None
    padding = module.padding
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
        return (total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2)
    return (int(padding[1]), int(padding[1]), int(padding[0]), int(padding[0]))


def _same_padding(module: nn.Conv2d, x: torch.Tensor) -> Pads:
    """TensorFlow's "same" padding of ``x`` (timm's ``Conv2dSame``, efficientnet_pytorch's dynamic padding)."""
    pads: list[int] = []
    for size, k, s, d in zip(x.shape[-2:], module.kernel_size, module.stride, module.dilation, strict=True):
        total = max((-(-int(size) // s) - 1) * s + (k - 1) * d + 1 - int(size), 0)
        pads.append(total)
    return (pads[1] // 2, pads[1] - pads[1] // 2, pads[0] // 2, pads[0] - pads[0] // 2)


def conv_padding(module: nn.Conv2d, x: torch.Tensor) -> Pads:
    """The zero padding ``module`` really applies to ``x`` before convolving, so that its input rows line up with its
    outputs. A plain ``nn.Conv2d`` declares it; a subclass with its own ``forward`` (a ``ZeroPad2d`` child, TensorFlow
    "same" padding computed in the forward) is checked: each candidate is tried on one image against the module's own
    forward. ``ValueError`` where none reproduces it (the layer is then not refit)."""
    declared = _declared_padding(module)
    if type(module).forward is nn.Conv2d.forward and declared is not None:
        return declared
    candidates: list[Pads] = []
    children = list(module.children())
    if children and all(isinstance(c, _PAD_MODULES) and float(getattr(c, "value", 0.0)) == 0.0 for c in children):
        summed = [0, 0, 0, 0]
        for child in children:
            padding: Any = child.padding
            summed = [a + int(b) for a, b in zip(summed, padding, strict=True)]
        base = declared or (0, 0, 0, 0)
        candidates.append(tuple(a + b for a, b in zip(summed, base, strict=True)))  # type: ignore[arg-type]
    candidates += [p for p in (declared, _same_padding(module, x)) if p is not None]
    one = x[:1].detach()
    with torch.no_grad():
        wanted = module.forward(one)
        for pads in dict.fromkeys(candidates):
            padded = F.pad(one, pads)
            got = F.conv2d(padded, module.weight, module.bias, module.stride, 0, module.dilation, module.groups)
            tolerance = 1e-4 * float(wanted.abs().max())
            if got.shape == wanted.shape and torch.allclose(got, wanted, rtol=1e-3, atol=tolerance):
                return pads
    raise ValueError(
        f"{type(module).__name__}'s forward does not convolve its zero-padded input as the layer declares; its input "
        "rows cannot be lined up with its outputs"
    )


def _images_of(index: torch.Tensor | None, total: int, batch: int) -> torch.Tensor:
    """The image of each kept row (``index`` of ``total`` rows, None: all), rows laid out image by image."""
    per_image = max(1, total // max(1, batch))
    rows = torch.arange(total) if index is None else index
    return rows // per_image


def output_rows(module: nn.Module, y: torch.Tensor, max_rows: int = DEFAULT_MAX_ROWS) -> torch.Tensor:
    """The rows ``module`` produced, aligned with :func:`input_rows`: (rows, out_features / C_out)."""
    return _take(_rows_out(module, y).detach().float(), max_rows)


def _rows_out(module: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """Every row ``module`` produced in ``y``, image by image: (rows, out_features / C_out)."""
    if isinstance(module, nn.Conv2d):
        return y.permute(0, 2, 3, 1).reshape(-1, y.shape[1])
    return y.reshape(-1, y.shape[-1])


def capture(
    model: nn.Module,
    batch: torch.Tensor,
    names: Iterable[str],
    *,
    outputs: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    pre_hooks: dict[nn.Module, Callable[..., None]] | None = None,
) -> dict[str, torch.Tensor]:
    """Input rows (or output rows with ``outputs``) of the named modules on one forward pass of ``batch``;
    ``pre_hooks`` (forward pre-hooks by module) run in the same pass. Output rows of large images are taken in chunks
    (:func:`pass_images`), the same rows as in one pass."""
    size = pass_images(batch)
    if outputs and size < 64 and size < batch.shape[0]:
        return _output_rows_in_chunks(model, batch, names, max_rows, pre_hooks or {}, size)
    found: dict[str, torch.Tensor] = {}
    handles = [module.register_forward_pre_hook(hook) for module, hook in (pre_hooks or {}).items()]
    for name in dict.fromkeys(names):
        module = model.get_submodule(name)

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any, name: str = name) -> None:
            if name not in found:
                found[name] = output_rows(mod, out, max_rows) if outputs else input_rows(mod, args[0], max_rows)

        handles.append(module.register_forward_hook(hook))
    forward_with_hooks(model, batch, handles)
    return found


@dataclass
class _Chunk:
    """Where a chunked pass stands: its chunk's first image and size, and the modules seen in it."""

    first: int = 0
    images: int = 1
    seen: set[str] = field(default_factory=set)


def _output_rows_in_chunks(
    model: nn.Module,
    batch: torch.Tensor,
    names: Iterable[str],
    max_rows: int,
    pre_hooks: dict[nn.Module, Callable[..., None]],
    size: int,
) -> dict[str, torch.Tensor]:
    """:func:`capture`'s output rows, ``size`` images a forward pass: of each chunk the rows that :func:`output_rows`
    keeps of the whole batch (rows lie image by image, so a chunk's are a slice of the batch's)."""
    found: dict[str, list[torch.Tensor]] = {}
    kept: dict[str, torch.Tensor | None] = {}
    chunk = _Chunk()

    def hook(mod: nn.Module, args: tuple[Any, ...], out: Any, name: str) -> None:
        if name in chunk.seen:  # a module called twice in one pass: its first call, as in one pass
            return
        chunk.seen.add(name)
        rows = _rows_out(mod, out)
        per_image = rows.shape[0] // chunk.images
        if name not in kept:
            kept[name] = row_index(per_image * batch.shape[0], max_rows)
        index = kept[name]
        if index is not None:
            lo = chunk.first * per_image
            local = index[(index >= lo) & (index < lo + rows.shape[0])] - lo
            rows = rows.index_select(0, local.to(rows.device))
        found.setdefault(name, []).append(rows.detach().float())

    handles = [module.register_forward_pre_hook(h) for module, h in pre_hooks.items()]
    handles += [model.get_submodule(n).register_forward_hook(partial(hook, name=n)) for n in dict.fromkeys(names)]
    try:
        with torch.no_grad():
            for start in range(0, batch.shape[0], size):
                part = batch[start : start + size]
                chunk.first, chunk.images, chunk.seen = start, int(part.shape[0]), set()
                forward_logits(model.eval(), part)
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(rows) for name, rows in found.items()}


def run_with_pre_hooks(
    model: nn.Module, batch: torch.Tensor, hooks: dict[nn.Module, Callable[..., None]], batch_size: int = 64
) -> None:
    """Run ``model`` (eval mode, no grad) over ``batch`` in chunks with forward pre-hooks; removed after."""
    handles = [module.register_forward_pre_hook(hook) for module, hook in hooks.items()]
    try:
        with torch.no_grad():
            for part in chunks(batch, batch_size):
                forward_logits(model.eval(), part)
    finally:
        for h in handles:
            h.remove()


def input_channel_rms(model: nn.Module, batch: torch.Tensor, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Root-mean-square of every input channel of every Conv2d/Linear over ``batch``, by module name."""
    sums: dict[nn.Module, torch.Tensor] = {}
    counts: dict[nn.Module, int] = {}

    def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach().float()
        if isinstance(mod, nn.Conv2d):
            if x.ndim != 4:
                return
            sq, n = x.pow(2).sum(dim=(0, 2, 3)), x.shape[0] * x.shape[2] * x.shape[3]
        else:
            flat = x.reshape(-1, x.shape[-1])
            sq, n = flat.pow(2).sum(0), flat.shape[0]
        sums[mod] = sums.get(mod, 0) + sq.cpu()  # type: ignore[assignment]
        counts[mod] = counts.get(mod, 0) + n

    layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    run_with_pre_hooks(model, batch, dict.fromkeys(layers, hook), batch_size)
    names = {m: n for n, m in model.named_modules()}
    return {names[m]: (s / max(1, counts[m])).sqrt() for m, s in sums.items()}
