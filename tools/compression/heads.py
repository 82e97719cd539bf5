"""Attention-head pruning: the registry of head-prunable attention classes and how their heads are removed.

A ``head`` recommendation's ``layer`` is a regex matched against the name of a head-prunable attention
module *or* the names of its q/k/v/o projections (``attention`` and ``attention\\.q_proj`` select the same
modules). ``round(ratio * heads)`` heads are removed (at least one is kept), ranked by the norm of each
head's q/k/v rows and o columns (``HEAD_NORM_P``; other criteria rank randomly). Supported attention
classes are listed in ``ATTENTION_SPECS`` (Hugging Face ViT, DeiT, Swin, DINOv2 with and without registers, ViT-MSN,
I-JEPA, BEiT; timm's ``Attention`` of its ViT, DeiT and other transformers and its Swin ``WindowAttention``, whose
query, key and value share one fused ``qkv`` layer; ``torch.nn.MultiheadAttention``, once
:mod:`tools.compression.mha` has split it into q/k/v/o layers); a new family is one table entry.

A ``head_dim`` recommendation keeps every head and narrows each one instead: ``round(ratio * head_dim)``
of each head's dimensions are removed (at least one is kept), the same number in every head (the forward
reshapes Q, K and V by one ``head_dim``). Query/key dimensions (removed from q and k together) are ranked
by the product of their q and k row norms, value dimensions (removed from v and from o's inputs) by the
data-aware score of o's input channels where there is one, else by the product of their v row and o column
norms. The attention keeps its original softmax scale (``scaling``), so the remaining dimensions compute
what they computed before; a fused-``qkv`` attention (timm), whose fused kernel takes the scale from the width, has
its queries scaled by sqrt(new / old width) instead and its ``scale`` set to the new width's; classes with neither
are not narrowed. Narrowed heads lose
much more than whole heads before recovery (measured: -13 points on a CIFAR ViT at half the dimensions);
distillation (``--finetune-steps``) brings them back (-0.6 points at 69 % fewer parameters).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tools.compression.forward import check_forward, one_line, restore, snapshot
from tools.compression.importance import DATA_AWARE, HEAD_NORM_P, ChannelScores
from tools.compression.reports import AppliedPruning, SkippedPruning
from tools.schemas import PruningRecommendation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionSpec:
    """How to prune the heads of one attention class.

    ``per_head_params``: dotted parameter paths (relative to the attention module) with one slice per
    head along ``dim`` (Swin's relative-position bias table has one column per head).
    ``size_attrs``: attributes holding ``heads * head_dim`` that the forward may read.
    ``parent_per_head_params``: the same, relative to the module that holds the attention (BEiT's layer holds the
    relative position bias it passes in as the attention mask); a path that is not there (no such bias) is skipped.
    ``fused_qkv``: one Linear whose outputs hold q, k and v in that order (timm's ``qkv``), instead of q, k and v.
    ``head_dim_attr``: a module without it (timm's ``WindowAttention``) has ``o``'s inputs / heads dimensions a head.
    """

    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    heads_attr: str = "num_attention_heads"
    head_dim_attr: str = "head_dim"
    size_attrs: tuple[str, ...] = ("all_head_size",)
    per_head_params: tuple[tuple[str, int], ...] = ()
    parent_per_head_params: tuple[tuple[str, int], ...] = ()
    fused_qkv: str = ""

    @property
    def qkv_layers(self) -> tuple[str, ...]:
        """The layers that compute the queries, keys and values: ``q``, ``k``, ``v``, or the one fused layer."""
        return (self.fused_qkv,) if self.fused_qkv else (self.q, self.k, self.v)

    @property
    def projections(self) -> tuple[str, ...]:
        return (*self.qkv_layers, self.o)


def head_dim_of(module: nn.Module, spec: AttentionSpec) -> int:
    """Dimensions of each head of ``module``: its ``head_dim_attr``, else the output projection's inputs per head."""
    value = getattr(module, spec.head_dim_attr, None)
    if isinstance(value, int):
        return value
    return int(getattr(module, spec.o).in_features) // max(1, int(getattr(module, spec.heads_attr)))


_VIT_LIKE = AttentionSpec()

#: Attention class name -> how to prune its heads (transformers 5.x module layout).
ATTENTION_SPECS: dict[str, AttentionSpec] = {
    "ViTAttention": _VIT_LIKE,
    "DeiTAttention": _VIT_LIKE,
    "Dinov2Attention": _VIT_LIKE,
    "Dinov2WithRegistersAttention": _VIT_LIKE,
    "ViTMSNAttention": _VIT_LIKE,
    "IJepaAttention": _VIT_LIKE,
    "BeitAttention": AttentionSpec(
        parent_per_head_params=(("relative_position_bias.relative_position_bias_table", 1),),
    ),
    "SwinAttention": AttentionSpec(
        per_head_params=(("relative_position_bias.relative_position_bias_table", 1),),
    ),
    # timm 1.x (timm.layers.Attention: ViT, DeiT and others; its forward reshapes by num_heads, head_dim, attn_dim)
    "Attention": AttentionSpec(o="proj", heads_attr="num_heads", size_attrs=("attn_dim",), fused_qkv="qkv"),
    # timm's Swin: the relative-position bias table has a column per head; the forward reshapes by num_heads
    "WindowAttention": AttentionSpec(
        o="proj", heads_attr="num_heads", fused_qkv="qkv", per_head_params=(("relative_position_bias_table", 1),)
    ),
    # torch.nn.MultiheadAttention, split into q/k/v/o layers first (tools/compression/mha.py)
    "SplitMultiheadAttention": AttentionSpec(heads_attr="num_heads", size_attrs=("inner_dim",)),
}


#: (class, module name) of attention modules already reported as not head-prunable: said once a process.
_WARNED: set[tuple[type, str]] = set()


def attention_modules(model: nn.Module) -> dict[str, tuple[nn.Module, AttentionSpec]]:
    """Head-prunable attention modules of ``model``, by name, with their spec. A module of a known class whose
    layout differs (timm's LeViT: a BatchNorm after each projection; EfficientFormer: values wider than queries and
    keys) is left out, and said once a process with what differs."""
    found: dict[str, tuple[nn.Module, AttentionSpec]] = {}
    for name, module in model.named_modules():
        spec = ATTENTION_SPECS.get(type(module).__name__)
        if spec is None:
            continue
        problem = _unsupported(module, spec)
        if problem is None:
            found[name] = (module, spec)
        elif (type(module), name) not in _WARNED:
            _WARNED.add((type(module), name))
            logger.warning(
                "%s (%s): %s, not the layout the head kinds know for class %s; its heads are not pruned (its "
                "channels and blocks may be)",
                name, f"{type(module).__module__}.{type(module).__qualname__}", problem, type(module).__name__,
            )  # fmt: skip
    return found


def _unsupported(module: nn.Module, spec: AttentionSpec) -> str | None:
    """Why ``module`` does not have ``spec``'s layout (None when it does)."""
    odd = [p for p in spec.projections if not isinstance(getattr(module, p, None), nn.Linear)]
    if odd:
        return f"{', '.join(odd)} not nn.Linear"
    heads = getattr(module, spec.heads_attr, None)
    if not isinstance(heads, int):
        return f"no integer {spec.heads_attr}"
    return _layout_problem(module, spec, heads, head_dim_of(module, spec))


#: What attention modules call their query, key and value projections (transformers 5.x and common code).
QKV_NAMES = ("q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v", "qkv", "key_value", "kv")
#: The attributes that hold an attention module's number of heads.
HEAD_COUNT_ATTRS = ("num_attention_heads", "num_heads", "heads")


def other_attention(model: nn.Module) -> dict[str, list[nn.Linear]]:
    """Attention modules of classes :data:`ATTENTION_SPECS` has no head pruning for, found by their layout (an
    integer head count and Linear query/key/value projections), with those projections: their output channels are
    split by head, so pruning them as plain channels merges heads (ViTMSN, SegFormer, PvT, MobileViT, Swin V2)."""
    found: dict[str, list[nn.Linear]] = {}
    for name, module in model.named_modules():
        if type(module).__name__ in ATTENTION_SPECS or not any(
            isinstance(getattr(module, a, None), int) for a in HEAD_COUNT_ATTRS
        ):
            continue
        projections = [getattr(module, n) for n in QKV_NAMES if isinstance(getattr(module, n, None), nn.Linear)]
        if len(projections) >= 2 or isinstance(getattr(module, "qkv", None), nn.Linear):
            found[name] = projections
    return found


def has_attention(model: nn.Module) -> bool:
    """Whether ``model`` is of a transformer family: it contains a known, a torch or another attention module
    (:func:`other_attention`)."""
    known = any(type(m).__name__ in ATTENTION_SPECS or isinstance(m, nn.MultiheadAttention) for m in model.modules())
    return known or bool(other_attention(model))


def _head_scores(
    module: nn.Module,
    spec: AttentionSpec,
    heads: int,
    importance: str,
    gen: torch.Generator,
    scores: ChannelScores | None,
) -> Any:
    head_dim = head_dim_of(module, spec)
    if importance in DATA_AWARE:  # the output projection's scores of the head's channels
        o_proj: nn.Linear = getattr(module, spec.o)
        channel = (scores or {}).get(o_proj)
        if channel is not None and channel.numel() == o_proj.in_features:
            return channel.float().pow(2).reshape(heads, head_dim).sum(1).sqrt()
        importance = "l2"
    if importance not in HEAD_NORM_P:
        return torch.rand(heads, generator=gen)
    p = HEAD_NORM_P[importance]
    magnitude = torch.zeros(heads)
    parts = 3 if spec.fused_qkv else 1  # a fused layer's outputs: q's heads, then k's, then v's
    for proj in spec.qkv_layers:
        layer: nn.Linear = getattr(module, proj)
        w = layer.weight.detach().float().abs().pow(p).reshape(parts, heads, head_dim, -1).sum(dim=(0, 2, 3))
        magnitude += w.cpu()
        if layer.bias is not None:
            magnitude += layer.bias.detach().float().abs().pow(p).reshape(parts, heads, head_dim).sum((0, 2)).cpu()
    o: nn.Linear = getattr(module, spec.o)
    magnitude += o.weight.detach().float().abs().pow(p).reshape(-1, heads, head_dim).sum(dim=(0, 2)).cpu()
    return magnitude


def _slice_linear(layer: nn.Linear, keep: torch.Tensor, dim: int) -> None:
    keep = keep.to(layer.weight.device)
    grad = layer.weight.requires_grad
    layer.weight = nn.Parameter(layer.weight.detach().index_select(dim, keep).clone(), requires_grad=grad)
    if dim == 0:
        if layer.bias is not None:
            bias = layer.bias.detach().index_select(0, keep).clone()
            layer.bias = nn.Parameter(bias, requires_grad=layer.bias.requires_grad)
        layer.out_features = len(keep)
    else:
        layer.in_features = len(keep)


def _layout_problem(module: nn.Module, spec: AttentionSpec, heads: int, head_dim: int) -> str | None:
    """Why q/k/v/o do not hold ``heads x head_dim`` features (None when they do)."""
    for proj in spec.projections:
        layer = getattr(module, proj)
        size = layer.in_features if proj == spec.o else layer.out_features
        parts = 3 if proj == spec.fused_qkv else 1
        if size != parts * heads * head_dim:
            fused = "3 x " if parts == 3 else ""
            return f"{proj} has {size} features, not {fused}{heads} heads x {head_dim}"
    return None


def _set_sizes(module: nn.Module, spec: AttentionSpec, size: int) -> None:
    """Set the attributes holding ``heads * head_dim`` that the forward may read."""
    for attr in spec.size_attrs:
        if hasattr(module, attr):
            setattr(module, attr, size)


def kept_count(n: int, ratio: float, round_to: int | None) -> int:
    """How many of ``n`` channels or head dimensions ``ratio`` keeps: ``n - round(ratio * n)``, rounded to the
    nearest multiple of ``round_to`` (at least ``round_to``; 0 or None: not rounded), between 1 and ``n``."""
    keep = n - math.floor(ratio * n + 0.5)
    if round_to:
        keep = max(math.floor(keep / round_to + 0.5) * round_to, round_to)
    return max(1, min(n, keep))


def narrowable(module: nn.Module, spec: AttentionSpec) -> bool:
    """Whether ``module``'s heads can be narrowed: its heads have more than one dimension, and it keeps its softmax
    scale in ``scaling`` (Hugging Face: narrowing does not change it) or, with a fused ``qkv``, in ``scale`` (timm:
    its fused kernel takes the scale from the width, so the queries are scaled to keep the product, and ``scale`` is
    set for the unfused path)."""
    scale_attr = "scale" if spec.fused_qkv else "scaling"
    return isinstance(getattr(module, scale_attr, None), float) and head_dim_of(module, spec) > 1


@dataclass(frozen=True)
class HeadCut:
    """What one attention module loses: the share ``ratio`` of its heads or head dimensions, ranked by the criterion
    ``importance`` (``gen``: the random one's generator; ``scores``: the data-aware ones'), narrowed widths rounded to
    a multiple of ``round_to`` (0: any width)."""

    ratio: float
    importance: str
    gen: torch.Generator
    scores: ChannelScores | None = None
    round_to: int = 0


def prune_heads_of(
    module: nn.Module, spec: AttentionSpec, cut: HeadCut, parent: nn.Module | None = None
) -> tuple[int, int] | str:
    """Remove ``cut.ratio`` of ``module``'s whole heads (see module doc) with their per-head parameters, those of
    ``parent`` (the module holding it) too. Returns (heads before, after) or why not."""
    heads = int(getattr(module, spec.heads_attr))
    head_dim = head_dim_of(module, spec)
    n_prune = min(heads - 1, math.floor(cut.ratio * heads + 0.5))
    if n_prune <= 0:
        return f"ratio {cut.ratio} removes no head of {heads}" if heads > 1 else "has a single head"
    problem = _layout_problem(module, spec, heads, head_dim)
    if problem:
        return problem
    ranking = _head_scores(module, spec, heads, cut.importance, cut.gen, cut.scores)
    kept_heads = torch.sort(torch.argsort(ranking, descending=True, stable=True)[: heads - n_prune]).values
    keep = (kept_heads[:, None] * head_dim + torch.arange(head_dim)[None, :]).reshape(-1)
    # a fused layer keeps the same heads of each of its three parts
    keep_qkv = torch.cat([keep + part * heads * head_dim for part in range(3)]) if spec.fused_qkv else keep
    with torch.no_grad():
        for proj in spec.qkv_layers:
            _slice_linear(getattr(module, proj), keep_qkv, 0)
        _slice_linear(getattr(module, spec.o), keep, 1)
        per_head = [(module, path, dim, True) for path, dim in spec.per_head_params]
        per_head += [(parent, path, dim, False) for path, dim in spec.parent_per_head_params if parent is not None]
        for root, path, dim, required in per_head:
            owner_path, _, attr = path.rpartition(".")
            try:
                owner = root.get_submodule(owner_path) if owner_path else root
                param = getattr(owner, attr)
            except AttributeError:
                if required:
                    raise
                continue
            new = param.detach().index_select(dim, kept_heads.to(param.device)).clone()
            setattr(owner, attr, nn.Parameter(new, requires_grad=param.requires_grad))
    kept = heads - n_prune
    setattr(module, spec.heads_attr, kept)
    _set_sizes(module, spec, kept * head_dim)
    return heads, kept


def _norms(rows: tuple[torch.Tensor, torch.Tensor | None], heads: int, head_dim: int) -> torch.Tensor:
    """(heads, head_dim) norms of a projection's output rows (``rows``: its weight and bias)."""
    weight, bias = rows
    norms = weight.detach().float().reshape(heads, head_dim, -1).pow(2).sum(-1)
    if bias is not None:
        norms = norms + bias.detach().float().reshape(heads, head_dim).pow(2)
    return norms.sqrt().cpu()


def _qkv_rows(module: nn.Module, spec: AttentionSpec) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The weight and bias rows of the queries, keys and values: three layers', or three parts of the fused one."""
    if not spec.fused_qkv:
        return [(getattr(module, p).weight, getattr(module, p).bias) for p in (spec.q, spec.k, spec.v)]
    fused: nn.Linear = getattr(module, spec.fused_qkv)
    biases = fused.bias.chunk(3) if fused.bias is not None else (None, None, None)
    return list(zip(fused.weight.chunk(3), biases, strict=True))


def narrow_heads_of(module: nn.Module, spec: AttentionSpec, cut: HeadCut) -> tuple[int, int] | str:
    """Narrow every head of ``module`` (see module doc) by ``cut.ratio`` of its dimensions, to a multiple of
    ``cut.round_to`` (0: any width). Returns (head_dim before, after) or why not."""
    heads = int(getattr(module, spec.heads_attr))
    head_dim = head_dim_of(module, spec)
    if not narrowable(module, spec):
        return "its forward derives the softmax scale from head_dim, or heads have one dimension: not narrowed"
    if cut.round_to and head_dim <= cut.round_to:
        return f"heads of {head_dim} dimensions, not more than head_round_to={cut.round_to}: not narrowed"
    kept = kept_count(head_dim, cut.ratio, cut.round_to)
    if kept >= head_dim:
        multiple = f" to a multiple of {cut.round_to}" if cut.round_to else ""
        return f"ratio {cut.ratio} removes no dimension of {head_dim}{multiple}"
    problem = _layout_problem(module, spec, heads, head_dim)
    if problem:
        return problem
    q, k, v = _qkv_rows(module, spec)
    o: nn.Linear = getattr(module, spec.o)
    o_norms = o.weight.detach().float().pow(2).sum(0).sqrt().reshape(heads, head_dim).cpu()
    channel = (cut.scores or {}).get(o) if cut.importance in DATA_AWARE else None
    if cut.importance not in DATA_AWARE and cut.importance not in HEAD_NORM_P:
        qk_rank, vo_rank = (
            torch.rand(heads, head_dim, generator=cut.gen),
            torch.rand(heads, head_dim, generator=cut.gen),
        )
    else:
        qk_rank = _norms(q, heads, head_dim) * _norms(k, heads, head_dim)
        if channel is not None and channel.numel() == o.in_features:
            vo_rank = channel.float().cpu().reshape(heads, head_dim)
        else:
            vo_rank = _norms(v, heads, head_dim) * o_norms

    def keep_of(rank: torch.Tensor) -> torch.Tensor:
        best = torch.sort(torch.argsort(rank, dim=1, descending=True, stable=True)[:, :kept], dim=1).values
        return (best + torch.arange(heads)[:, None] * head_dim).reshape(-1)

    keep_qk, keep_vo = keep_of(qk_rank), keep_of(vo_rank)
    with torch.no_grad():
        if spec.fused_qkv:
            fused: nn.Linear = getattr(module, spec.fused_qkv)
            width = heads * head_dim
            _slice_linear(fused, torch.cat([keep_qk, keep_qk + width, keep_vo + 2 * width]), 0)
            # the fused kernel scales by the new width: queries scaled so that q.k keeps its old scale
            factor = math.sqrt(kept / head_dim)
            fused.weight[: heads * kept] *= factor
            if fused.bias is not None:
                fused.bias[: heads * kept] *= factor
            module.scale = kept**-0.5
        else:
            for proj, keep in ((spec.q, keep_qk), (spec.k, keep_qk), (spec.v, keep_vo)):
                _slice_linear(getattr(module, proj), keep, 0)
        _slice_linear(o, keep_vo, 1)
    setattr(module, spec.head_dim_attr, kept)
    _set_sizes(module, spec, heads * kept)
    return head_dim, kept


def head_targets(model: nn.Module, regex: re.Pattern[str]) -> list[tuple[str, nn.Module, AttentionSpec]]:
    """The attention modules ``regex`` selects, by their own name or one of their projections' names."""
    targets = []
    for name, (module, spec) in attention_modules(model).items():
        candidates = [name, *(f"{name}.{p}" for p in spec.projections)]
        if any(regex.search(c) for c in candidates):
            targets.append((name, module, spec))
    return targets


@dataclass
class PruningTally:
    """What one recommendation has pruned so far: its modules, their counts summed before and after, the layers
    whose input channels went with them, and which of its outputs each layer whose own outputs were pruned kept."""

    modules: list[str] = field(default_factory=list)
    before: int = 0
    after: int = 0
    consumers: list[str] = field(default_factory=list)
    kept_outputs: dict[str, list[bool]] = field(default_factory=dict)

    def add(self, name: str, before: int, after: int, consumers: Iterable[str]) -> None:
        """Count the module ``name``, pruned from ``before`` to ``after``, and the ``consumers`` of its outputs."""
        self.modules.append(name)
        self.before += before
        self.after += after
        self.consumers.extend(consumers)

    def applied(self, rec: PruningRecommendation) -> AppliedPruning:
        """``rec`` as applied: the tally, each consumer once."""
        return AppliedPruning(
            pattern=rec.layer,
            pruning_type=rec.pruning_type,
            ratio=rec.pruning_ratio,
            consumers=list(dict.fromkeys(self.consumers)),
            modules=self.modules,
            before=self.before,
            after=self.after,
            kept_outputs=self.kept_outputs,
        )


#: Prunes one attention module: (its name, the module, its spec, the module holding it) -> (count before, count
#: after), or why not.
HeadPruner = Callable[[str, nn.Module, AttentionSpec, nn.Module], "tuple[int, int] | str"]


def apply_heads(
    model: nn.Module,
    inputs: Any,
    num_classes: int,
    rec: PruningRecommendation,
    regex: re.Pattern[str],
    prune: HeadPruner,
) -> tuple[AppliedPruning | None, list[SkippedPruning], bool]:
    """Apply one head recommendation (``prune`` does each attention module ``regex`` selects: whole heads or their
    width, the kinds of :mod:`tools.compression.kinds`), checked by a forward pass (rolled back on failure).

    Returns (applied, skipped, changed).
    """
    skipped: list[SkippedPruning] = []
    tally = PruningTally()
    snap = snapshot(model)
    for name, module, spec in head_targets(model, regex):
        try:
            result = prune(name, module, spec, model.get_submodule(name.rpartition(".")[0]))
        except Exception as exc:
            result = f"head pruning raised {one_line(exc)}"
        if isinstance(result, str):
            skipped.append(SkippedPruning(target=name, reason=result))
            continue
        tally.add(name, *result, consumers=[f"{name}.{spec.o}"])
        logger.debug("%s %r: %s %d -> %d", rec.pruning_type, rec.layer, name, *result)
    if not tally.modules:
        return None, skipped, False
    problem = check_forward(model, inputs, num_classes)
    if problem:
        restore(snap)
        skipped.extend(SkippedPruning(target=n, reason=problem) for n in tally.modules)
        return None, skipped, True
    return tally.applied(rec), skipped, True


__all__ = [
    "ATTENTION_SPECS",
    "AttentionSpec",
    "HeadCut",
    "HeadPruner",
    "PruningTally",
    "apply_heads",
    "attention_modules",
    "has_attention",
    "head_dim_of",
    "head_targets",
    "kept_count",
    "narrow_heads_of",
    "narrowable",
    "prune_heads_of",
]
