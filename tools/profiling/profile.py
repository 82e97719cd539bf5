"""Static and dynamic profiling of image classifiers.

What is measured, and how:

* **MACs and parameters** (:func:`static_profile`) come from ptflops'
  ``get_model_complexity_info`` with the **pytorch backend**. That backend hooks every supported
  module (Conv, Linear, norms, pools, activations, ...) and so gives per-module numbers; the aten
  backend only attributes MACs to the model's *top-level* children and leaves its forward hooks on
  the model, so it cannot give per-layer figures. Neither backend counts
  ``F.scaled_dot_product_attention`` (what transformers' ViT/Swin use by default) nor the ``@``
  operator, so the attention matmuls are counted here with a :class:`~torch.overrides.TorchFunctionMode`
  running alongside ptflops, added to the total and attributed to the innermost module that calls them
  (e.g. ``vit.layers.0.attention``). Per-layer figures follow ptflops' conventions (a Linear costs
  ``in*out + out`` MACs per position; a Conv2d ``k*k*in/groups*out`` per output position plus the bias).
  Dynamically quantized ``Linear`` modules get the same MACs as the float layer they replace; any other
  module ptflops does not know costs 0 MACs.
* **Per-layer latency** (:func:`module_latencies`) comes from forward pre/post hooks and
  ``time.perf_counter`` (with ``torch.cuda.synchronize`` on CUDA).
* **Operators, peak memory and the Chrome trace** (:func:`operator_profile`) come from
  ``torch.profiler``.

"Layers" are the atomic modules of the model: leaf modules, plus modules that ptflops counts as one
unit (``nn.MultiheadAttention``) or that are quantized (a dynamic quantized ``Linear`` holds a
``_packed_params`` child), plus any container that owns parameters directly (ViT's ``cls_token``) or
does compute of its own (attention matmuls). Figures of a container are *self* figures, excluding
its children, so parameters of all layers add up to the model's total.

Every function leaves the model as it found it: no hooks, no attributes, same training flags.
Forward passes run under ``torch.no_grad`` rather than ``inference_mode``, so a module that caches a
tensor during forward does not end up holding an inference tensor that breaks later fine-tuning.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from tqdm import tqdm

from tools.schemas import LayerGroupProfile, LayerProfile, ModelProfile, OperatorProfile

logger = logging.getLogger(__name__)

__all__ = [
    "group_layers",
    "layer_names",
    "module_latencies",
    "name_pattern",
    "operator_profile",
    "profile_model",
    "static_profile",
]

_MB = 1e6  # the repository reports memory in 10^6 bytes
_MATMUL_NAMES = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm"})
# Operations ptflops' pytorch backend already counts through its patched torch.* functions.
_PTFLOPS_COUNTED_NAMES = frozenset({"matmul", "mm", "bmm", "baddbmm"})
_SDPA_NAME = "scaled_dot_product_attention"


# --------------------------------------------------------------------------------------------
# Module bookkeeping
# --------------------------------------------------------------------------------------------


def _ptflops_mapping() -> dict[type, Callable[..., Any]]:
    try:
        from ptflops.pytorch_ops import MODULES_MAPPING
    except ImportError:  # pragma: no cover - ptflops is a dependency
        return {}
    return dict(MODULES_MAPPING)


def _is_quantized(module: nn.Module) -> bool:
    return type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized"))


def _flops_hook_for(module: nn.Module, mapping: Mapping[type, Callable[..., Any]]) -> Callable[..., Any] | None:
    """The ptflops hook that counts ``module``: its type's, else the nearest base class's."""
    if _is_quantized(module):
        return _quantized_linear_hook if _is_quantized_linear(module) else None
    for cls in type(module).__mro__:
        if cls in mapping:
            return mapping[cls]
        if cls is nn.Module:
            break
    return None


def _is_quantized_linear(module: nn.Module) -> bool:
    return _is_quantized(module) and hasattr(module, "in_features") and hasattr(module, "out_features")


def _quantized_linear_hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
    """ptflops-style hook for (dynamically) quantized Linear: same MACs as the float layer."""
    x = inputs[0] if inputs else None
    out_features = int(getattr(module, "out_features", 0))
    in_features = int(getattr(module, "in_features", 0))
    positions = math.prod(x.shape[:-1]) if isinstance(x, torch.Tensor) else 1
    bias = _call_or_none(module, "bias")
    macs = (in_features * out_features + (out_features if bias is not None else 0)) * positions
    setattr(module, "__flops__", int(getattr(module, "__flops__", 0)) + int(macs))  # noqa: B010


def _call_or_none(module: nn.Module, attr: str) -> torch.Tensor | None:
    value = getattr(module, attr, None)
    if callable(value) and not isinstance(value, nn.Module):
        try:
            value = value()
        except Exception:  # packed params of an exotic module
            return None
    return value if isinstance(value, torch.Tensor) else None


def _quantized_weights(module: nn.Module) -> list[torch.Tensor]:
    """Weights of a quantized module that are not ``nn.Parameter`` (packed params)."""
    if not _is_quantized(module):
        return []
    return [t for t in (_call_or_none(module, "weight"), _call_or_none(module, "bias")) if t is not None]


def _atomic_names(model: nn.Module) -> dict[str, nn.Module]:
    """Modules profiled as a unit: leaves, ptflops-counted modules and quantized modules.

    Descendants of an atomic module are not listed (a dynamic quantized Linear's ``_packed_params``,
    ``nn.MultiheadAttention.out_proj``).
    """
    mapping = _ptflops_mapping()
    atomic: dict[str, nn.Module] = {}
    skip_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        has_children = next(module.children(), None) is not None
        if not has_children or _is_quantized(module) or type(module) in mapping:
            atomic[name] = module
            if has_children:
                skip_prefixes.append(f"{name}." if name else "")
    return atomic


def layer_names(model: nn.Module) -> list[str]:
    """Names of the model's atomic modules (see the module docstring), in registration order."""
    return list(_atomic_names(model))


def _owner_map(model: nn.Module, atomic: Mapping[str, nn.Module]) -> dict[str, str]:
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


def _own_params(
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


def _weights_bytes(model: nn.Module) -> int:
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
def _clean_model(model: nn.Module) -> Iterator[None]:
    """Eval mode inside; on exit the model has exactly its former attributes, hooks and modes."""
    states = _snapshot(model)
    try:
        model.eval()
        yield
    finally:
        _restore(model, states)


def _forward(model: nn.Module, inputs: torch.Tensor) -> Any:
    return model(inputs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    device = torch.device("cpu")
    dtype = torch.float32
    for t in (*model.parameters(), *model.buffers()):
        device = t.device
        if t.is_floating_point():
            dtype = t.dtype
            break
    return device, dtype


# --------------------------------------------------------------------------------------------
# Static profile: MACs and parameters
# --------------------------------------------------------------------------------------------


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
class _StaticDetails:
    total_macs: int
    total_params: int
    macs: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    output_shapes: dict[str, list[int]] = field(default_factory=dict)
    atomic: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)

    def layer_names(self) -> list[str]:
        """Atomic modules and containers with their own parameters or MACs, in registration order."""
        atomic = set(self.atomic)
        return [n for n in self.types if n in atomic or self.params.get(n, 0) or self.macs.get(n, 0)]


def _static_details(model: nn.Module, input_shape: tuple[int, ...]) -> _StaticDetails:
    from ptflops import get_model_complexity_info

    mapping = _ptflops_mapping()
    atomic = _atomic_names(model)
    owners = _owner_map(model, atomic)
    params, total_params = _own_params(model, atomic, owners)
    names_by_id = {id(m): n for n, m in model.named_modules()}
    types = {n: type(m).__name__ for n, m in model.named_modules()}

    # Custom hooks for every atomic module type: ptflops' own hook (found via the MRO, so
    # subclasses of nn.Linear etc. count too) wrapped to record each module's MACs.
    per_module: dict[str, int] = {}
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

    device, dtype = _model_device_dtype(model)

    def make_input(res: tuple[int, ...]) -> torch.Tensor:
        # deterministic, non-constant values without touching the global RNG
        numel = math.prod(res)
        return torch.linspace(-1.0, 1.0, numel, dtype=dtype, device=device).reshape(1, *res)

    # Module stack for the attention counter, and output shapes.
    stack: list[str] = []
    output_shapes: dict[str, list[int]] = {}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def pre(name: str) -> Callable[..., None]:
        def f(module: nn.Module, args: tuple[Any, ...]) -> None:
            stack.append(owners.get(name, name))

        return f

    def post(name: str) -> Callable[..., None]:
        def f(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if stack:
                stack.pop()
            out = _first_tensor(output)
            if out is not None and name not in output_shapes:
                output_shapes[name] = list(out.shape)

        return f

    counter = _AttentionMacCounter(stack, skip=hooked)
    captured = io.StringIO()
    ptflops_macs: int | None = None
    with _clean_model(model):
        try:
            for name, module in model.named_modules():
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name), always_call=True))
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

    macs: dict[str, int] = defaultdict(int)
    for name, value in per_module.items():
        macs[owners.get(name, name)] += value
    for name, value in counter.attributed.items():
        macs[name] += value
    total_macs = (ptflops_macs + counter.extra) if ptflops_macs is not None else 0
    if ptflops_macs is None:
        macs = defaultdict(int)
    return _StaticDetails(
        total_macs=total_macs,
        total_params=total_params,
        macs=dict(macs),
        params=params,
        output_shapes=output_shapes,
        atomic=list(atomic),
        types=types,
    )


def static_profile(model: nn.Module, input_shape: tuple[int, int, int]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """MACs and parameters of one forward pass at batch size 1.

    Returns ``(total_macs, total_params, {layer_name: (macs, params)})`` where the layers are the
    model's atomic modules plus containers with their own parameters or MACs (see the module
    docstring). ``total_params`` counts every parameter (trainable or not, shared ones once) and the
    packed weights of quantized modules; ``total_macs`` is ptflops' pytorch-backend count plus the
    attention matmuls it misses. MACs are 0 (with a warning) when the forward pass fails.
    """
    details = _static_details(model, tuple(input_shape))
    per_layer = {name: (details.macs.get(name, 0), details.params.get(name, 0)) for name in details.layer_names()}
    return details.total_macs, details.total_params, per_layer


# --------------------------------------------------------------------------------------------
# Dynamic profile: latencies
# --------------------------------------------------------------------------------------------


def module_latencies(
    model: nn.Module,
    example_inputs: torch.Tensor,
    *,
    warmup: int = 1,
    iters: int = 3,
    modules: Iterable[str] | None = None,
) -> dict[str, float]:
    """Mean forward latency (seconds per forward pass of the model) of each listed module.

    ``modules`` defaults to the atomic modules (:func:`layer_names`). Times are inclusive of the
    module's children and summed over repeated calls within one pass. Hooks are removed afterwards.
    """
    names = list(modules) if modules is not None else layer_names(model)
    by_name = dict(model.named_modules())
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"no such modules: {missing[:5]}")
    device = example_inputs.device
    totals: dict[str, float] = dict.fromkeys(names, 0.0)
    starts: dict[str, list[float]] = defaultdict(list)
    recording = [False]

    def pre(name: str) -> Callable[..., None]:
        def f(module: nn.Module, args: tuple[Any, ...]) -> None:
            if recording[0]:
                _sync(device)
                starts[name].append(time.perf_counter())

        return f

    def post(name: str) -> Callable[..., None]:
        def f(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if recording[0] and starts[name]:
                _sync(device)
                totals[name] += time.perf_counter() - starts[name].pop()

        return f

    handles: list[torch.utils.hooks.RemovableHandle] = []
    with _clean_model(model), torch.no_grad():
        try:
            for name in names:
                module = by_name[name]
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name), always_call=True))
            for _ in range(max(0, warmup)):
                _forward(model, example_inputs)
            recording[0] = True
            n = max(1, iters)
            for _ in range(n):
                _forward(model, example_inputs)
            _sync(device)
        finally:
            recording[0] = False
            for handle in handles:
                handle.remove()
    return {name: total / n for name, total in totals.items()}


def _model_latency(model: nn.Module, example_inputs: torch.Tensor, *, warmup: int, iters: int) -> float:
    device = example_inputs.device
    with _clean_model(model), torch.no_grad():
        for _ in range(max(0, warmup)):
            _forward(model, example_inputs)
        _sync(device)
        n = max(1, iters)
        start = time.perf_counter()
        for _ in range(n):
            _forward(model, example_inputs)
        _sync(device)
        return (time.perf_counter() - start) / n


# --------------------------------------------------------------------------------------------
# Operator profile
# --------------------------------------------------------------------------------------------


def _cpu_activity_peak_bytes(prof: Any) -> int:
    """Peak of (allocated - freed) CPU bytes over the profiled window, from the memory records."""
    try:
        results = prof.profiler.kineto_results
        records = [e for e in results.events() if e.name() == "[memory]"]
    except Exception:  # private API; degrade to 0
        logger.debug("no memory records in the profiler results", exc_info=True)
        return 0
    cpu_types = {"DeviceType.CPU", "DeviceType.MKLDNN", "DeviceType.IDEEP"}
    records.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for rec in records:
        if str(rec.device_type()) not in cpu_types:
            continue
        current += int(rec.nbytes())
        peak = max(peak, current)
    return peak


def _export_trace(prof: Any, trace_path: Path) -> None:
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace_path.with_name(f".tmp-{os.getpid()}-{trace_path.name}")
    try:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, trace_path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Kineto prints 'USDT: ... profiler_start/stop' from C++ on every profile: send fd 2 to /dev/null meanwhile."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def operator_profile(
    model: nn.Module,
    example_inputs: torch.Tensor,
    *,
    iters: int = 3,
    trace_path: Path | None = None,
    warmup: int = 1,
    top_k: int = 40,
) -> tuple[list[OperatorProfile], float]:
    """Top operators by self CPU time, and peak memory, from ``torch.profiler``.

    Times, memory figures and counts are per forward pass (averaged over ``iters``); operators are
    grouped by input shapes. ``peak_memory_mb`` (10^6 bytes) is, on CUDA, ``max_memory_allocated``
    during the passes; on CPU, the model's weights and buffers plus the peak of memory allocated
    and not yet freed during a pass. A Chrome trace is written atomically to ``trace_path``.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    device = example_inputs.device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    n = max(1, iters)
    with _clean_model(model), torch.no_grad():
        for _ in range(max(0, warmup)):
            _forward(model, example_inputs)
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with _native_stderr_muted(), profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
            for _ in range(n):
                with record_function("ProfilingAgent::forward"):
                    _forward(model, example_inputs)
                _sync(device)
        if device.type == "cuda":
            peak_bytes = torch.cuda.max_memory_allocated(device)
        else:
            peak_bytes = _weights_bytes(model) + _cpu_activity_peak_bytes(prof)

    events = list(prof.key_averages(group_by_input_shape=True))
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    operators = [
        OperatorProfile(
            name=str(e.key),
            count=max(1, round(e.count / n)),
            self_cpu_time_s=e.self_cpu_time_total / 1e6 / n,
            cpu_time_total_s=e.cpu_time_total / 1e6 / n,
            self_cpu_memory_mb=e.self_cpu_memory_usage / _MB / n,
            cpu_memory_mb=e.cpu_memory_usage / _MB / n,
            self_device_time_s=getattr(e, "self_device_time_total", 0) / 1e6 / n,
            device_time_total_s=getattr(e, "device_time_total", 0) / 1e6 / n,
            input_shapes=str(e.input_shapes) if e.input_shapes else "",
        )
        for e in events[: max(0, top_k)]
    ]
    if trace_path is not None:
        _export_trace(prof, Path(trace_path))
    return operators, peak_bytes / _MB


# --------------------------------------------------------------------------------------------
# Grouping
# --------------------------------------------------------------------------------------------


def _template(name: str) -> tuple[str, ...]:
    return tuple("#" if part.isdigit() else part for part in name.split(".")) if name else ()


def _generic_pattern(template: tuple[str, ...]) -> str:
    return "^" + r"\.".join(r"\d+" if part == "#" else re.escape(part) for part in template) + "$"


def name_pattern(name: str) -> str:
    """Anchored regex selecting ``name`` and its siblings in other blocks (numeric components generalised)."""
    return _generic_pattern(_template(name))


def group_layers(layers: list[LayerProfile]) -> list[LayerGroupProfile]:
    """Aggregate layers that repeat across blocks.

    Layers whose names differ only in numeric components (``vit.layers.0.mlp.fc1``,
    ``vit.layers.1.mlp.fc1``) and that have the same type form a group with the pattern
    ``^vit\\.layers\\.\\d+\\.mlp\\.fc1$``. When the generic pattern would also select layers outside
    the group (``features.0`` Conv2d vs ``features.1`` ReLU), the pattern lists the members instead.
    Layers that do not repeat form groups of one. Shares are sums of the members' shares, i.e.
    shares of the model totals. Sorted by latency share, then MACs share, descending.
    """
    by_key: dict[tuple[tuple[str, ...], str], list[LayerProfile]] = defaultdict(list)
    by_template: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for layer in layers:
        template = _template(layer.name)
        by_key[(template, layer.type)].append(layer)
        by_template[template].add(layer.name)

    groups: list[LayerGroupProfile] = []
    for (template, type_name), members in by_key.items():
        member_names = {m.name for m in members}
        if by_template[template] == member_names:
            pattern = _generic_pattern(template)
        else:
            pattern = "^(?:" + "|".join(re.escape(m.name) for m in members) + ")$"
        groups.append(
            LayerGroupProfile(
                pattern=pattern,
                type=type_name,
                count=len(members),
                params=sum(m.params for m in members),
                macs=sum(m.macs for m in members),
                latency_s=sum(m.latency_s for m in members),
                latency_share=sum(m.latency_share for m in members),
                macs_share=sum(m.macs_share for m in members),
                params_share=sum(m.params_share for m in members),
            )
        )
    groups.sort(key=lambda g: (-g.latency_share, -g.macs_share, g.pattern))
    return groups


# --------------------------------------------------------------------------------------------
# Everything together
# --------------------------------------------------------------------------------------------


def _self_latencies(
    model: nn.Module,
    example_inputs: torch.Tensor,
    names: list[str],
    atomic: set[str],
    *,
    warmup: int,
    iters: int,
) -> dict[str, float]:
    """Latency of each layer; a container's is its own time, excluding its direct children."""
    by_name = dict(model.named_modules())
    children: dict[str, list[str]] = {}
    for name in names:
        if name in atomic:
            continue
        prefix = f"{name}." if name else ""
        children[name] = [prefix + child for child, _ in by_name[name].named_children()]
    timed = list(dict.fromkeys([*names, *(c for cs in children.values() for c in cs)]))
    inclusive = module_latencies(model, example_inputs, warmup=warmup, iters=iters, modules=timed)
    result = {}
    for name in names:
        value = inclusive.get(name, 0.0)
        if name in children:
            value = max(0.0, value - sum(inclusive.get(c, 0.0) for c in children[name]))
        result[name] = value
    return result


def _share(part: float, total: float) -> float:
    return float(part) / float(total) if total > 0 else 0.0


def profile_model(
    model: nn.Module,
    example_inputs: torch.Tensor,
    *,
    family: str = "",
    warmup: int = 1,
    iters: int = 3,
    trace_path: Path | None = None,
    progress: bool = False,
) -> ModelProfile:
    """Profile ``model`` on ``example_inputs[:1]`` (batch size 1): MACs, params, latencies, operators.

    ``latency_s`` is the mean whole-model forward latency measured without hooks; layer latencies
    come from a separate hooked run and their shares are relative to the hooked run's total. MACs/params
    shares are relative to the model totals. The model is left unchanged (hooks, attributes, modes).
    """
    x = example_inputs[:1]
    input_shape = tuple(int(s) for s in x.shape[1:])
    started = time.perf_counter()

    bar = tqdm(total=4, desc="profile", unit="stage", disable=not progress, leave=False)
    bar.set_postfix_str("MACs and parameters (ptflops)")
    details = _static_details(model, input_shape)
    names = details.layer_names()
    t_static = time.perf_counter()
    bar.update()
    bar.set_postfix_str("per-layer latency (hooks)")
    latencies = _self_latencies(model, x, names, set(details.atomic), warmup=warmup, iters=iters)
    t_layers = time.perf_counter()
    bar.update()
    bar.set_postfix_str("model latency")
    latency_s = _model_latency(model, x, warmup=0, iters=iters)
    t_latency = time.perf_counter()
    bar.update()
    bar.set_postfix_str("operators (torch.profiler)")
    operators, peak_mb = operator_profile(model, x, iters=iters, trace_path=trace_path, warmup=0)
    bar.update()
    bar.close()
    t_ops = time.perf_counter()

    # shares of the hooked forward: self-latencies add up to it, while `latency_s` (timed without hooks) is
    # smaller by the hooks' overhead, which dominates on tiny models
    hooked_total = sum(latencies.get(name, 0.0) for name in names)
    layers = []
    for name in names:
        macs = details.macs.get(name, 0)
        params = details.params.get(name, 0)
        latency = latencies.get(name, 0.0)
        layers.append(
            LayerProfile(
                name=name,
                type=details.types.get(name, ""),
                params=params,
                macs=macs,
                latency_s=latency,
                latency_share=_share(latency, hooked_total),
                macs_share=_share(macs, details.total_macs),
                params_share=_share(params, details.total_params),
                output_shape=details.output_shapes.get(name),
            )
        )
    logger.info(
        "profiled %s: %d layers, %.3g MACs, %d params, %.4f s/forward "
        "(static %.1fs, layers %.1fs, latency %.1fs, operators %.1fs)",
        type(model).__name__,
        len(layers),
        details.total_macs,
        details.total_params,
        latency_s,
        t_static - started,
        t_layers - t_static,
        t_latency - t_layers,
        t_ops - t_latency,
    )
    return ModelProfile(
        model_class=type(model).__name__,
        family=family,
        device=str(example_inputs.device),
        input_shape=list(input_shape),
        total_params=details.total_params,
        total_macs=details.total_macs,
        latency_s=latency_s,
        peak_memory_mb=peak_mb,
        layers=layers,
        groups=group_layers(layers),
        operators=operators,
        trace_path=str(trace_path) if trace_path is not None else None,
    )
