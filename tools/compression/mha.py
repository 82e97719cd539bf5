"""``torch.nn.MultiheadAttention`` made head-prunable: the same attention with separate q, k, v and output layers.

``nn.MultiheadAttention`` cannot lose heads: its functional forward asserts ``num_heads * head_dim == embed_dim``,
its query, key and value weights are one fused ``in_proj_weight`` parameter, and its ``out_proj`` is applied inside
``F.multi_head_attention_forward``, never called as a module, so the forward hooks that data-aware importance and
least-squares recovery use never see its input. A transformer written with plain ``torch.nn``
(``nn.TransformerEncoderLayer``'s ``self_attn``, torchvision's ViT blocks) therefore only had its MLP channels pruned.

:class:`SplitMultiheadAttention` computes what ``nn.MultiheadAttention`` computes (same outputs and attention
weights to float rounding, both ``batch_first`` settings, unbatched inputs, boolean and float masks) through four
``nn.Linear`` layers, ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``: the layout of Hugging Face's attention
(:data:`tools.compression.heads.ATTENTION_SPECS` lists it), so whole heads and head widths are pruned, and ``o_proj``
refitted, as theirs are. Its inner width (``num_heads * head_dim``) may differ from ``embed_dim``, and it keeps its
softmax scale in ``scaling``, so narrowed heads compute what they computed before. It is built exactly from an
``nn.MultiheadAttention`` (:meth:`SplitMultiheadAttention.from_mha`, no random numbers drawn);
:func:`split_attention_` converts every one of a model in place (the pipeline's original, so that the layers
recovery refits exist in it too; :func:`with_split_attention` returns the model), :func:`split_selected_` those a
head pattern selects (:func:`apply_pruning
<tools.compression.pruning.apply_pruning>`). Its ``in_proj_bias`` is ``None``, so ``nn.TransformerEncoderLayer``'s
fused fast path declines ("bias=False") and the layer calls it through its ordinary path; an
``nn.TransformerEncoder`` over converted layers has ``use_nested_tensor`` off (its nested-tensor path reads the fused
weights). Without ``need_weights`` it runs ``F.scaled_dot_product_attention`` (with its own ``scale``), as
``nn.MultiheadAttention`` does; with it, matmul, softmax, matmul: standard operations that export to ONNX and convert
to OpenVINO. A saved model records the conversion as a module replacement
(:mod:`tools.artifacts.structure`), rebuilt by :meth:`SplitMultiheadAttention.from_attrs`.

Refused (:func:`conversion_problem`; such a module stays as it is, not head-prunable): ``add_bias_kv`` and
``add_zero_attn``, which append key/value rows outside the per-head layout. At run time, a 3-D ``attn_mask`` (one
mask per head) must have ``batch * num_heads`` masks for the heads the module has now: after head pruning the
original head count's masks no longer fit, and that is an error, not a guess.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from tools.compression.shortcuts import replace_module

logger = logging.getLogger(__name__)

__all__ = [
    "PROJECTIONS",
    "SplitMultiheadAttention",
    "conversion_problem",
    "from_batch_first",
    "split_attention_",
    "split_layer_names",
    "split_selected_",
    "to_batch_first",
    "with_split_attention",
]

M = TypeVar("M", bound=nn.Module)
V = TypeVar("V")

#: The projections of :class:`SplitMultiheadAttention`, as :data:`tools.compression.heads.ATTENTION_SPECS` names them.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, requires_grad: bool) -> nn.Linear:
    """An ``nn.Linear`` holding copies of ``weight`` and ``bias`` (built on the meta device: no initialisation)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=requires_grad)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=requires_grad)
    return layer


def _float_mask(mask: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """An additive mask: a boolean one's True (not attended) as -inf, a float one as it is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    if not torch.is_floating_point(mask):
        raise TypeError(f"{name} must be a boolean or float tensor, not {mask.dtype}")
    return mask.to(dtype)


class SplitMultiheadAttention(nn.Module):
    """``nn.MultiheadAttention`` with separate ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` layers (see module
    doc): ``num_heads`` heads of ``head_dim`` dimensions (``inner_dim`` = their product, not necessarily
    ``embed_dim``), queries scaled by ``scaling``, attention weights dropped out with probability ``dropout`` in
    training, as ``nn.MultiheadAttention`` does."""

    #: ``nn.TransformerEncoderLayer``'s fast path reads the fused projection's bias: None makes it decline.
    in_proj_bias: None = None

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        batch_first: bool = False,
        dropout: float = 0.0,
        scaling: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}: give head_dim")
            head_dim = embed_dim // num_heads
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.inner_dim = num_heads * head_dim
        self.bias = bias
        self.out_bias = bias if out_bias is None else out_bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.scaling = float(head_dim**-0.5 if scaling is None else scaling)
        where: dict[str, Any] = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, self.inner_dim, bias=bias, **where)
        self.k_proj = nn.Linear(self.kdim, self.inner_dim, bias=bias, **where)
        self.v_proj = nn.Linear(self.vdim, self.inner_dim, bias=bias, **where)
        self.o_proj = nn.Linear(self.inner_dim, embed_dim, bias=self.out_bias, **where)

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention) -> SplitMultiheadAttention:
        """The same attention as ``mha`` (its weights copied, its training flag and ``batch_first`` kept); raises
        ``ValueError`` for what :func:`conversion_problem` refuses."""
        problem = conversion_problem(mha)
        if problem:
            raise ValueError(f"nn.MultiheadAttention cannot be split: {problem}")
        split = cls(
            mha.embed_dim,
            mha.num_heads,
            mha.head_dim,
            kdim=mha.kdim,
            vdim=mha.vdim,
            bias=mha.in_proj_bias is not None,
            out_bias=mha.out_proj.bias is not None,
            batch_first=mha.batch_first,
            dropout=mha.dropout,
            device="meta",
        )
        if mha._qkv_same_embed_dim:
            assert mha.in_proj_weight is not None
            weights = mha.in_proj_weight.chunk(3)
            grad = mha.in_proj_weight.requires_grad
        else:
            assert mha.q_proj_weight is not None and mha.k_proj_weight is not None and mha.v_proj_weight is not None
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
            grad = mha.q_proj_weight.requires_grad
        biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None, None, None)
        for name, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases, strict=True):
            setattr(split, name, _linear(weight, bias, grad))
        out = mha.out_proj
        split.o_proj = _linear(out.weight, out.bias, out.weight.requires_grad)
        return split.train(mha.training)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], like: nn.Module | None = None) -> SplitMultiheadAttention:
        """A module of the recorded attributes (:func:`tools.artifacts.structure.describe_structure`), its weights
        zeros, on the device and in the float type of ``like`` (the module it replaces) when given."""
        reference = next(like.parameters(), None) if like is not None else None
        device = reference.device if reference is not None else torch.device("cpu")
        dtype = reference.dtype if reference is not None else None
        split = cls(
            int(attrs["embed_dim"]),
            int(attrs["num_heads"]),
            int(attrs["head_dim"]),
            kdim=int(attrs["kdim"]),
            vdim=int(attrs["vdim"]),
            bias=bool(attrs["bias"]),
            out_bias=bool(attrs["out_bias"]),
            batch_first=bool(attrs["batch_first"]),
            dropout=float(attrs["dropout"]),
            scaling=float(attrs["scaling"]),
            device="meta",
            dtype=dtype,
        ).to_empty(device=device)
        with torch.no_grad():
            for param in split.parameters():
                param.zero_()
        return split

    def _mask(
        self,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        batch: int,
        dtype: torch.dtype,
    ) -> torch.Tensor | None:
        """``attn_mask`` and ``key_padding_mask`` as one additive (batch or 1, heads or 1, L, S) mask (None: none)."""
        mask = None
        if attn_mask is not None:
            mask = _float_mask(attn_mask, dtype, "attn_mask")
            if mask.dim() == 2:
                mask = mask[None, None]
            elif mask.dim() == 3:
                if mask.shape[0] != batch * self.num_heads:
                    raise ValueError(
                        f"a 3-D attn_mask holds one mask per head and batch item: {mask.shape[0]} masks, but this "
                        f"attention has {self.num_heads} heads x batch {batch} (were heads pruned? pass a 2-D mask)"
                    )
                mask = mask.reshape(batch, self.num_heads, *mask.shape[1:])
            else:
                raise ValueError(f"attn_mask must be 2-D or 3-D, not {mask.dim()}-D")
        if key_padding_mask is not None:
            padding = _float_mask(key_padding_mask, dtype, "key_padding_mask")
            if padding.dim() != 2 or padding.shape[0] != batch:
                raise ValueError(f"key_padding_mask must be (batch, source length), not {tuple(padding.shape)}")
            padding = padding[:, None, None, :]
            mask = padding if mask is None else mask + padding
        return mask

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(attention output, attention weights or None)``, as ``nn.MultiheadAttention.forward`` returns them.

        ``is_causal`` is a hint that ``attn_mask`` is the causal mask (the mask is applied as given); as in
        ``nn.MultiheadAttention``, it needs ``attn_mask``.
        """
        if query.is_nested or key.is_nested or value.is_nested:
            raise ValueError("SplitMultiheadAttention does not take nested tensors")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint")
        batched = query.dim() == 3
        query, key, value = (to_batch_first(x, batched, self.batch_first) for x in (query, key, value))
        if not batched:  # unbatched (L, E): one batch item
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        batch, target, source = query.shape[0], query.shape[1], key.shape[1]
        mask = self._mask(attn_mask, key_padding_mask, batch, query.dtype)
        q = self.q_proj(query).reshape(batch, target, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(key).reshape(batch, source, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(value).reshape(batch, source, self.num_heads, self.head_dim).transpose(1, 2)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = torch.matmul(q * self.scaling, k.transpose(-2, -1))
            if mask is not None:
                scores = scores + mask
            weights = scores.softmax(dim=-1)
            if dropout > 0.0:
                weights = F.dropout(weights, p=dropout)
            attended = torch.matmul(weights, v)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scaling)
        out = self.o_proj(attended.transpose(1, 2).reshape(batch, target, self.inner_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        out = from_batch_first(out, batched, self.batch_first)
        if weights is not None and not batched:
            weights = weights.squeeze(0)
        return out, weights

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"batch_first={self.batch_first}"
        )


def to_batch_first(x: torch.Tensor, batched: bool, batch_first: bool) -> torch.Tensor:
    """An ``nn.MultiheadAttention`` input as (batch, length, features): an unbatched (length, features) one as a batch
    of one, a batched one of ``batch_first`` False transposed."""
    if not batched:
        return x.unsqueeze(0)
    return x if batch_first else x.transpose(0, 1)


def from_batch_first(x: torch.Tensor, batched: bool, batch_first: bool) -> torch.Tensor:
    """A (batch, length, features) output in the layout of the input it answers (:func:`to_batch_first` undone)."""
    if not batched:
        return x.squeeze(0)
    return x if batch_first else x.transpose(0, 1)


def conversion_problem(mha: nn.MultiheadAttention) -> str | None:
    """Why ``mha`` cannot be converted to :class:`SplitMultiheadAttention` (None: it can)."""
    if mha.bias_k is not None or mha.bias_v is not None:
        return "add_bias_kv appends a learned key/value row outside the per-head layout"
    if mha.add_zero_attn:
        return "add_zero_attn appends a zero key/value row"
    return None


def _convert(model: nn.Module, names: Iterable[str]) -> list[str]:
    converted = []
    for name in names:
        module = model.get_submodule(name)
        if not isinstance(module, nn.MultiheadAttention):
            continue
        problem = conversion_problem(module)
        if problem:
            logger.warning("%s (nn.MultiheadAttention) keeps its heads: %s", name, problem)
            continue
        replace_module(model, name, SplitMultiheadAttention.from_mha(module))
        converted.append(name)
    for module in model.modules():  # its nested-tensor path reads the fused weights the layers no longer have
        layers = getattr(module, "layers", None)
        if (
            isinstance(module, nn.TransformerEncoder)
            and isinstance(layers, nn.ModuleList)
            and any(isinstance(getattr(layer, "self_attn", None), SplitMultiheadAttention) for layer in layers)
        ):
            module.use_nested_tensor = False
    return converted


def _mha_names(model: nn.Module) -> list[str]:
    """Names of the ``nn.MultiheadAttention`` modules of ``model`` (the model itself excluded)."""
    return [name for name, module in model.named_modules() if name and isinstance(module, nn.MultiheadAttention)]


def split_attention_(model: nn.Module) -> list[str]:
    """Convert every ``nn.MultiheadAttention`` of ``model`` to an equal :class:`SplitMultiheadAttention` (IN PLACE;
    a module :func:`conversion_problem` refuses is left as it is, with a warning). Returns the names converted."""
    converted = _convert(model, _mha_names(model))
    if converted:
        logger.info("%d nn.MultiheadAttention modules split into q/k/v/o layers", len(converted))
    return converted


def with_split_attention(model: M) -> M:
    """``model`` after :func:`split_attention_` (for a caller that loads and converts in one expression)."""
    split_attention_(model)
    return model


def split_selected_(model: nn.Module, patterns: Iterable[re.Pattern[str]]) -> list[str]:
    """Convert (IN PLACE) the ``nn.MultiheadAttention`` modules that one of ``patterns`` (head or head_dim
    recommendations' layer regexes) selects, by the module's name or by the name one of its projections will have
    (``self_attn`` and ``self_attn\\.q_proj`` select the same module, as for the other attention classes)."""
    regexes = list(patterns)
    selected = [
        name
        for name in _mha_names(model)
        if any(r.search(c) for r in regexes for c in (name, *(f"{name}.{p}" for p in PROJECTIONS)))
    ]
    return _convert(model, selected)


def split_layer_names(layers: Mapping[str, V], model: nn.Module) -> dict[str, V]:
    """``layers`` (a selection of ``model``'s layers by name: a quantization plan's layer -> dtype) named as in
    ``model`` after :func:`split_attention_`: each convertible ``nn.MultiheadAttention``'s ``out_proj`` becomes its
    ``o_proj``, and its in-projection (one fused parameter, no layer of its own until split, so a plan of ``model``
    cannot name it) is selected with the ``out_proj``'s value as ``q_proj``, ``k_proj`` and ``v_proj``."""
    renamed = dict(layers)
    for name, module in model.named_modules():
        if (
            isinstance(module, nn.MultiheadAttention)
            and not conversion_problem(module)
            and f"{name}.out_proj" in renamed
        ):
            value = renamed.pop(f"{name}.out_proj")
            renamed.update({f"{name}.{projection}": value for projection in PROJECTIONS})
    return renamed
