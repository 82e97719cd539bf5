"""Static profile: MACs and parameters of one forward pass at batch size 1.

**MACs and parameters** (:func:`static_profile`) come from ptflops' ``get_model_complexity_info`` with the
**pytorch backend**. That backend hooks every supported module (Conv, Linear, norms, pools, activations, ...)
and so gives per-module numbers; the aten backend only attributes MACs to the model's *top-level* children
and leaves its forward hooks on the model, so it cannot give per-layer figures. Neither backend counts
``F.scaled_dot_product_attention`` (what transformers' ViT/Swin use by default) nor the ``@`` operator, so
the attention matmuls are counted here with a :class:`~torch.overrides.TorchFunctionMode` running alongside
ptflops, added to the total and attributed to the innermost module that calls them (e.g.
``vit.layers.0.attention``). Per-layer figures follow ptflops' conventions (a Linear costs ``in*out + out``
MACs per position; a Conv2d ``k*k*in/groups*out`` per output position plus the bias). Dynamically quantized
``Linear`` modules get the same MACs as the float layer they replace; any other module ptflops does not know
costs 0 MACs. "Layers" are those of :mod:`tools.profiling.modules`; the model is left unchanged.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tools.profiling.modules import (
    atomic_modules,
    call_or_none,
    clean_model,
    first_tensor,
    is_quantized,
    is_quantized_linear,
    model_device_dtype,
    own_params,
    owner_map,
    ptflops_mapping,
    ptflops_type,
)

logger = logging.getLogger(__name__)

__all__ = [
    "StaticDetails",
    "is_count_note",
    "mac_shares",
    "static_details",
    "static_profile",
    "uncounted_note",
    "weight_layer_macs",
]

_MATMUL_NAMES = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm"})
# Operations ptflops' pytorch backend already counts through its patched torch.* functions.
_PTFLOPS_COUNTED_NAMES = frozenset({"matmul", "mm", "bmm", "baddbmm"})
_SDPA_NAME = "scaled_dot_product_attention"


def _flops_hook_for(module: nn.Module, mapping: Mapping[type, Callable[..., Any]]) -> Callable[..., Any] | None:
    """The ptflops hook that counts ``module``: its type's, else the nearest base class's."""
    if is_quantized(module):
        return _quantized_linear_hook if is_quantized_linear(module) else None
    counted = ptflops_type(module, mapping)
    return None if counted is None else mapping[counted]


def _quantized_linear_hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
    """ptflops-style hook for (dynamically) quantized Linear: same MACs as the float layer."""
    x = inputs[0] if inputs else None
    out_features = int(getattr(module, "out_features", 0))
    in_features = int(getattr(module, "in_features", 0))
    positions = math.prod(x.shape[:-1]) if isinstance(x, torch.Tensor) else 1
    bias = call_or_none(module, "bias")
    macs = (in_features * out_features + (out_features if bias is not None else 0)) * positions
    setattr(module, "__flops__", int(getattr(module, "__flops__", 0)) + int(macs))  # noqa: B010


def _matmul_macs(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int:
    """MACs of a matmul-like call, from its first operand's inner dimension and its output."""
    if not isinstance(out, torch.Tensor):
        return 0
    operands = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "baddbmm":
        operands = operands[1:]
    if not operands or operands[0].dim() == 0:
        return 0
    if name == "__rmatmul__" and len(operands) > 1:
        operands = operands[1:]
    inner = operands[0].shape[-1]
    return int(max(out.numel(), 1) * inner)


def _sdpa_macs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """MACs of ``F.scaled_dot_product_attention``: ``Q @ K^T`` plus ``softmax(.) @ V``."""
    names = ("query", "key", "value")
    tensors = [args[i] if len(args) > i else kwargs.get(n) for i, n in enumerate(names)]
    q, k, v = tensors
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return 0
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    rows = math.prod(q.shape[:-1])
    return int(rows * k.shape[-2] * (q.shape[-1] + v.shape[-1]))


class _AttentionMacCounter(TorchFunctionMode):
    """Counts the matmuls that ptflops' module hooks do not see, per calling module.

    ``attributed`` holds every matmul-like call and SDPA, charged to the innermost module on
    ``stack`` (which the caller maintains with forward hooks); ``extra`` is the part ptflops does
    not count at all (SDPA and the ``@`` operator) and must be added to its total.
    """

    def __init__(self, stack: list[str], skip: set[str]) -> None:
        super().__init__()
        self.stack = stack
        self.skip = skip
        self.attributed: dict[str, int] = defaultdict(int)
        self.extra = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name not in _MATMUL_NAMES and name != _SDPA_NAME:
            return out
        owner = self.stack[-1] if self.stack else ""
        if owner in self.skip:  # ptflops' own hook for this module already counts it
            return out
        try:
            macs = _sdpa_macs(args, kwargs) if name == _SDPA_NAME else _matmul_macs(name, args, kwargs, out)
        except Exception:  # never let counting break the forward pass
            logger.debug("could not count MACs of %s", name, exc_info=True)
            return out
        self.attributed[owner] += macs
        if name not in _PTFLOPS_COUNTED_NAMES:
            self.extra += macs
        return out


@dataclass
class StaticDetails:
    """Everything the static pass learns: totals, per-module MACs/params/output shapes, atomic names, types."""

    total_macs: int
    total_params: int
    macs: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    output_shapes: dict[str, list[int]] = field(default_factory=dict)
    atomic: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)

    def layer_names(self) -> list[str]:
        """Atomic modules and containers with their own parameters or MACs, in registration order."""
        atomic = set(self.atomic)
        return [n for n in self.types if n in atomic or self.params.get(n, 0) or self.macs.get(n, 0)]


@dataclass
class _ModuleTrace:
    """What forward hooks on every module see: the stack of owners being run and each module's first output shape."""

    owners: Mapping[str, str]
    stack: list[str] = field(default_factory=list)
    output_shapes: dict[str, list[int]] = field(default_factory=dict)

    def pre(self, name: str) -> Callable[..., None]:
        """A forward pre-hook that pushes ``name``'s owner on the stack."""

        def f(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.stack.append(self.owners.get(name, name))

        return f

    def post(self, name: str) -> Callable[..., None]:
        """A forward hook that pops the stack and records ``name``'s first output shape."""

        def f(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.stack:
                self.stack.pop()
            out = first_tensor(output)
            if out is not None and name not in self.output_shapes:
                self.output_shapes[name] = list(out.shape)

        return f


def _recording_hooks(
    model: nn.Module, atomic: Mapping[str, nn.Module], per_module: dict[str, int]
) -> tuple[dict[type, Callable[..., Any]], set[str]]:
    """A hook for every atomic module type: ptflops' own (found via the MRO, so subclasses of nn.Linear etc. count
    too), wrapped to record each module's MACs in ``per_module``; and the names of the atomic modules hooked."""
    mapping = ptflops_mapping()
    names_by_id = {id(m): n for n, m in model.named_modules()}
    hooked: set[str] = set()
    custom_hooks: dict[type, Callable[..., Any]] = {}

    def wrap(hook: Callable[..., Any]) -> Callable[..., Any]:
        def recorder(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            hook(module, inputs, output)
            name = names_by_id.get(id(module))
            if name is not None:
                per_module[name] = int(getattr(module, "__flops__", 0))

        return recorder

    for name, module in atomic.items():
        hook = _flops_hook_for(module, mapping)
        if hook is None:
            continue
        hooked.add(name)
        if type(module) not in custom_hooks:
            custom_hooks[type(module)] = wrap(hook)
    return custom_hooks, hooked


def _ptflops_macs(
    model: nn.Module,
    input_shape: tuple[int, ...],
    custom_hooks: dict[type, Callable[..., Any]],
    counter: _AttentionMacCounter,
    trace: _ModuleTrace,
) -> int | None:
    """ptflops' MAC count of one traced forward pass with ``counter`` running (None, with a warning, when it fails)."""
    from ptflops import get_model_complexity_info

    device, dtype = model_device_dtype(model)

    def make_input(res: tuple[int, ...]) -> torch.Tensor:
        # deterministic, non-constant values without touching the global RNG
        numel = math.prod(res)
        return torch.linspace(-1.0, 1.0, numel, dtype=dtype, device=device).reshape(1, *res)

    handles: list[torch.utils.hooks.RemovableHandle] = []
    captured = io.StringIO()
    ptflops_macs: int | None = None
    with clean_model(model):
        try:
            for name, module in model.named_modules():
                handles.append(module.register_forward_pre_hook(trace.pre(name)))
                handles.append(module.register_forward_hook(trace.post(name), always_call=True))
            with (
                torch.no_grad(),
                counter,
                contextlib.redirect_stdout(captured),
                contextlib.redirect_stderr(captured),
            ):
                macs_raw, _ = get_model_complexity_info(
                    model,
                    tuple(input_shape),
                    print_per_layer_stat=False,
                    as_strings=False,
                    input_constructor=make_input,  # type: ignore[arg-type]
                    ost=captured,
                    verbose=False,
                    custom_modules_hooks=custom_hooks,
                    backend="pytorch",
                )
            ptflops_macs = int(macs_raw) if macs_raw is not None else None
        except Exception:
            logger.warning("MAC counting failed for %s", type(model).__name__, exc_info=True)
        finally:
            for handle in handles:
                handle.remove()
    text = captured.getvalue().strip()
    if ptflops_macs is None:
        logger.warning("ptflops could not count %s; MACs are 0. Output: %s", type(model).__name__, text[-2000:])
    elif text:
        logger.debug("ptflops output: %s", text[-2000:])
    return ptflops_macs


def static_details(model: nn.Module, input_shape: tuple[int, ...]) -> StaticDetails:
    """One hooked ptflops pass at batch size 1: MACs per owner module, params, output shapes (model left unchanged)."""
    atomic = atomic_modules(model)
    owners = owner_map(model, atomic)
    params, total_params = own_params(model, atomic, owners)
    types = {n: type(m).__name__ for n, m in model.named_modules()}
    per_module: dict[str, int] = {}
    custom_hooks, hooked = _recording_hooks(model, atomic, per_module)
    trace = _ModuleTrace(owners)  # the module stack for the attention counter, and output shapes
    counter = _AttentionMacCounter(trace.stack, skip=hooked)
    ptflops_macs = _ptflops_macs(model, input_shape, custom_hooks, counter, trace)

    macs: dict[str, int] = defaultdict(int)
    for name, value in per_module.items():
        macs[owners.get(name, name)] += value
    for name, value in counter.attributed.items():
        macs[name] += value
    total_macs = (ptflops_macs + counter.extra) if ptflops_macs is not None else 0
    if ptflops_macs is None:
        macs = defaultdict(int)
    return StaticDetails(
        uncounted=_uncounted_types(atomic, hooked, macs, params),
        total_macs=total_macs,
        total_params=total_params,
        macs=dict(macs),
        params=params,
        output_shapes=trace.output_shapes,
        atomic=list(atomic),
        types=types,
    )


def _uncounted_types(
    atomic: Mapping[str, nn.Module], hooked: set[str], macs: Mapping[str, int], params: Mapping[str, int]
) -> dict[str, int]:
    """Type name -> how many atomic modules with a weight matrix or kernel no rule counted (no ptflops hook, no matmul
    seen): their parameters count, their MACs are 0."""
    types: dict[str, int] = defaultdict(int)
    for name, module in atomic.items():
        if name in hooked or macs.get(name, 0) or not params.get(name, 0):
            continue
        if any(p.dim() >= 2 for p in module.parameters(recurse=False)):
            types[type(module).__name__] += 1
    return dict(types)


UNCOUNTED_NOTE = "MACs not counted"


def uncounted_note(uncounted: Mapping[str, int]) -> str | None:
    """The report's line for modules whose MACs no rule counted, with their types; None when every one counted."""
    if not uncounted:
        return None
    kinds = ", ".join(f"{n} x{k}" for n, k in sorted(uncounted.items(), key=lambda item: -item[1]))
    return (
        f"{UNCOUNTED_NOTE} for {sum(uncounted.values())} modules with weights ({kinds}): ptflops has no rule for their "
        "type, so the MAC totals and the planner's MAC savings leave them out (their parameters and latency count)"
    )


def is_count_note(note: str) -> bool:
    """Whether ``note`` is :func:`uncounted_note`'s, which a report says in its first lines."""
    return note.startswith(UNCOUNTED_NOTE)


def static_profile(model: nn.Module, input_shape: tuple[int, int, int]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """MACs and parameters of one forward pass at batch size 1.

    Returns ``(total_macs, total_params, {layer_name: (macs, params)})`` where the layers are the
    model's atomic modules plus containers with their own parameters or MACs (see the module
    docstring). ``total_params`` counts every parameter (trainable or not, shared ones once) and the
    packed weights of quantized modules; ``total_macs`` is ptflops' pytorch-backend count plus the
    attention matmuls it misses. MACs are 0 (with a warning) when the forward pass fails.
    """
    details = static_details(model, tuple(input_shape))
    per_layer = {name: (details.macs.get(name, 0), details.params.get(name, 0)) for name in details.layer_names()}
    return details.total_macs, details.total_params, per_layer


def weight_layer_macs(model: nn.Module, example: torch.Tensor) -> dict[type[nn.Module], int]:
    """MACs of ``model``'s Conv2d and of its Linear layers on ``example`` (one forward pass, no grad): a quick count
    by forward hooks, for decisions that need the split or the size, not ptflops' per-layer profile."""
    macs: dict[type[nn.Module], int] = {nn.Conv2d: 0, nn.Linear: 0}

    def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if not isinstance(out, torch.Tensor):
            return
        if isinstance(module, nn.Conv2d):
            macs[nn.Conv2d] += out.numel() * (module.in_channels // module.groups) * math.prod(module.kernel_size)
        elif isinstance(module, nn.Linear):
            macs[nn.Linear] += out.numel() * module.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    try:
        with torch.no_grad():
            model.eval()(example)
    finally:
        for h in handles:
            h.remove()
    return macs


def mac_shares(model: nn.Module, example: torch.Tensor) -> dict[type[nn.Module], float]:
    """The share of ``model``'s Conv2d and Linear MACs on ``example`` each of the two types does."""
    macs = weight_layer_macs(model, example)
    total = sum(macs.values())
    return {kind: count / total for kind, count in macs.items()} if total else {}
