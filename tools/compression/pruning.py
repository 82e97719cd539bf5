"""Structured channel pruning and attention-head pruning, driven by ``PruningRecommendation``s.

Two kinds of recommendation are applied, in the order given, to a model **in place**:

``structured``
    ``layer`` is a regex matched (``re.search``) against the names of ``nn.Conv2d`` / ``nn.Linear``
    modules. For each match, ``pruning_ratio`` of *that module's* output channels is removed with
    Torch-Pruning's ``DependencyGraph``: the whole coupled group (BatchNorm, the next layers' input
    channels, residual adds, ...) is pruned together, ranked by a group importance from ``IMPORTANCE``.
    A coupled group is pruned at most once per ``apply_pruning`` call: when several matched modules share
    a group (e.g. the last conv of every ResNet block of a stage, tied by the residual adds), the first in
    forward order prunes it and the others are reported as skipped, so the ratio does not compound.

``head``
    ``layer`` is a regex matched against the name of a head-prunable attention module *or* the names of
    its q/k/v/o projections (``attention`` and ``attention\\.q_proj`` select the same modules).
    ``round(ratio * heads)`` heads are removed (at least one is kept), ranked by the norm of each head's
    q/k/v rows and o columns. Supported attention classes are listed in ``ATTENTION_SPECS`` (ViT, DeiT,
    Swin, DINOv2); a new family is one table entry.

What is never pruned, and is reported as ``SkippedPruning`` instead of failing:

* the classifier: every Conv2d/Linear from which the logits are reachable in the traced autograd graph
  without passing through another Conv2d/Linear (plus ``get_output_embeddings()`` when the model has
  one) -- for HF classifiers that is ``classifier`` (``classifier.1`` for ResNet), for torchvision ``fc``;
  groups that would touch its outputs are skipped as well;
* groups that would prune the input channels of a layer fed by the model input;
* q/k/v projections of supported attention modules (use ``pruning_type="head"``) and any group coupled
  to their head dimensions;
* for transformer families (models containing attention modules): groups coupled to a ``LayerNorm``,
  i.e. the residual stream / embedding channels (patch embedding, ``o_proj``, ``fc2``, Swin patch
  merging). Torch-Pruning cannot keep those consistent everywhere (Swin's 2x2 patch merging concatenates
  four copies of the channels; ViT's cls token and position embeddings are raw parameters). The MLP
  hidden channels (``fc1``) and attention heads are what is pruned in transformers;
* modules that are not reached by the forward pass, or have a single output channel;
* anything whose pruning raises, or after which the forward pass fails: each recommendation is checked
  with a forward pass on ``example_inputs``; on failure it is rolled back and redone one module at a time,
  keeping the modules that work.

Parameter tensors are never modified in place (pruning builds new ones), so a rollback just restores the
modules' attribute dictionaries.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch_pruning as tp
from pydantic import BaseModel, Field
from torch import nn

from tools.models.sources import logits_of
from tools.schemas import PruningRecommendation

logger = logging.getLogger(__name__)

ExampleInputs = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]

# --------------------------------------------------------------------------------------------------
# Importance registry
# --------------------------------------------------------------------------------------------------

#: Group importance criteria for structured pruning, by name. ``taylor`` is deliberately absent: it needs
#: gradients from a labelled batch, and Torch-Pruning's implementation fails on ``weight.grad is None``.
IMPORTANCE: dict[str, Callable[[], Any]] = {
    "l1": lambda: tp.importance.GroupMagnitudeImportance(p=1),
    "l2": lambda: tp.importance.GroupMagnitudeImportance(p=2),
    "random": lambda: tp.importance.RandomImportance(),
}

#: Norm degree used to rank attention heads for each magnitude criterion; other criteria rank randomly.
HEAD_NORM_P: dict[str, int] = {"l1": 1, "l2": 2}


def get_importance(name: str) -> Any:
    """Instantiate the importance criterion ``name``; ``ValueError`` lists the valid names."""
    try:
        factory = IMPORTANCE[name]
    except KeyError:
        raise ValueError(f"unknown importance {name!r}; valid names: {', '.join(sorted(IMPORTANCE))}") from None
    return factory()


# --------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------


class AppliedPruning(BaseModel):
    """One recommendation as applied: what it pruned and by how much (channels or heads, summed)."""

    pattern: str
    pruning_type: Literal["structured", "head"]
    ratio: float
    modules: list[str] = Field(description="Pruned modules: group roots (structured) or attention modules.")
    before: int = Field(description="Output channels (structured) or heads (head) of `modules`, before.")
    after: int = Field(description="The same count after pruning.")


class SkippedPruning(BaseModel):
    """A module (or a whole pattern) that a recommendation targeted but that was left untouched."""

    target: str = Field(description="Module name, or the recommendation's pattern when nothing matched.")
    reason: str


class PruneReport(BaseModel):
    applied: list[AppliedPruning] = Field(default_factory=list)
    skipped: list[SkippedPruning] = Field(default_factory=list)
    params_before: int
    params_after: int


class PrunableLayers(BaseModel):
    """What ``apply_pruning`` can prune in a model.

    ``structured``: Conv2d/Linear names (forward order) whose output channels can be pruned.
    ``heads``: attention-module name -> number of heads, for head pruning.
    ``blocked``: Conv2d/Linear name -> why its output channels are not prunable.
    """

    structured: list[str] = Field(default_factory=list)
    heads: dict[str, int] = Field(default_factory=dict)
    blocked: dict[str, str] = Field(default_factory=dict)
    coupling: dict[str, int] = Field(
        default_factory=dict,
        description="structured name -> Conv2d/Linear layers whose outputs are pruned with it (1: internal "
        "to its block; more: coupled, e.g. through a residual add).",
    )


# --------------------------------------------------------------------------------------------------
# Head-prunable attention modules
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionSpec:
    """How to prune the heads of one attention class.

    ``per_head_params``: dotted parameter paths (relative to the attention module) with one slice per
    head along ``dim`` (Swin's relative-position bias table has one column per head).
    ``size_attrs``: attributes holding ``heads * head_dim`` that the forward may read.
    """

    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    heads_attr: str = "num_attention_heads"
    head_dim_attr: str = "head_dim"
    size_attrs: tuple[str, ...] = ("all_head_size",)
    per_head_params: tuple[tuple[str, int], ...] = ()

    @property
    def projections(self) -> tuple[str, str, str, str]:
        return (self.q, self.k, self.v, self.o)


_VIT_LIKE = AttentionSpec()

#: Attention class name -> how to prune its heads (transformers 5.x module layout).
ATTENTION_SPECS: dict[str, AttentionSpec] = {
    "ViTAttention": _VIT_LIKE,
    "DeiTAttention": _VIT_LIKE,
    "Dinov2Attention": _VIT_LIKE,
    "SwinAttention": AttentionSpec(
        per_head_params=(("relative_position_bias.relative_position_bias_table", 1),),
    ),
}


def _attention_modules(model: nn.Module) -> dict[str, tuple[nn.Module, AttentionSpec]]:
    found: dict[str, tuple[nn.Module, AttentionSpec]] = {}
    for name, module in model.named_modules():
        spec = ATTENTION_SPECS.get(type(module).__name__)
        if spec is None:
            continue
        if all(isinstance(getattr(module, p, None), nn.Linear) for p in spec.projections) and isinstance(
            getattr(module, spec.heads_attr, None), int
        ):
            found[name] = (module, spec)
        else:
            logger.warning("%s (%s) does not have the expected layout; not head-prunable", name, spec)
    return found


def _has_attention(model: nn.Module) -> bool:
    return any(type(m).__name__ in ATTENTION_SPECS or isinstance(m, nn.MultiheadAttention) for m in model.modules())


# --------------------------------------------------------------------------------------------------
# Forward helpers
# --------------------------------------------------------------------------------------------------


def _call(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, torch.Tensor):
        return model(inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(*inputs)


def _forward_logits(model: nn.Module, inputs: Any) -> torch.Tensor:
    return logits_of(_call(model, inputs))


def _input_tensors(inputs: Any) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    values: Iterable[Any] = inputs.values() if isinstance(inputs, Mapping) else inputs
    return [v for v in values if isinstance(v, torch.Tensor)]


def _check_forward(model: nn.Module, inputs: Any, num_classes: int) -> str | None:
    """Run the model; None when it gives logits with ``num_classes`` classes, else the problem."""
    try:
        with torch.no_grad():
            logits = _forward_logits(model, inputs)
    except Exception as exc:
        return f"forward pass fails: {_one_line(exc)}"
    if logits.shape[-1] != num_classes:
        return f"logits have {logits.shape[-1]} classes instead of {num_classes}"
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Snapshots (rollback)
# --------------------------------------------------------------------------------------------------

_Snapshot = list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]]


def _snapshot(model: nn.Module) -> _Snapshot:
    """References to every module's state; valid because pruning replaces tensors instead of editing them."""
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in model.modules()]


def _restore(snapshot: _Snapshot) -> None:
    for module, attrs, params, buffers, children in snapshot:
        module.__dict__.clear()
        module.__dict__.update(attrs)
        module._parameters = dict(params)
        module._buffers = dict(buffers)
        module._modules = dict(children)


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

_PRUNABLE_TYPES = (nn.Conv2d, nn.Linear)


@dataclass
class _Context:
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
            out = _forward_logits(m, x)
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
        for name, (module, spec) in _attention_modules(model).items():
            for proj in (spec.q, spec.k, spec.v):
                self.qkv[getattr(module, proj)] = name
                self.head_dims[getattr(module, proj)] = name
            self.head_dims[getattr(module, spec.o)] = name
        self.transformer = _has_attention(model)

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


def _new_context(model: nn.Module, inputs: Any, *, graph: bool = True) -> _Context:
    """Context with the number of classes; traced now when ``graph``, else on ``ensure_graph``."""
    model.eval()
    if graph:
        ctx = _Context(model=model, inputs=inputs, num_classes=-1)
        ctx.rebuild()
        return ctx
    with torch.no_grad():
        num_classes = int(_forward_logits(model, inputs).shape[-1])
    return _Context(model=model, inputs=inputs, num_classes=num_classes)


def _out_fn(module: nn.Module) -> Callable[..., Any]:
    return tp.prune_conv_out_channels if isinstance(module, nn.Conv2d) else tp.prune_linear_out_channels


def _out_channels(module: nn.Module) -> int:
    if isinstance(module, nn.Conv2d):
        return module.out_channels
    if isinstance(module, nn.Linear):
        return module.out_features
    raise TypeError(f"not a Conv2d/Linear: {type(module).__name__}")


def _static_issue(ctx: _Context, module: nn.Module) -> str | None:
    """Why ``module``'s output channels may not be pruned, judged on the module alone."""
    if module in ctx.output_heads:
        return "classifier / output head: its output channels are the logits"
    if module not in ctx.dg.module2node:
        return "not reached by the traced forward pass"
    if module in ctx.qkv:
        return f"q/k/v projection of {ctx.qkv[module]}: prune it with pruning_type='head'"
    if _out_channels(module) <= 1:
        return "has a single output channel"
    return None


def _group_issue(ctx: _Context, module: nn.Module, group: Any) -> str | None:
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


def _full_group(ctx: _Context, module: nn.Module) -> Any:
    return ctx.dg.get_pruning_group(module, _out_fn(module), list(range(_out_channels(module))))


def _group_out_modules(ctx: _Context, group: Any) -> set[nn.Module]:
    return {
        dep.target.module
        for dep, _ in group
        if isinstance(dep.target.module, nn.Module) and ctx.dg.is_out_channel_pruning_fn(dep.handler)
    }


def prunable_layers(model: nn.Module, example_inputs: ExampleInputs) -> PrunableLayers:
    """List what ``apply_pruning`` may prune in ``model`` (traced on ``example_inputs``); see module doc."""
    ctx = _new_context(model, example_inputs)
    result = PrunableLayers()
    for name in _prunable_names(ctx):
        module = ctx.model.get_submodule(name)
        issue = _static_issue(ctx, module)
        group = None
        if issue is None:
            try:
                group = _full_group(ctx, module)
                issue = _group_issue(ctx, module, group)
            except Exception as exc:
                issue = f"dependency graph cannot group it: {_one_line(exc)}"
        if issue is None:
            result.structured.append(name)
            result.coupling[name] = sum(isinstance(m, _PRUNABLE_TYPES) for m in _group_out_modules(ctx, group))
        else:
            result.blocked[name] = issue
    result.heads = {
        name: int(getattr(module, spec.heads_attr)) for name, (module, spec) in _attention_modules(model).items()
    }
    return result


def _prunable_names(ctx: _Context) -> list[str]:
    """Conv2d/Linear names, those run by the forward first (in forward order), then the others."""
    all_names = [n for n, m in ctx.model.named_modules() if isinstance(m, _PRUNABLE_TYPES)]
    known, ran_set = set(all_names), set(ctx.order)
    return [n for n in ctx.order if n in known] + [n for n in all_names if n not in ran_set]


# --------------------------------------------------------------------------------------------------
# Structured pruning
# --------------------------------------------------------------------------------------------------


def _kept_channels(n: int, ratio: float, round_to: int | None) -> int:
    keep = n - math.floor(ratio * n + 0.5)
    if round_to:
        keep = math.floor(keep / round_to + 0.5) * round_to
        keep = max(keep, round_to)
    return max(1, min(n, keep))


def _prune_one(
    ctx: _Context, module: nn.Module, ratio: float, round_to: int | None, importance: Any
) -> tuple[int, int, set[nn.Module]] | str:
    """Prune ``ratio`` of ``module``'s output channels with its group; (before, after, group) or a reason."""
    issue = _static_issue(ctx, module)
    if issue:
        return issue
    group = _full_group(ctx, module)
    issue = _group_issue(ctx, module, group)
    if issue:
        return issue
    n = _out_channels(module)
    if round_to and n <= round_to:
        return f"{n} output channels, not more than round_to={round_to}"
    keep = _kept_channels(n, ratio, round_to)
    n_prune = n - keep
    if n_prune <= 0:
        return f"ratio {ratio} removes no channel of {n}"
    scores = importance(group)
    if scores is None:
        return "importance undefined: no parameterised layer in its group"
    scores = torch.nan_to_num(scores.detach().float().cpu(), nan=0.0)  # e.g. all-zero weights
    order = torch.argsort(scores, stable=True)
    idxs = sorted(int(i) for i in order[:n_prune])
    pruning_group = ctx.dg.get_pruning_group(module, _out_fn(module), idxs)
    if not ctx.dg.check_pruning_group(pruning_group):
        return "would remove every channel of a coupled layer"
    members = _group_out_modules(ctx, pruning_group)
    with torch.no_grad():
        pruning_group.prune()
    return n, _out_channels(module), members


def _apply_structured(
    ctx: _Context,
    rec: PruningRecommendation,
    regex: re.Pattern[str],
    round_to: int | None,
    importance: Any,
    claimed: dict[nn.Module, str],
    *,
    verify_each: bool,
) -> tuple[AppliedPruning | None, list[SkippedPruning]]:
    skipped: list[SkippedPruning] = []
    modules: list[str] = []
    before = after = 0
    for name in [n for n in _prunable_names(ctx) if regex.search(n)]:
        module = ctx.model.get_submodule(name)
        if module in claimed:
            skipped.append(SkippedPruning(target=name, reason=f"output channels already pruned with {claimed[module]}"))
            continue
        snap = _snapshot(ctx.model)
        try:
            result = _prune_one(ctx, module, rec.pruning_ratio, round_to, importance)
        except Exception as exc:
            _restore(snap)
            ctx.rebuild()
            result = f"pruning raised {_one_line(exc)}"
        if isinstance(result, tuple) and verify_each:
            problem = _check_forward(ctx.model, ctx.inputs, ctx.num_classes)
            if problem:
                _restore(snap)
                ctx.rebuild()
                result = problem
        if isinstance(result, str):
            logger.info("structured %r: skip %s (%s)", rec.layer, name, result)
            skipped.append(SkippedPruning(target=name, reason=result))
            continue
        n_before, n_after, members = result
        for member in members:
            claimed.setdefault(member, f"the group of {name} ({rec.layer!r})")
        modules.append(name)
        before += n_before
        after += n_after
        logger.debug("structured %r: %s %d -> %d channels", rec.layer, name, n_before, n_after)
    if not modules:
        return None, skipped
    applied = AppliedPruning(
        pattern=rec.layer,
        pruning_type="structured",
        ratio=rec.pruning_ratio,
        modules=modules,
        before=before,
        after=after,
    )
    return applied, skipped


# --------------------------------------------------------------------------------------------------
# Head pruning
# --------------------------------------------------------------------------------------------------


def _head_scores(module: nn.Module, spec: AttentionSpec, heads: int, importance: str, gen: torch.Generator) -> Any:
    if importance not in HEAD_NORM_P:
        return torch.rand(heads, generator=gen)
    p = HEAD_NORM_P[importance]
    head_dim = int(getattr(module, spec.head_dim_attr))
    scores = torch.zeros(heads)
    for proj in (spec.q, spec.k, spec.v):
        layer: nn.Linear = getattr(module, proj)
        w = layer.weight.detach().float().abs().pow(p).reshape(heads, head_dim, -1).sum(dim=(1, 2))
        scores += w.cpu()
        if layer.bias is not None:
            scores += layer.bias.detach().float().abs().pow(p).reshape(heads, head_dim).sum(1).cpu()
    o: nn.Linear = getattr(module, spec.o)
    scores += o.weight.detach().float().abs().pow(p).reshape(-1, heads, head_dim).sum(dim=(0, 2)).cpu()
    return scores


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


def _prune_heads_of(
    module: nn.Module, spec: AttentionSpec, ratio: float, importance: str, gen: torch.Generator
) -> tuple[int, int] | str:
    heads = int(getattr(module, spec.heads_attr))
    head_dim = int(getattr(module, spec.head_dim_attr))
    n_prune = min(heads - 1, math.floor(ratio * heads + 0.5))
    if n_prune <= 0:
        return f"ratio {ratio} removes no head of {heads}" if heads > 1 else "has a single head"
    for proj in spec.projections:
        layer = getattr(module, proj)
        size = layer.in_features if proj == spec.o else layer.out_features
        if size != heads * head_dim:
            return f"{proj} has {size} features, not {heads} heads x {head_dim}"
    scores = _head_scores(module, spec, heads, importance, gen)
    kept_heads = torch.sort(torch.argsort(scores, descending=True, stable=True)[: heads - n_prune]).values
    keep = (kept_heads[:, None] * head_dim + torch.arange(head_dim)[None, :]).reshape(-1)
    with torch.no_grad():
        for proj in (spec.q, spec.k, spec.v):
            _slice_linear(getattr(module, proj), keep, 0)
        _slice_linear(getattr(module, spec.o), keep, 1)
        for path, dim in spec.per_head_params:
            owner_path, _, attr = path.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            param = getattr(owner, attr)
            new = param.detach().index_select(dim, kept_heads.to(param.device)).clone()
            setattr(owner, attr, nn.Parameter(new, requires_grad=param.requires_grad))
    kept = heads - n_prune
    setattr(module, spec.heads_attr, kept)
    for attr in spec.size_attrs:
        if hasattr(module, attr):
            setattr(module, attr, kept * head_dim)
    return heads, kept


def _head_targets(model: nn.Module, regex: re.Pattern[str]) -> list[tuple[str, nn.Module, AttentionSpec]]:
    targets = []
    for name, (module, spec) in _attention_modules(model).items():
        candidates = [name, *(f"{name}.{p}" for p in spec.projections)]
        if any(regex.search(c) for c in candidates):
            targets.append((name, module, spec))
    return targets


def _apply_heads(
    ctx: _Context, rec: PruningRecommendation, regex: re.Pattern[str], importance: str, gen: torch.Generator
) -> tuple[AppliedPruning | None, list[SkippedPruning], bool]:
    """Returns (applied, skipped, changed)."""
    skipped: list[SkippedPruning] = []
    modules: list[str] = []
    before = after = 0
    snap = _snapshot(ctx.model)
    for name, module, spec in _head_targets(ctx.model, regex):
        try:
            result = _prune_heads_of(module, spec, rec.pruning_ratio, importance, gen)
        except Exception as exc:
            result = f"head pruning raised {_one_line(exc)}"
        if isinstance(result, str):
            skipped.append(SkippedPruning(target=name, reason=result))
            continue
        modules.append(name)
        before += result[0]
        after += result[1]
        logger.debug("head %r: %s %d -> %d heads", rec.layer, name, *result)
    if not modules:
        return None, skipped, False
    problem = _check_forward(ctx.model, ctx.inputs, ctx.num_classes)
    if problem:
        _restore(snap)
        skipped.extend(SkippedPruning(target=n, reason=problem) for n in modules)
        return None, skipped, True
    applied = AppliedPruning(
        pattern=rec.layer,
        pruning_type="head",
        ratio=rec.pruning_ratio,
        modules=modules,
        before=before,
        after=after,
    )
    return applied, skipped, True


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def apply_pruning(
    model: nn.Module,
    recommendations: Sequence[PruningRecommendation],
    example_inputs: ExampleInputs,
    *,
    importance: str = "l1",
    round_to: int | None = None,
    seed: int = 0,
) -> PruneReport:
    """Apply ``recommendations`` in order to ``model`` IN PLACE (pass a fresh copy) and report.

    ``example_inputs`` (a tensor, a tuple of positional tensors, or a dict of keyword tensors) is used
    to trace the dependency graph and to check every step with a forward pass. ``importance`` names a
    criterion of ``IMPORTANCE``; ``round_to`` makes kept channel counts multiples of it (structured only);
    ``seed`` fixes random importance. Recommendations that match nothing give no ``applied`` entry but a
    ``skipped`` one whose target is the pattern. Every recommendation that changed the model is checked
    with a forward pass (logits of the original size), and rolled back module by module on failure, so the
    returned model always runs. Raises ``ValueError`` for an unknown importance or an invalid regex.
    """
    imp = get_importance(importance)
    if round_to is not None and round_to < 1:
        raise ValueError(f"round_to must be a positive integer, got {round_to}")
    compiled: list[tuple[PruningRecommendation, re.Pattern[str]]] = []
    for rec in recommendations:
        try:
            compiled.append((rec, re.compile(rec.layer)))
        except re.error as exc:
            raise ValueError(f"invalid layer regex {rec.layer!r}: {exc}") from None

    model.eval()
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    params_before = count_params(model)
    report = PruneReport(params_before=params_before, params_after=params_before)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        structured = any(rec.pruning_type == "structured" for rec, _ in compiled)
        ctx = _new_context(model, example_inputs, graph=structured)
        claimed: dict[nn.Module, str] = {}
        for rec, regex in compiled:
            if rec.pruning_type == "head":
                if not _head_targets(model, regex):
                    report.skipped.append(
                        SkippedPruning(target=rec.layer, reason="no head-prunable attention module matches")
                    )
                    continue
                applied, skipped, changed = _apply_heads(ctx, rec, regex, importance, gen)
                if changed:
                    ctx.dg = None  # shapes changed outside the dependency graph: retrace when needed
            else:
                ctx.ensure_graph()
                if not any(regex.search(n) for n in _prunable_names(ctx)):
                    report.skipped.append(SkippedPruning(target=rec.layer, reason="no Conv2d/Linear module matches"))
                    continue
                snap, claimed_before = _snapshot(model), dict(claimed)
                applied, skipped = _apply_structured(ctx, rec, regex, round_to, imp, claimed, verify_each=False)
                problem = _check_forward(model, example_inputs, ctx.num_classes) if applied else None
                if problem:
                    logger.warning(
                        "structured %r broke the forward (%s); retrying module by module", rec.layer, problem
                    )
                    _restore(snap)
                    claimed.clear()
                    claimed.update(claimed_before)
                    ctx.rebuild()
                    applied, skipped = _apply_structured(ctx, rec, regex, round_to, imp, claimed, verify_each=True)
            if applied:
                report.applied.append(applied)
            report.skipped.extend(skipped)

    for name, p in model.named_parameters():  # pruning creates new Parameters: keep frozen ones frozen
        if name in frozen:
            p.requires_grad_(False)
    report.params_after = count_params(model)
    logger.info(
        "pruning: %d applied, %d skipped, params %d -> %d",
        len(report.applied),
        len(report.skipped),
        report.params_before,
        report.params_after,
    )
    return report


__all__ = [
    "ATTENTION_SPECS",
    "HEAD_NORM_P",
    "IMPORTANCE",
    "AppliedPruning",
    "AttentionSpec",
    "PrunableLayers",
    "PruneReport",
    "SkippedPruning",
    "apply_pruning",
    "count_params",
    "get_importance",
    "prunable_layers",
]
