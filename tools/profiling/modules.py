"""Module bookkeeping shared by the static and dynamic profiles: what a layer is, and leaving the model untouched.

"Layers" are the atomic modules of the model: leaf modules, plus modules that ptflops counts as one
unit (``nn.MultiheadAttention``) or that are quantized (a dynamic quantized ``Linear`` holds a
``_packed_params`` child), plus any container that owns parameters directly (ViT's ``cls_token``) or
does compute of its own (attention matmuls). Figures of a container are *self* figures, excluding
its children, so parameters of all layers add up to the model's total.

Every profiling function leaves the model as it found it (:func:`clean_model`): no hooks, no
attributes, same training flags. Forward passes run under ``torch.no_grad`` rather than
``inference_mode``, so a module that caches a tensor during forward does not end up holding an
inference tensor that breaks later fine-tuning.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "atomic_modules",
    "call_or_none",
    "clean_model",
    "first_tensor",
    "forward",
    "is_quantized",
    "is_quantized_linear",
    "layer_names",
    "model_device_dtype",
    "own_params",
    "owner_map",
    "ptflops_mapping",
    "ptflops_type",
    "sync",
    "weights_bytes",
]


# --------------------------------------------------------------------------------------------
# Which modules are layers, and who owns what
# --------------------------------------------------------------------------------------------


def ptflops_mapping() -> dict[type, Callable[..., Any]]:
    """ptflops' module type -> MAC-counting hook table (empty if ptflops is missing)."""
    try:
        from ptflops.pytorch_ops import MODULES_MAPPING
    except ImportError:  # pragma: no cover - ptflops is a dependency
        return {}
    return dict(MODULES_MAPPING)


def ptflops_type(module: nn.Module, mapping: Mapping[type, Any]) -> type | None:
    """The class of ``mapping`` that counts ``module``: its own, else the nearest base class's (a
    ``Conv2dStaticSamePadding(nn.Conv2d)`` that pads through a child module is counted as a Conv2d); None if none."""
    for cls in type(module).__mro__:
        if cls in mapping:
            return cls
        if cls is nn.Module:
            break
    return None


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's quantized module classes."""
    return type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized"))


def is_quantized_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a quantized module with Linear-like ``in_features``/``out_features``."""
    return is_quantized(module) and hasattr(module, "in_features") and hasattr(module, "out_features")


def call_or_none(module: nn.Module, attr: str) -> torch.Tensor | None:
    """``module.<attr>`` as a tensor, calling it first when it is a method (packed params); else None."""
    value = getattr(module, attr, None)
    if callable(value) and not isinstance(value, nn.Module):
        try:
            value = value()
        except Exception:  # packed params of an exotic module
            return None
    return value if isinstance(value, torch.Tensor) else None


def _quantized_weights(module: nn.Module) -> list[torch.Tensor]:
    """Weights of a quantized module that are not ``nn.Parameter`` (packed params)."""
    if not is_quantized(module):
        return []
    return [t for t in (call_or_none(module, "weight"), call_or_none(module, "bias")) if t is not None]


def atomic_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules profiled as a unit: leaves, ptflops-counted modules and quantized modules.

    Descendants of an atomic module are not listed (a dynamic quantized Linear's ``_packed_params``,
    ``nn.MultiheadAttention.out_proj``).
    """
    mapping = ptflops_mapping()
    atomic: dict[str, nn.Module] = {}
    skip_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        has_children = next(module.children(), None) is not None
        if not has_children or is_quantized(module) or ptflops_type(module, mapping) is not None:
            atomic[name] = module
            if has_children:
                skip_prefixes.append(f"{name}." if name else "")
    return atomic


def layer_names(model: nn.Module) -> list[str]:
    """Names of the model's atomic modules (see the module docstring), in registration order."""
    return list(atomic_modules(model))


def owner_map(model: nn.Module, atomic: Mapping[str, nn.Module]) -> dict[str, str]:
    """Module name -> the name its compute is charged to (itself, or its atomic ancestor)."""
    owners: dict[str, str] = {}
    for name, _ in model.named_modules():
        owner = name
        parts = name.split(".") if name else []
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in atomic:
                owner = prefix
                break
        owners[name] = owner
    return owners


def own_params(
    model: nn.Module, atomic: Mapping[str, nn.Module], owners: Mapping[str, str]
) -> tuple[dict[str, int], int]:
    """Parameters charged to each owner module (shared tensors counted once) and the total."""
    counts: dict[str, int] = defaultdict(int)
    seen: dict[int, torch.Tensor] = {}  # keeps unpacked quantized weights alive so ids stay unique
    for name, module in model.named_modules():
        owner = owners.get(name, name)
        tensors = list(module.parameters(recurse=False)) + _quantized_weights(module)
        for t in tensors:
            if id(t) in seen:
                continue
            seen[id(t)] = t
            counts[owner] += t.numel()
    return dict(counts), sum(counts.values())


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters, buffers and packed quantized weights (shared tensors once)."""
    total = 0
    seen: dict[int, torch.Tensor] = {}  # keeps unpacked quantized weights alive so ids stay unique
    for module in model.modules():
        tensors = [
            *module.parameters(recurse=False),
            *module.buffers(recurse=False),
            *_quantized_weights(module),
        ]
        for t in tensors:
            if id(t) not in seen:
                seen[id(t)] = t
                total += t.numel() * t.element_size()
    return total


# --------------------------------------------------------------------------------------------
# Leaving the model as it was found
# --------------------------------------------------------------------------------------------


@dataclass
class _ModuleState:
    dict_keys: set[str]
    hook_keys: dict[str, set[int]]
    training: bool


# What ptflops' pytorch backend sets on modules (and does not always remove).
_PTFLOPS_ATTRS = frozenset(
    {
        "start_flops_count",
        "stop_flops_count",
        "reset_flops_count",
        "compute_average_flops_cost",
        "accumulate_flops",
        "accumulate_params",
        "original_extra_repr",
        "extra_repr",
    }
)

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _snapshot(model: nn.Module) -> dict[int, _ModuleState]:
    states: dict[int, _ModuleState] = {}
    for module in model.modules():
        hooks = {attr: set(getattr(module, attr, {}).keys()) for attr in _HOOK_DICTS}
        states[id(module)] = _ModuleState(set(module.__dict__), hooks, module.training)
    return states


def _restore(model: nn.Module, states: Mapping[int, _ModuleState]) -> None:
    """Remove whatever attributes/hooks appeared since :func:`_snapshot`, restore training flags."""
    for module in model.modules():
        state = states.get(id(module))
        if state is None:
            continue
        for key in set(module.__dict__) - state.dict_keys:
            if key in _PTFLOPS_ATTRS or (key.startswith("__") and key.endswith("__")):
                del module.__dict__[key]
            else:  # something the model's own forward cached: keep it
                logger.debug("attribute %s appeared on %s during profiling", key, type(module).__name__)
        for attr, keys in state.hook_keys.items():
            hooks = getattr(module, attr, None)
            if hooks is None:
                continue
            for key in set(hooks.keys()) - keys:
                del hooks[key]
        module.training = state.training


@contextlib.contextmanager
def clean_model(model: nn.Module) -> Iterator[None]:
    """Eval mode inside; on exit the model has exactly its former attributes, hooks and modes."""
    states = _snapshot(model)
    try:
        model.eval()
        yield
    finally:
        _restore(model, states)


# --------------------------------------------------------------------------------------------
# Running the model
# --------------------------------------------------------------------------------------------


def forward(model: nn.Module, inputs: torch.Tensor) -> Any:
    """One forward pass of ``model`` on ``inputs``."""
    return model(inputs)


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work on ``device`` (no-op elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor in a (nested) module output: a tensor, a mapping's values, or a list/tuple."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device of the model's first tensor and dtype of its first floating-point one (cpu/float32 default)."""
    device = torch.device("cpu")
    dtype = torch.float32
    for t in (*model.parameters(), *model.buffers()):
        device = t.device
        if t.is_floating_point():
            dtype = t.dtype
            break
    return device, dtype
