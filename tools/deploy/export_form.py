"""Export-time rewrites: modules given a form that exports to fewer, cheaper runtime operations, same outputs.

:func:`export_form` returns a copy of a model whose rewritable modules (:data:`REWRITES`, by class name) are
replaced, checked against the model's logits on the example input; ONNX export and OpenVINO conversion run on
it. Where nothing is rewritable, or the copy's logits differ (a version of the class that computes something else),
the model itself is exported, as before.

Swin's shifted-window layers (:class:`GatheredSwinLayer`): at a fixed resolution, the cyclic shift (``roll``) and
the window partition are one permutation of the tokens, and the window reverse and the shift back its inverse:
each becomes one ``Gather`` of precomputed indices (none where the permutation is the identity: a stage as small
as its window) instead of a ``Roll`` and reshapes and transposes, and the shifted-window attention mask a
constant. Measured on ``cifar10-swin-tiny`` (32 px; OpenVINO FP32, batch 1, one thread of a Xeon): 1.26 -> 1.15 ms
for a 48 % pruned model, 1.45 -> 1.37 ms for the original.

:func:`plain_export` turns the rewrites off for a block: what a user gets from the runtimes' own one-command
conversion of a model (the baselines the deployed model is compared with).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tools.compression.forward import forward_logits
from tools.models.base import clone_module
from tools.text import first_line

logger = logging.getLogger(__name__)

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("export_rewrites", default=True)


@contextmanager
def plain_export() -> Iterator[None]:
    """Export and convert models as they are inside this block (no :data:`REWRITES`)."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _window_partition(features: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * windows, window, window, C), windows in row-major order (as Swin's)."""
    b, h, w, c = features.shape
    features = features.view(b, h // window, window, w // window, window, c)
    return features.transpose(2, 3).reshape(-1, window, window, c)


class GatheredSwinLayer(nn.Module):
    """A Hugging Face ``SwinLayer`` at a fixed ``(height, width)`` whose shift and window partition are one gather.

    Holds the layer's own submodules under their own names (the weights are shared, and every module keeps its path,
    which int8 layer selection and reports go by) and computes its forward: LayerNorm, shifted-window attention
    with its mask, residual, LayerNorm, MLP, residual.
    """

    def __init__(self, layer: Any, height: int, width: int) -> None:
        super().__init__()
        layer.set_shift_and_window_size((height, width))
        window, shift = int(layer.window_size), int(layer.shift_size)
        if height % window or width % window:
            raise ValueError(f"{height}x{width} tokens are not whole {window}x{window} windows (padding)")
        for name, child in layer.named_children():
            self.add_module(name, child)
        self.window = window
        index = torch.arange(height * width, dtype=torch.float64).view(1, height, width, 1)
        if shift > 0:
            index = torch.roll(index, shifts=(-shift, -shift), dims=(1, 2))
        order = _window_partition(index, window).reshape(-1).long()
        self.identity = bool(torch.equal(order, torch.arange(height * width)))
        self.register_buffer("order", order, persistent=False)
        self.register_buffer("inverse", torch.argsort(order), persistent=False)
        mask = layer.get_attn_mask(height, width, dtype=torch.float32, device=torch.device("cpu"))
        self.masked = mask is not None
        self.register_buffer("mask", mask if mask is not None else torch.zeros(0), persistent=False)

    def forward(
        self, hidden_states: torch.Tensor, input_dimensions: Any = None, always_partition: bool = False, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        parts: Any = self._modules
        batch, tokens, channels = hidden_states.shape
        normed = parts["layernorm_before"](hidden_states)
        windows = normed if self.identity else normed[:, self.order]
        windows = windows.reshape(-1, self.window * self.window, channels)
        mask = self.mask.to(hidden_states.dtype) if self.masked else None
        attention, weights = parts["attention"](windows, mask, **kwargs)
        attention = parts["dropout"](attention).reshape(batch, tokens, channels)
        if not self.identity:
            attention = attention[:, self.inverse]
        hidden_states = hidden_states + parts["drop_path"](attention)
        mlp = parts["mlp"](parts["layernorm_after"](hidden_states))
        return parts["dropout"](mlp) + hidden_states, weights


def _gathered_swin_layer(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> nn.Module | None:
    dims = args[1] if len(args) > 1 else kwargs.get("input_dimensions")
    always_partition = args[2] if len(args) > 2 else kwargs.get("always_partition", False)
    if always_partition or dims is None:
        return None
    height, width = (int(d) for d in dims)
    try:
        return GatheredSwinLayer(layer, height, width)
    except (ValueError, AttributeError, TypeError) as exc:
        logger.debug("SwinLayer left as it is: %s", first_line(exc))
        return None


def _global_average(pool: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> nn.Module | None:
    """An average pooling whose window covers its whole input, as a global average: Hugging Face's EfficientNet
    pools with a kernel of its channel count (1,280 for B0 on a 7x7 map) and ``ceil_mode``, which PyTorch averages
    over the input and OpenVINO refuses ("Kernel after dilation has size ... larger than the data shape"): no HF
    EfficientNet converted (a sweep over unseen architectures)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    kernel, padding = (tuple(v) if isinstance(v, tuple | list) else (v, v) for v in (pool.kernel_size, pool.padding))
    if any(padding) or kernel[0] < x.shape[-2] or kernel[1] < x.shape[-1]:
        return None
    return nn.AdaptiveAvgPool2d(1)


def _pool_matrix(size: int, out: int) -> torch.Tensor:
    """``(out, size)``: row ``i`` averages the bins adaptive pooling averages, ``floor(i*size/out)`` up to
    ``ceil((i+1)*size/out)`` (overlapping, or repeated where ``out > size``)."""
    matrix = torch.zeros(out, size)
    for i in range(out):
        start, end = (i * size) // out, -(-(i + 1) * size // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


class MatrixAdaptiveAvgPool(nn.Module):
    """Adaptive average pooling of a fixed input size as two products with constant matrices: the same output, in
    ops every runtime has (``MatMul``)."""

    rows: torch.Tensor
    cols: torch.Tensor

    def __init__(self, size: tuple[int, int], out: tuple[int, int]) -> None:
        super().__init__()
        self.register_buffer("rows", _pool_matrix(size[0], out[0]))
        self.register_buffer("cols", _pool_matrix(size[1], out[1]).T.contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.rows, torch.matmul(x, self.cols))


def _adaptive_average(pool: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> nn.Module | None:
    """An adaptive average pooling whose output size does not divide its input's, as constant matrix products:
    the ONNX exporter refuses it ("output size that are not factor of input size"), so torchvision's VGG and AlexNet
    (``AdaptiveAvgPool2d((7, 7))``) below 224 px had no ONNX Runtime candidate (a sweep over unseen architectures)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    size = (int(x.shape[-2]), int(x.shape[-1]))
    output_size: Any = pool.output_size
    wanted = tuple(output_size) if isinstance(output_size, tuple | list) else (output_size,) * 2
    out = tuple(size[i] if wanted[i] is None else int(wanted[i]) for i in range(2))
    if all(s % o == 0 for s, o in zip(size, out, strict=True)):
        return None  # exported as a plain pooling
    return MatrixAdaptiveAvgPool(size, (out[0], out[1]))


#: Rewritable modules by class name: a factory given the module and the positional and keyword arguments of its
#: call on the example input, returning its replacement (None: left as it is).
REWRITES: dict[str, Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], nn.Module | None]] = {
    "SwinLayer": _gathered_swin_layer,
    "AvgPool2d": _global_average,
    "AdaptiveAvgPool2d": _adaptive_average,
}


#: Bumped whenever a rewrite changes what it exports, so artifacts built with another form are rebuilt.
EXPORT_FORM_VERSION = 1


def export_form_key() -> str:
    """What decides the exported form in effect (part of a quantized artifact's recipe hash): ``plain`` inside
    :func:`plain_export`, else the rewrites and their version."""
    if not _ENABLED.get():
        return "plain"
    return f"v{EXPORT_FORM_VERSION}:" + ",".join(sorted(REWRITES))


def _calls(
    model: nn.Module, names: list[str], example: torch.Tensor
) -> tuple[dict[str, tuple[tuple[Any, ...], Any]], torch.Tensor]:
    """The arguments each named module is called with on ``example`` (its first call), and the model's logits."""
    modules = dict(model.named_modules())
    calls: dict[str, tuple[tuple[Any, ...], Any]] = {}

    def keep(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            calls.setdefault(name, (args, kwargs))

        return hook

    handles = [modules[n].register_forward_pre_hook(keep(n), with_kwargs=True) for n in names]
    try:
        with torch.no_grad():
            logits = forward_logits(model, example).float()
    finally:
        for handle in handles:
            handle.remove()
    return calls, logits


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def export_form(model: nn.Module, example_input: torch.Tensor, *, atol: float = 1e-4) -> nn.Module:
    """A copy of ``model`` (in eval mode on the CPU, as it is exported) with its :data:`REWRITES` applied, or
    ``model`` itself where there is none, rewrites are off (:func:`plain_export`), or the copy's logits on
    ``example_input`` differ by more than ``atol`` (relative to their largest magnitude)."""
    names = [n for n, m in model.named_modules() if type(m).__name__ in REWRITES and n]
    if not names or not _ENABLED.get():
        return model
    example = example_input[:1].detach().cpu().float()
    try:
        rewritten = clone_module(model).eval()
        calls, expected = _calls(rewritten, names, example)  # the copy, before any rewrite: the model's logits
        modules = dict(rewritten.named_modules())
        kinds: list[str] = []
        for name in names:
            kind = type(modules[name]).__name__
            replacement = REWRITES[kind](modules[name], *calls[name]) if name in calls else None
            if replacement is not None:
                _replace(rewritten, name, replacement)
                kinds.append(kind)
        if not kinds:
            return model
        with torch.no_grad():
            got = forward_logits(rewritten, example).float()
        error = float((got - expected).abs().max()) / max(1.0, float(expected.abs().max()))
    except Exception as exc:  # a rewrite must never cost the export
        logger.warning("export rewrites skipped for %s: %s", type(model).__name__, first_line(exc))
        return model
    if error > atol:
        logger.warning(
            "export rewrites skipped for %s: the rewritten logits differ by %.2g (> %.0g)",
            type(model).__name__,
            error,
            atol,
        )
        return model
    logger.info("export form: %d module(s) rewritten (%s)", len(kinds), ", ".join(sorted(set(kinds))))
    return rewritten


__all__ = [
    "EXPORT_FORM_VERSION",
    "REWRITES",
    "GatheredSwinLayer",
    "MatrixAdaptiveAvgPool",
    "export_form",
    "export_form_key",
    "plain_export",
]
