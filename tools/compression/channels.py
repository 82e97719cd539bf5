"""Structured channel pruning through Torch-Pruning's ``DependencyGraph``.

A ``structured`` recommendation's ``layer`` is a regex matched (``re.search``) against the names of
``nn.Conv2d`` / ``nn.Linear`` modules. For each match, ``pruning_ratio`` of *that module's* output channels
is removed with its whole coupled group (BatchNorm, the next layers' input channels, residual adds, ...),
ranked by a group importance from :data:`tools.compression.importance.IMPORTANCE`. A coupled group is pruned
at most once per ``apply_pruning`` call (``claimed``): the first matched module in forward order prunes it.

:class:`PruningContext` holds the traced graph and what may not be pruned (the classifier, layers fed by the
model input, q/k/v projections and head dimensions, transformer residual streams); :func:`channel_issue`
says why a layer is blocked, :func:`apply_structured` applies one recommendation.
"""

from __future__ import annotations

import collections
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch_pruning as tp
from torch import nn

from tools.compression.forward import check_forward, forward_logits, one_line, restore, snapshot
from tools.compression.heads import PruningTally, attention_modules, has_attention, kept_count, other_attention
from tools.compression.reports import AppliedPruning, SkippedPruning
from tools.compression.shortcuts import SelectionConv
from tools.schemas import PruningRecommendation

logger = logging.getLogger(__name__)

_PRUNABLE_TYPES = (nn.Conv2d, nn.Linear)


def _input_tensors(inputs: Any) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    values: Iterable[Any] = inputs.values() if isinstance(inputs, Mapping) else inputs
    return [v for v in values if isinstance(v, torch.Tensor)]


@contextmanager
def _grad_tracing(model: nn.Module) -> Iterator[None]:
    """Autograd on and every parameter requiring grad, as Torch-Pruning's tracer needs; restored after."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


# --------------------------------------------------------------------------------------------------
# Analysis: dependency graph, output heads, input layers
# --------------------------------------------------------------------------------------------------


@dataclass
class PruningContext:
    """A model being pruned, its example inputs, and its traced dependency graph (``dg``; None: stale)."""

    model: nn.Module
    inputs: Any
    num_classes: int
    dg: Any = None
    names: dict[nn.Module, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    output_heads: set[nn.Module] = field(default_factory=set)
    input_layers: set[nn.Module] = field(default_factory=set)
    qkv: dict[nn.Module, str] = field(default_factory=dict)
    head_dims: dict[nn.Module, str] = field(default_factory=dict)
    headless: dict[str, list[nn.Linear]] = field(default_factory=dict)
    transformer: bool = False

    def rebuild(self) -> None:
        """(Re)trace the model with one forward pass: call after any change made outside the graph."""
        model, inputs = self.model, self.inputs
        self.names = {m: n for n, m in model.named_modules()}
        order: list[str] = []
        input_layers: set[nn.Module] = set()
        raw = {id(t) for t in _input_tensors(inputs)}
        captured: list[torch.Tensor] = []

        def hook(module: nn.Module, args: tuple[Any, ...], _out: Any) -> None:
            order.append(self.names[module])
            if any(isinstance(a, torch.Tensor) and id(a) in raw for a in args):
                input_layers.add(module)

        def forward(m: nn.Module, x: Any) -> torch.Tensor:
            out = forward_logits(m, x)
            captured.append(out)
            return out

        handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, _PRUNABLE_TYPES)]
        try:
            with _grad_tracing(model):
                self.dg = tp.DependencyGraph().build_dependency(
                    model, example_inputs=inputs, forward_fn=forward, verbose=False
                )
        finally:
            for h in handles:
                h.remove()
        if self.num_classes < 0:
            self.num_classes = int(captured[0].shape[-1])
        self.order = list(dict.fromkeys(order))
        self.input_layers = input_layers
        self.output_heads = _find_output_heads(model, self.dg)

        self.qkv, self.head_dims = {}, {}
        for name, (module, spec) in attention_modules(model).items():
            for proj in spec.qkv_layers:
                self.qkv[getattr(module, proj)] = name
                self.head_dims[getattr(module, proj)] = name
            self.head_dims[getattr(module, spec.o)] = name
        self.headless = other_attention(model)  # attention without head pruning: its q/k/v are blocked
        for name, projections in self.headless.items():
            self.qkv.update(dict.fromkeys(projections, name))
        self.transformer = has_attention(model)

    def ensure_graph(self) -> None:
        if self.dg is None:
            self.rebuild()


def _find_output_heads(model: nn.Module, dg: Any) -> set[nn.Module]:
    """Conv2d/Linear modules whose outputs reach the logits without crossing another Conv2d/Linear."""
    heads: set[nn.Module] = set()
    for module, node in dg.module2node.items():
        if not isinstance(module, _PRUNABLE_TYPES):
            continue
        stack, seen = [node], {id(node)}
        while stack:
            current = stack.pop()
            if not current.outputs:  # a sink of the traced graph: the logits
                heads.add(module)
                break
            for nxt in current.outputs:
                if id(nxt) in seen or isinstance(nxt.module, _PRUNABLE_TYPES):
                    continue
                seen.add(id(nxt))
                stack.append(nxt)
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        try:
            emb = get_out()
        except Exception:
            emb = None
        if isinstance(emb, nn.Module):
            heads.add(emb)
    return heads


def new_context(model: nn.Module, inputs: Any, *, graph: bool = True) -> PruningContext:
    """Context with the number of classes; traced now when ``graph``, else on ``ensure_graph``."""
    model.eval()
    if graph:
        ctx = PruningContext(model=model, inputs=inputs, num_classes=-1)
        ctx.rebuild()
        return ctx
    with torch.no_grad():
        num_classes = int(forward_logits(model, inputs).shape[-1])
    return PruningContext(model=model, inputs=inputs, num_classes=num_classes)


def _out_fn(module: nn.Module) -> Callable[..., Any]:
    return tp.prune_conv_out_channels if isinstance(module, nn.Conv2d) else tp.prune_linear_out_channels


def _out_channels(module: nn.Module) -> int:
    if isinstance(module, nn.Conv2d):
        return module.out_channels
    if isinstance(module, nn.Linear):
        return module.out_features
    raise TypeError(f"not a Conv2d/Linear: {type(module).__name__}")


def _static_issue(ctx: PruningContext, module: nn.Module) -> str | None:
    """Why ``module``'s output channels may not be pruned, judged on the module alone."""
    if module in ctx.output_heads:
        return "classifier / output head: its output channels are the logits"
    if module not in ctx.dg.module2node:
        return "not reached by the traced forward pass"
    if module in ctx.qkv and ctx.qkv[module] in ctx.headless:
        kind = type(ctx.model.get_submodule(ctx.qkv[module])).__name__
        return f"q/k/v projection of {ctx.qkv[module]} ({kind}, no head pruning): its channels are split by head"
    if module in ctx.qkv:
        return f"q/k/v projection of {ctx.qkv[module]}: prune it with pruning_type='head'"
    if _out_channels(module) <= 1:
        return "has a single output channel"
    return None


def _group_issue(ctx: PruningContext, module: nn.Module, group: Any) -> str | None:
    """Why the coupled group rooted at ``module`` may not be pruned."""
    dg = ctx.dg
    widths = {_out_channels(m) for m in _group_out_modules(ctx, group) if isinstance(m, _PRUNABLE_TYPES)}
    if len(widths) > 1:  # e.g. a zero-padding shortcut, which the dependency graph takes for element-wise
        return (
            f"coupled to layers of other widths ({', '.join(map(str, sorted(widths)))} channels) across an op the "
            "dependency graph does not model, such as a zero-padding shortcut"
        )
    for dep, _idxs in group:
        target = dep.target.module
        out_fn = dg.is_out_channel_pruning_fn(dep.handler)
        in_fn = dg.is_in_channel_pruning_fn(dep.handler)
        label = ctx.names.get(target, dep.target.name) if isinstance(target, nn.Module) else dep.target.name
        if target is not module and isinstance(target, nn.Module):
            if out_fn and target in ctx.output_heads:
                return f"coupled to the classifier outputs ({label})"
            if in_fn and target in ctx.input_layers:
                return f"coupled to the model input channels ({label})"
            if target in ctx.head_dims:
                return f"coupled to the attention head dimensions of {ctx.head_dims[target]} ({label})"
        if ctx.transformer and isinstance(target, nn.LayerNorm):
            return (
                f"coupled to the residual stream / embedding channels through LayerNorm {label} "
                "(not pruned in transformer families; prune MLP hidden channels or heads instead)"
            )
    return None


#: How often one group may reach the same node with the same handler (6 at most seen, Swin): more is Torch-Pruning's
#: index mapping running away (FocalNet's split focal gates make get_pruning_group loop for ever).
MAX_DEP_REPEATS = 64
#: How many channel indices one group may hold in all: a flattened 512 x 7 x 7 feature map is 25,088 of them per
#: dependency. Torch-Pruning's reshape mappings can multiply them on every pass round a cycle before the repeats above
#: stop it (torchvision's Swin: past 20 GB at 64 px, in a few seconds).
MAX_GROUP_INDICES = 1 << 22


class _BoundedGroup(tp.dependency.group.Group):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.repeats: collections.Counter[tuple[int, Any]] = collections.Counter()
        self.indices = 0

    def add_dep(self, dep: Any, idxs: Any) -> None:
        key = (id(dep.target), dep.handler)
        self.repeats[key] += 1
        if self.repeats[key] > MAX_DEP_REPEATS:
            raise RuntimeError(
                f"Torch-Pruning's index mapping does not settle: {dep.target.name} reached over {MAX_DEP_REPEATS} times"
            )
        self.indices += len(idxs)
        if self.indices > MAX_GROUP_INDICES:
            raise RuntimeError(
                f"Torch-Pruning's index mapping runs away: over {MAX_GROUP_INDICES:,} channel indices by "
                f"{dep.target.name}"
            )
        super().add_dep(dep, idxs)


def _full_group(ctx: PruningContext, module: nn.Module) -> Any:
    graph = tp.dependency.graph  # get_pruning_group builds its Group from this module's global
    saved, graph.Group = graph.Group, _BoundedGroup
    try:
        return ctx.dg.get_pruning_group(module, _out_fn(module), list(range(_out_channels(module))))
    finally:
        graph.Group = saved


def _group_out_modules(ctx: PruningContext, group: Any) -> set[nn.Module]:
    return {
        dep.target.module
        for dep, _ in group
        if isinstance(dep.target.module, nn.Module) and ctx.dg.is_out_channel_pruning_fn(dep.handler)
    }


def channel_issue(ctx: PruningContext, name: str) -> tuple[str | None, list[str]]:
    """(why the output channels of layer ``name`` may not be pruned or None, the Conv2d/Linear layers whose
    output channels are pruned with it, in forward order: ``[name]`` for a block-internal layer, more for a
    coupled group such as a residual stage or a mobile block's expansion and depthwise convolutions)."""
    module = ctx.model.get_submodule(name)
    issue = _static_issue(ctx, module)
    group = None
    if issue is None:
        try:
            group = _full_group(ctx, module)
            issue = _group_issue(ctx, module, group)
        except Exception as exc:
            issue = f"dependency graph cannot group it: {one_line(exc)}"
    if issue is not None:
        return issue, []
    rank = {n: i for i, n in enumerate(prunable_names(ctx))}
    members = [ctx.names[m] for m in _group_out_modules(ctx, group) if isinstance(m, _PRUNABLE_TYPES)]
    return None, sorted(members, key=lambda n: (rank.get(n, len(rank)), n))


def prunable_names(ctx: PruningContext) -> list[str]:
    """Conv2d/Linear names, those run by the forward first (in forward order), then the others."""
    all_names = [n for n, m in ctx.model.named_modules() if isinstance(m, _PRUNABLE_TYPES)]
    known, ran_set = set(all_names), set(ctx.order)
    return [n for n in ctx.order if n in known] + [n for n in all_names if n not in ran_set]


# --------------------------------------------------------------------------------------------------
# Structured pruning
# --------------------------------------------------------------------------------------------------


def _group_kept_outputs(ctx: PruningContext, group: Any) -> dict[str, list[bool]]:
    """Which of its output channels each Conv2d/Linear layer of ``group`` keeps (a mask over those it had)."""
    kept: dict[str, list[bool]] = {}
    for dep, idxs in group:
        layer = dep.target.module
        if isinstance(layer, _PRUNABLE_TYPES) and layer in ctx.names and ctx.dg.is_out_channel_pruning_fn(dep.handler):
            gone = {int(i) for i in idxs}
            kept[ctx.names[layer]] = [i not in gone for i in range(_out_channels(layer))]
    return kept


def _group_consumers(ctx: PruningContext, group: Any) -> list[str]:
    """Conv2d/Linear layers of ``group`` whose input channels it prunes."""
    return [
        ctx.names[dep.target.module]
        for dep, _ in group
        if isinstance(dep.target.module, _PRUNABLE_TYPES)
        and not isinstance(dep.target.module, SelectionConv)  # stays an exact selection
        and ctx.dg.is_in_channel_pruning_fn(dep.handler)
        and dep.target.module in ctx.names
    ]


#: A layer narrower than two ``round_to`` blocks is rounded in steps of an eighth of its width instead.
MIN_STEPS = 8


def channel_step(n: int, round_to: int | None) -> int:
    """What kept channel counts of an ``n``-channel layer are rounded to: ``round_to``, the channel block CPU
    kernels compute in (oneDNN's and ONNX Runtime's blocked convolution layouts take 8 channels at a time on AVX2,
    so a 32-channel convolution pruned to 28 runs as 32, and a 16-channel one pruned to 14 runs slower than at 16:
    measured on CIFAR ResNet-56, OpenVINO FP32, 1 thread). Only a layer narrower than two blocks (fewer than 16
    channels at 8) keeps steps of ``n / MIN_STEPS``: it has no smaller count that saves a block."""
    if not round_to:
        return 0
    if n >= 2 * round_to:
        return round_to
    return max(1, min(round_to, n // MIN_STEPS))


def channel_blocks(group: Any) -> int:
    """Into how many equal blocks a grouped convolution (not a depthwise one) or a GroupNorm in ``group`` splits its
    channels (1 without one). Each block must lose the same positions: Torch-Pruning slices every group of a grouped
    convolution by the first's kept positions, and a GroupNorm needs equal groups (RegNet, ResNeXt, BiT)."""
    blocks = 1
    for dep, _ in group:
        layer = dep.target.module
        if isinstance(layer, nn.Conv2d) and layer.groups > 1 and layer.groups != layer.in_channels:
            blocks = math.lcm(blocks, layer.groups)
        elif isinstance(layer, nn.GroupNorm) and layer.num_groups > 1:
            blocks = math.lcm(blocks, layer.num_groups)
    return blocks


def _least_important(scores: torch.Tensor, n_prune: int, blocks: int) -> list[int]:
    """The ``n_prune`` channels to remove, by ``scores``: the least important, or with ``blocks`` > 1 the same
    positions of every block, ranked by their scores summed over the blocks."""
    if blocks == 1:
        return sorted(int(i) for i in torch.argsort(scores, stable=True)[:n_prune])
    per = scores.numel() // blocks
    positions = torch.argsort(scores.reshape(blocks, per).sum(0), stable=True)[: n_prune // blocks]
    return sorted(int(p) + b * per for b in range(blocks) for p in positions)


#: What pruning one module's group did: its output channels before and after, the group's layers, the consumers of
#: its outputs, and which of its output channels each layer of the group keeps.
_Pruned = tuple[int, int, set[nn.Module], list[str], dict[str, list[bool]]]


def _prune_one(
    ctx: PruningContext, module: nn.Module, ratio: float, round_to: int | None, importance: Any
) -> _Pruned | str:
    """Prune ``ratio`` of ``module``'s output channels with its group; (before, after, group, consumers, the output
    channels each layer of the group keeps)."""
    issue = _static_issue(ctx, module)
    if issue:
        return issue
    group = _full_group(ctx, module)
    issue = _group_issue(ctx, module, group)
    if issue:
        return issue
    n = _out_channels(module)
    if n <= 1:
        return f"{n} output channel"
    blocks = channel_blocks(group)
    if n % blocks:
        return f"{n} channels do not split into the {blocks} groups of a grouped convolution or GroupNorm"
    keep = kept_count(n, ratio, math.lcm(channel_step(n, round_to) or 1, blocks))
    n_prune = n - keep
    if n_prune <= 0:
        return f"ratio {ratio} removes no channel of {n}"
    scores = importance(group)
    if scores is None:
        return "importance undefined: no parameterised layer in its group"
    scores = torch.nan_to_num(scores.detach().float().cpu(), nan=0.0)  # e.g. all-zero weights
    idxs = _least_important(scores, n_prune, blocks)
    pruning_group = ctx.dg.get_pruning_group(module, _out_fn(module), idxs)
    if not ctx.dg.check_pruning_group(pruning_group):
        return "would remove every channel of a coupled layer"
    members = _group_out_modules(ctx, pruning_group)
    consumers = _group_consumers(ctx, pruning_group)
    kept = _group_kept_outputs(ctx, pruning_group)
    with torch.no_grad():
        pruning_group.prune()
    return n, _out_channels(module), members, consumers, kept


def _prune_checked(
    ctx: PruningContext, module: nn.Module, ratio: float, round_to: int | None, importance: Any, verify_each: bool
) -> _Pruned | str:
    """:func:`_prune_one`, rolled back (and the graph retraced) where it raises or, with ``verify_each``, leaves a
    forward that fails; then why not."""
    snap = snapshot(ctx.model)
    try:
        result = _prune_one(ctx, module, ratio, round_to, importance)
    except Exception as exc:
        restore(snap)
        ctx.rebuild()
        return f"pruning raised {one_line(exc)}"
    if isinstance(result, tuple) and verify_each:
        problem = check_forward(ctx.model, ctx.inputs, ctx.num_classes)
        if problem:
            restore(snap)
            ctx.rebuild()
            return problem
    return result


def apply_structured(
    ctx: PruningContext,
    rec: PruningRecommendation,
    regex: re.Pattern[str],
    round_to: int | None,
    importance: Any,
    claimed: dict[nn.Module, str],
    *,
    verify_each: bool,
) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
    """Apply one structured recommendation to every layer ``regex`` selects whose group is not ``claimed``.

    ``verify_each``: check the forward after each layer and roll that layer back on failure.
    """
    skipped: list[SkippedPruning] = []
    tally = PruningTally()
    for name in [n for n in prunable_names(ctx) if regex.search(n)]:
        module = ctx.model.get_submodule(name)
        if module in claimed:
            skipped.append(SkippedPruning(target=name, reason=f"output channels already pruned with {claimed[module]}"))
            continue
        result = _prune_checked(ctx, module, rec.pruning_ratio, round_to, importance, verify_each)
        if isinstance(result, str):
            logger.info("structured %r: skip %s (%s)", rec.layer, name, result)
            skipped.append(SkippedPruning(target=name, reason=result))
            continue
        n_before, n_after, members, used_by, kept = result
        tally.add(name, n_before, n_after, used_by)
        tally.kept_outputs.update(kept)
        for member in members:
            claimed.setdefault(member, f"the group of {name} ({rec.layer!r})")
        logger.debug("structured %r: %s %d -> %d channels", rec.layer, name, n_before, n_after)
    if not tally.modules:
        return None, skipped
    return tally.applied(rec), skipped


__all__ = [
    "MIN_STEPS",
    "PruningContext",
    "apply_structured",
    "channel_issue",
    "channel_step",
    "new_context",
    "prunable_names",
]
