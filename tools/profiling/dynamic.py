"""Dynamic profile: per-layer and whole-model latency, operators, peak memory and the Chrome trace.

* **Per-layer latency** (:func:`module_latencies`) comes from forward pre/post hooks and
  ``time.perf_counter`` (with ``torch.cuda.synchronize`` on CUDA): the median over the timed passes, as is
  the whole-model latency (:func:`model_latency`), so that one descheduled pass does not move a share.
* **Operators, peak memory and the Chrome trace** (:func:`operator_profile`) come from
  ``torch.profiler``.

Forward passes run under ``torch.no_grad`` and the model is left unchanged (see :mod:`tools.profiling.modules`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.profiling.modules import clean_model, forward, layer_names, sync, weights_bytes
from tools.schemas import OperatorProfile

logger = logging.getLogger(__name__)

__all__ = ["model_latency", "module_latencies", "operator_profile", "self_latencies"]

_MB = 1e6  # the repository reports memory in 10^6 bytes


# --------------------------------------------------------------------------------------------
# Latencies
# --------------------------------------------------------------------------------------------


def module_latencies(
    model: nn.Module,
    example_inputs: torch.Tensor,
    *,
    warmup: int = 1,
    iters: int = 3,
    modules: Iterable[str] | None = None,
) -> dict[str, float]:
    """Median forward latency (seconds per forward pass of the model) of each listed module over ``iters`` passes.

    ``modules`` defaults to the atomic modules (:func:`layer_names`). Times are inclusive of the
    module's children and summed over repeated calls within one pass. Hooks are removed afterwards.
    """
    names = list(modules) if modules is not None else layer_names(model)
    by_name = dict(model.named_modules())
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"no such modules: {missing[:5]}")
    timer = _HookTimer(example_inputs.device, dict.fromkeys(names, 0.0))
    passes: dict[str, list[float]] = {name: [] for name in names}
    handles: list[torch.utils.hooks.RemovableHandle] = []
    with clean_model(model), torch.no_grad():
        try:
            for name in names:
                module = by_name[name]
                handles.append(module.register_forward_pre_hook(timer.pre(name)))
                handles.append(module.register_forward_hook(timer.post(name), always_call=True))
            for _ in range(max(0, warmup)):
                forward(model, example_inputs)
            timer.recording = True
            for _ in range(max(1, iters)):
                timer.totals.update(dict.fromkeys(names, 0.0))
                forward(model, example_inputs)
                sync(timer.device)
                for name, total in timer.totals.items():
                    passes[name].append(total)
        finally:
            timer.recording = False
            for handle in handles:
                handle.remove()
    return {name: statistics.median(times) for name, times in passes.items()}


@dataclass
class _HookTimer:
    """Forward pre/post hooks that add each module's time to ``totals`` while ``recording`` (the pass being timed)."""

    device: torch.device
    totals: dict[str, float]
    starts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    recording: bool = False

    def pre(self, name: str) -> Callable[..., None]:
        """A forward pre-hook that notes when ``name`` starts."""

        def f(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.recording:
                sync(self.device)
                self.starts[name].append(time.perf_counter())

        return f

    def post(self, name: str) -> Callable[..., None]:
        """A forward hook that adds the time since ``name`` started to its total."""

        def f(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.recording and self.starts[name]:
                sync(self.device)
                self.totals[name] += time.perf_counter() - self.starts[name].pop()

        return f


def model_latency(model: nn.Module, example_inputs: torch.Tensor, *, warmup: int, iters: int) -> float:
    """Median seconds per whole-model forward pass over ``iters`` passes, timed without hooks."""
    device = example_inputs.device
    times = []
    with clean_model(model), torch.no_grad():
        for _ in range(max(0, warmup)):
            forward(model, example_inputs)
        sync(device)
        for _ in range(max(1, iters)):
            start = time.perf_counter()
            forward(model, example_inputs)
            sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def self_latencies(
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
    """Top operators by self time (CPU time; on CUDA, device time), and peak memory, from ``torch.profiler``.

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
    with clean_model(model), torch.no_grad():
        for _ in range(max(0, warmup)):
            forward(model, example_inputs)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with _native_stderr_muted(), profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
            for _ in range(n):
                with record_function("ProfilingAgent::forward"):
                    forward(model, example_inputs)
                sync(device)
        if device.type == "cuda":
            peak_bytes = torch.cuda.max_memory_allocated(device)
        else:
            peak_bytes = weights_bytes(model) + _cpu_activity_peak_bytes(prof)

    events = list(prof.key_averages(group_by_input_shape=True))
    # on a GPU the kernels' time is what costs; the CPU's there is mostly launching them
    on_gpu = device.type == "cuda"
    events.sort(key=lambda e: -(getattr(e, "self_device_time_total", 0) if on_gpu else e.self_cpu_time_total))
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
