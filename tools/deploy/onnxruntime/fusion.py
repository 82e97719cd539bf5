"""Attention fusion for ONNX Runtime: each ViT-style self-attention exported as one ``com.microsoft::Attention``.

A Hugging Face ViT attention block exports as three Q/K/V MatMuls plus a dozen Reshape, Transpose,
MatMul, Mul and Softmax nodes per layer; on small models ONNX Runtime's per-node overhead costs as much as
the arithmetic, and its transformer optimizer does not recognise the pattern the current exporter writes.
:func:`fuse_attention` returns a copy of the model whose attention modules (by class, :data:`FUSABLE`)
compute the same thing through :class:`PackedAttention`: Q, K and V packed into one ``(in, 3 x hidden)``
weight, exported as ONNX Runtime's contrib ``Attention`` operator, which ``quantize_dynamic`` turns into
``QAttention`` (int8 Q/K/V projection inside the fused kernel). The output projection stays an ``nn.Linear``.

Pruned heads are fine (the head count is read from the projection's width); anything that would change the
result (an attention mask, relative position bias, a class not in :data:`FUSABLE`) is not fused.
:func:`fuse_attention` checks the fused copy against the original on an example input and refuses a copy
whose outputs differ.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from tools.compression.mha import from_batch_first, to_batch_first

logger = logging.getLogger(__name__)

__all__ = [
    "FUSABLE",
    "AttentionFusionError",
    "NothingToFuse",
    "PackedAttention",
    "PackedMultiheadAttention",
    "fuse_attention",
]


class AttentionFusionError(RuntimeError):
    """The model has no attention this module can fuse, or the fused copy does not compute the same outputs."""


class NothingToFuse(AttentionFusionError):
    """The model has no attention module this fusion knows (a CNN): the fused backend does not apply."""


class _PackedAttentionFunction(torch.autograd.Function):
    """Eager: the reference computation; ONNX (TorchScript exporter): one ``com.microsoft::Attention`` node."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: int, scale: float
    ) -> torch.Tensor:
        return _reference_attention(x, weight, bias, heads, scale)

    @staticmethod
    def symbolic(g: Any, x: Any, weight: Any, bias: Any, heads: int, scale: float) -> Any:
        out = g.op("com.microsoft::Attention", x, weight, bias, num_heads_i=heads, scale_f=scale)
        return _typed(out, x, hidden=_dim(weight, 1, 3))


def _dim(value: Any, axis: int, divide: int) -> int | None:
    """A static size of an exported value (its axis ``axis`` divided by ``divide``), None when unknown."""
    try:
        size = value.type().varyingSizes()[axis]
    except Exception:  # no complete type: the exporter infers it later
        return None
    return None if size is None else int(size) // divide


def _typed(out: Any, like: Any, hidden: int | None) -> Any:
    """Give a contrib node's output the input's type with ``hidden`` as its last size, so that the exporter's shape
    inference (which knows no contrib operator) need not guess, and does not warn."""
    try:
        sizes = list(like.type().varyingSizes())
        out.setType(like.type().with_sizes([*sizes[:-1], hidden]))
    except Exception:  # an incomplete type: leave the output untyped
        pass
    return out


def _reference_attention(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: int, scale: float
) -> torch.Tensor:
    batch, tokens, _ = x.shape
    qkv = x @ weight + bias
    hidden = qkv.shape[-1] // 3
    head_dim = hidden // heads
    q, k, v = (t.reshape(batch, tokens, heads, head_dim).transpose(1, 2) for t in qkv.split(hidden, -1))
    scores = (q @ k.transpose(-1, -2)) * scale
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, hidden)


class _BiasedAttentionFunction(torch.autograd.Function):
    """Softmax(Q K^T / sqrt(head_dim) + bias) V on already projected Q, K, V ``(batch, tokens, hidden)``, with an
    additive bias ``(batch or 1, heads, tokens, tokens)`` (Swin's relative position bias and shifted-window
    mask). ONNX: one ``com.microsoft::MultiHeadAttention`` node (its ``attention_bias`` input); the Q/K/V
    projections stay MatMuls, which dynamic int8 quantizes as usual (``QAttention`` has no bias input)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        heads: int,
        attention_bias: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        batch, tokens, hidden = q.shape
        head_dim = hidden // heads
        q_, k_, v_ = (t.reshape(batch, tokens, heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q_ @ k_.transpose(-1, -2)) * scale + attention_bias
        return (torch.softmax(scores, dim=-1) @ v_).transpose(1, 2).reshape(batch, tokens, hidden)

    @staticmethod
    def symbolic(g: Any, q: Any, k: Any, v: Any, heads: int, attention_bias: Any, scale: float) -> Any:
        from torch.onnx import symbolic_helper

        missing = symbolic_helper._optional_input_placeholder_tensor(g)
        out = g.op(
            "com.microsoft::MultiHeadAttention",
            *(q, k, v, missing, missing, attention_bias),
            num_heads_i=heads,
            scale_f=scale,
        )
        return _typed(out, q, hidden=_dim(q, 2, 1))


class PackedAttention(nn.Module):
    """A ViT-style attention as one fused node: Q, K and V packed into one weight ``(in, 3 x heads x head_dim)``
    (``Attention``); with a relative position bias (Swin) the projections stay and the core is fused
    (``MultiHeadAttention``)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        q, k, v, o = (_linear(attention, part) for part in ("q_proj", "k_proj", "v_proj", "o_proj"))
        head_dim = int(getattr(attention, "head_dim"))  # noqa: B009 (an int attribute, not a submodule)
        self.heads = q.out_features // head_dim
        #: The softmax scale: the attention's own (narrowed heads keep their original scale), else 1/sqrt(head_dim).
        self.scale = float(getattr(attention, "scaling", head_dim**-0.5))
        self.o_proj = o
        #: Swin: the module that gives the (1, heads, tokens, tokens) relative position bias; None for ViT.
        self.relative_position_bias: nn.Module | None = getattr(attention, "relative_position_bias", None)
        self.qkv_weight: nn.Parameter | None = None
        self.qkv_bias: nn.Parameter | None = None
        self.q_proj: nn.Linear | None = None
        self.k_proj: nn.Linear | None = None
        self.v_proj: nn.Linear | None = None
        if self.relative_position_bias is not None:
            self.q_proj, self.k_proj, self.v_proj = q, k, v
            return
        weights: list[torch.Tensor] = [q.weight, k.weight, v.weight]
        self.qkv_weight = nn.Parameter(torch.cat(weights, 0).t().contiguous())
        biases: list[torch.Tensor] = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in (q, k, v)]
        self.qkv_bias = nn.Parameter(torch.cat(biases, 0).detach().clone())

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, None]:
        if self.relative_position_bias is None:
            # an image has no padding: traced for export, transformers 5.17 builds an all-attend mask anyway (its
            # SDPA mask is not skipped while tracing; 5.18 skips it), which changes nothing; eagerly, a mask is refused
            if attention_mask is not None and not (torch.jit.is_tracing() or torch.compiler.is_compiling()):
                raise AttentionFusionError("a fused ViT attention takes no attention mask")
            fused = _PackedAttentionFunction.apply(
                hidden_states, self.qkv_weight, self.qkv_bias, self.heads, self.scale
            )
            return self.o_proj(fused), None  # type: ignore[operator]
        scores_bias = self.relative_position_bias()  # (1, heads, tokens, tokens)
        if attention_mask is not None:  # Swin's shifted windows: (windows, tokens, tokens), batch x windows rows
            windows, tokens = attention_mask.shape[0], hidden_states.shape[1]
            mask = attention_mask.unsqueeze(1).unsqueeze(0).expand(hidden_states.shape[0] // windows, -1, -1, -1, -1)
            scores_bias = scores_bias + mask.reshape(-1, 1, tokens, tokens)
        q, k, v = (proj(hidden_states) for proj in (self.q_proj, self.k_proj, self.v_proj))  # type: ignore[misc]
        bias = scores_bias.expand(-1, self.heads, -1, -1)
        fused = _BiasedAttentionFunction.apply(q, k, v, self.heads, bias, self.scale)
        return self.o_proj(fused), None  # type: ignore[operator]


class PackedMultiheadAttention(PackedAttention):
    """``torch.nn``'s attention as the tool splits it (:class:`~tools.compression.mha.SplitMultiheadAttention`, the
    form a model's ``nn.MultiheadAttention`` takes in the pipeline) packed into one ``Attention`` node, called as
    ``nn.MultiheadAttention`` is: ``(query, key, value, ...) -> (output, None)``. It fuses self-attention without
    masks, what a vision transformer's encoder layers compute; cross-attention or a mask is refused with
    :class:`AttentionFusionError` (so :func:`fuse_attention`'s check refuses the copy). No attention weights are
    returned."""

    #: ``nn.TransformerEncoderLayer``'s fast path reads the fused projection's bias: None makes it decline, so the
    #: layer calls this module through its ordinary path (as it calls the split attention).
    in_proj_bias: None = None

    def __init__(self, attention: nn.Module) -> None:
        super().__init__(attention)
        self.batch_first = bool(getattr(attention, "batch_first", False))
        self.num_heads = self.heads
        self.embed_dim = int(getattr(attention, "embed_dim"))  # noqa: B009 (an int attribute, not a submodule)

    def forward(  # type: ignore[override]  # nn.MultiheadAttention's call, not a Hugging Face attention's
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if key is not query or value is not query:
            raise AttentionFusionError("a fused nn.MultiheadAttention computes self-attention only")
        if key_padding_mask is not None or attn_mask is not None:
            raise AttentionFusionError("a fused nn.MultiheadAttention takes no attention mask")
        batched = query.dim() == 3  # unbatched: (tokens, embed_dim) whatever batch_first says
        out, _ = super().forward(to_batch_first(query, batched, self.batch_first))
        return from_batch_first(out, batched, self.batch_first), None


#: Attention classes (by name) whose forward is softmax(Q K^T / sqrt(head_dim) [+ relative position bias +
#: shifted-window mask, Swin]) V over q_proj/k_proj/v_proj, then o_proj; and the fused module that replaces each.
FUSABLE: dict[str, type[PackedAttention]] = {
    "ViTAttention": PackedAttention,
    "DeiTAttention": PackedAttention,
    "Dinov2Attention": PackedAttention,
    "Dinov2WithRegistersAttention": PackedAttention,
    "ViTMSNAttention": PackedAttention,
    "IJepaAttention": PackedAttention,
    "SwinAttention": PackedAttention,
    "SplitMultiheadAttention": PackedMultiheadAttention,
}


def _linear(module: nn.Module, name: str) -> nn.Linear:
    child = getattr(module, name, None)
    if not isinstance(child, nn.Linear):
        raise AttentionFusionError(f"{type(module).__name__}.{name} is not an nn.Linear")
    return child


def _fusable(module: nn.Module) -> bool:
    if type(module).__name__ not in FUSABLE:
        return False
    try:
        q, k, v, _ = (_linear(module, part) for part in ("q_proj", "k_proj", "v_proj", "o_proj"))
    except AttentionFusionError:
        return False
    head_dim = getattr(module, "head_dim", None)
    return (
        isinstance(head_dim, int)
        and q.out_features == k.out_features == v.out_features
        and q.in_features == k.in_features == v.in_features  # self-attention: one input packs (not kdim, vdim)
        and q.out_features % head_dim == 0
    )


def fuse_attention(model: nn.Module, example_input: torch.Tensor, *, atol: float = 1e-4) -> tuple[nn.Module, int]:
    """A copy of ``model`` (eval, CPU, float32) with every fusable attention packed; and how many were fused. Its
    ``nn.MultiheadAttention`` modules are split first (:func:`~tools.compression.mha.split_attention_`, exact), as the
    pipeline splits a pruned model's.

    Raises :class:`AttentionFusionError` when nothing can be fused, or when the copy's logits on
    ``example_input`` differ from the original's by more than ``atol`` (relative to their scale).
    """
    from tools.compression.mha import split_attention_
    from tools.models.base import LogitsOnly, clone_module

    fused = clone_module(model).cpu().float().eval()
    split_attention_(fused)  # a model's own nn.MultiheadAttention (the original, unpruned) in the form that packs
    count = 0
    for parent in list(fused.modules()):
        for name, child in list(parent.named_children()):
            if _fusable(child):
                setattr(parent, name, FUSABLE[type(child).__name__](child))
                count += 1
    if count == 0:
        raise NothingToFuse(
            f"{type(model).__name__} has no attention module that can be fused (fusable: {', '.join(sorted(FUSABLE))})"
        )
    x = example_input.detach().cpu().float()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    with torch.no_grad():
        reference = LogitsOnly(model.eval())(x.to(device)).float().cpu()
        model.train(was_training)
        try:
            output = LogitsOnly(fused)(x)
        except AttentionFusionError:
            raise
        except Exception as exc:  # the model calls its attention in a way the fused module does not serve
            raise AttentionFusionError(f"the fused copy does not run ({type(exc).__name__}: {exc}): not fused") from exc
    scale = float(reference.abs().max()) or 1.0
    error = float((output - reference).abs().max())
    if error > atol * max(scale, 1.0):
        raise AttentionFusionError(f"the fused attention changes the outputs (max difference {error:.2e}): not fused")
    logger.info("fused %d attention module(s) of %s", count, type(model).__name__)
    return fused, count
