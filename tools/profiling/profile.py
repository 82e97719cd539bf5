"""The whole profile of an image classifier, and grouping of layers that repeat across blocks.

:func:`profile_model` assembles a :class:`~tools.schemas.ModelProfile` from the stages of the package:

* :mod:`tools.profiling.modules`: which modules are "layers", and leaving the model as it was found;
* :mod:`tools.profiling.static`: MACs and parameters (ptflops plus an attention-matmul counter);
* :mod:`tools.profiling.dynamic`: per-layer and model latency (hooks), operators, peak memory and the
  Chrome trace (``torch.profiler``).

:func:`group_layers` and :func:`name_pattern` turn layer names into regex patterns that select a layer and
its siblings in the other blocks (``^vit\\.layers\\.\\d+\\.mlp\\.fc1$``).
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from tools.profiling.dynamic import model_latency, operator_profile, self_latencies
from tools.profiling.static import StaticDetails, static_details
from tools.schemas import LayerGroupProfile, LayerProfile, ModelProfile, OperatorProfile

logger = logging.getLogger(__name__)

__all__ = ["exact_pattern", "group_layers", "name_pattern", "profile_model"]


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


def _share(part: float, total: float) -> float:
    return float(part) / float(total) if total > 0 else 0.0


def _layer_profiles(details: StaticDetails, names: list[str], latencies: dict[str, float]) -> list[LayerProfile]:
    """Each layer's exact counts and timed latency, with their shares: latency of the hooked forward (self-latencies
    add up to it, while the model's ``latency_s``, timed without hooks, is smaller by the hooks' overhead, which
    dominates on tiny models), MACs and parameters of the model's totals."""
    hooked_total = sum(latencies.get(name, 0.0) for name in names)
    return [
        LayerProfile(
            name=name,
            type=details.types.get(name, ""),
            params=details.params.get(name, 0),
            macs=details.macs.get(name, 0),
            latency_s=latencies.get(name, 0.0),
            latency_share=_share(latencies.get(name, 0.0), hooked_total),
            macs_share=_share(details.macs.get(name, 0), details.total_macs),
            params_share=_share(details.params.get(name, 0), details.total_params),
            output_shape=details.output_shapes.get(name),
        )
        for name in names
    ]


def _grouped_conv_macs(model: nn.Module, details: StaticDetails) -> int:
    """MACs of the grouped (e.g. depthwise) convolutions, which some runtimes run far slower than their count."""
    return sum(
        details.macs.get(name, 0)
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d) and module.groups > 1
    )


@dataclass
class _Stages:
    """What the profiling stages measured, and each stage's seconds (static, layers, latency, operators)."""

    details: StaticDetails
    names: list[str]
    latencies: dict[str, float]
    latency_s: float
    operators: list[OperatorProfile]
    peak_mb: float
    seconds: tuple[float, float, float, float]


def _measure_stages(
    model: nn.Module,
    x: torch.Tensor,
    input_shape: tuple[int, ...],
    *,
    warmup: int,
    iters: int,
    trace_path: Path | None,
    progress: bool,
) -> _Stages:
    """The four stages on the batch-1 input ``x``, under a progress bar: counts, layer and model latency, operators."""
    started = time.perf_counter()
    bar = tqdm(total=4, desc="profile", unit="stage", disable=not progress, leave=False)
    bar.set_postfix_str("MACs and parameters (ptflops)")
    details = static_details(model, input_shape)
    names = details.layer_names()
    t_static = time.perf_counter()
    bar.update()
    bar.set_postfix_str("per-layer latency (hooks)")
    latencies = self_latencies(model, x, names, set(details.atomic), warmup=warmup, iters=iters)
    t_layers = time.perf_counter()
    bar.update()
    bar.set_postfix_str("model latency")
    latency_s = model_latency(model, x, warmup=0, iters=iters)
    t_latency = time.perf_counter()
    bar.update()
    bar.set_postfix_str("operators (torch.profiler)")
    operators, peak_mb = operator_profile(model, x, iters=min(iters, 3), trace_path=trace_path, warmup=0)
    bar.update()
    bar.close()
    t_ops = time.perf_counter()
    seconds = (t_static - started, t_layers - t_static, t_latency - t_layers, t_ops - t_latency)
    return _Stages(details, names, latencies, latency_s, operators, peak_mb, seconds)


def profile_model(
    model: nn.Module,
    example_inputs: torch.Tensor,
    *,
    family: str = "",
    attention: bool = False,
    warmup: int = 1,
    iters: int = 5,
    trace_path: Path | None = None,
    progress: bool = False,
) -> ModelProfile:
    """Profile ``model`` on ``example_inputs[:1]`` (batch size 1): MACs, params, latencies, operators.

    ``latency_s`` is the median whole-model forward latency over ``iters`` passes measured without hooks;
    layer latencies are medians over ``iters`` passes of a separate hooked run and their shares are relative
    to the hooked run's total; the operator profile (``torch.profiler``) averages at most 3 passes. MACs and
    params (and their shares, relative to the model totals) are exact and the same on every run; timed
    figures are not, which is why the rules planner decides on MACs and parameters only. The model is left
    unchanged (hooks, attributes, modes). ``family`` and ``attention`` (the model has attention modules:
    ``tools.compression.heads.has_attention``) are recorded as given.
    """
    x = example_inputs[:1]
    input_shape = tuple(int(s) for s in x.shape[1:])
    stages = _measure_stages(
        model, x, input_shape, warmup=warmup, iters=iters, trace_path=trace_path, progress=progress
    )
    details = stages.details
    layers = _layer_profiles(details, stages.names, stages.latencies)
    logger.info(
        "profiled %s: %d layers, %.3g MACs, %d params, %.4f s/forward "
        "(static %.1fs, layers %.1fs, latency %.1fs, operators %.1fs)",
        type(model).__name__,
        len(layers),
        details.total_macs,
        details.total_params,
        stages.latency_s,
        *stages.seconds,
    )
    return ModelProfile(
        model_class=type(model).__name__,
        family=family,
        device=str(example_inputs.device),
        input_shape=list(input_shape),
        total_params=details.total_params,
        total_macs=details.total_macs,
        grouped_conv_macs=_grouped_conv_macs(model, details),
        attention=attention,
        latency_s=stages.latency_s,
        peak_memory_mb=stages.peak_mb,
        layers=layers,
        groups=group_layers(layers),
        operators=stages.operators,
        trace_path=str(trace_path) if trace_path is not None else None,
        uncounted_macs=details.uncounted,
    )


def exact_pattern(members: list[str], universe: list[str]) -> str:
    """A regex selecting exactly ``members`` among ``universe``: block indices generalised where possible."""
    wanted = set(members)

    def exact(pattern: str) -> bool:
        rx = re.compile(pattern)
        return {n for n in universe if rx.search(n)} | wanted == wanted and all(rx.search(n) for n in wanted)

    generic = name_pattern(members[0])
    if exact(generic):
        return generic
    parts = [m.split(".") for m in members]
    for i, part in enumerate(parts[0]):
        # only a position every member has and where each has an index: members may differ in depth
        # (EfficientNet's encoder.blocks.N.projection.project_conv with encoder.top_conv)
        if not part.isdigit() or any(len(p) != len(parts[0]) or not p[i].isdigit() for p in parts):
            continue
        values = sorted({p[i] for p in parts}, key=int)
        pieces = [
            ("(?:" + "|".join(values) + ")") if j == i else (r"\d+" if piece.isdigit() else re.escape(piece))
            for j, piece in enumerate(parts[0])
        ]
        candidate = "^" + r"\.".join(pieces) + "$"
        if exact(candidate):
            return candidate
    return "^(?:" + "|".join(re.escape(m) for m in sorted(wanted)) + ")$"
