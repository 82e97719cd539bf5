"""Distillation from cached activations: what runs before the first layer pruning changed runs once per view of an
image, not once per step.

A pruned student computes exactly what the original computes up to the first module pruning changed (its shapes,
its class or its children), give or take the repair's recalibrated statistics. :func:`find_cut` finds the last
module that finishes before that one starts (the *cut*), checks on a few images that the student's logits from the
cut's output alone are its logits, and :class:`ViewCache` keeps, for a few fixed views of every image (the first as
it is, the others flipped and shifted as distillation augments), the student's output at the cut and the teacher's
logits and block outputs. A step then runs only the student's layers after the cut, forward and backward: the
modules before it (and the cut) return their cached or recorded-shape outputs, and stay as they are (frozen).

Where :class:`tools.compression.prefix.PrefixCache` replays the original's outputs on one calibration batch for the
sensitivity probes (every module before the change cached, values compared), this caches one module's output for
every view of every training image, and finds the change by structure: a repair's recalibrated statistics differ
by value everywhere. Not every model can be cut: the check compares logits and takes the next candidate, or none
(then distillation runs every layer as before). Caching is used only where it is estimated :data:`MIN_SPEEDUP`
faster (the prefix's share of a forward pass timed), and only within :data:`CACHE_BYTES`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from tools.compression.forward import forward_logits
from tools.compression.prefix import outermost_before

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_BYTES",
    "MAX_VIEWS",
    "MIN_SPEEDUP",
    "USES_PER_VIEW",
    "PrefixCut",
    "ViewCache",
    "changed_modules",
    "find_cut",
    "plan_cache",
    "views_for",
]

#: The most memory the cached views may take (the prefix outputs, the teacher's logits and block outputs).
CACHE_BYTES = 2 * 2**30
#: Each cached view is drawn about this many times over the steps ...
USES_PER_VIEW = 3
#: ... with at most this many views of an image (the first as it is).
MAX_VIEWS = 8
#: Caching is used where a step's estimated cost falls by at least this factor (caching itself counted).
MIN_SPEEDUP = 1.5
#: How many candidate cuts (latest first) are checked before giving up.
CANDIDATES = 6


class _Stop(Exception):
    """Raised by the cut's hook to end a forward pass that only wants the cut's output."""


def _own_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    return {name: tuple(t.shape) for name, t in tensors if t is not None and t.is_floating_point()}


def _has_parameters(*modules: nn.Module) -> bool:
    return any(True for m in modules for _ in m.parameters(recurse=False))


def changed_modules(student: nn.Module, teacher: nn.Module) -> set[str]:
    """Names of the student's modules that pruning changed against the teacher: missing there, of another class
    where either holds parameters (a parameterless shortcut rewritten as an equivalent one has nothing to train),
    with other children, or with parameters or floating-point buffers of other shapes (values are not compared: a
    repair recalibrates statistics everywhere). The root counts (as ``""``) when its own children differ."""
    theirs = dict(teacher.named_modules())
    changed: set[str] = set()
    for name, module in student.named_modules():
        other = theirs.get(name)
        if (
            other is None
            or (type(other) is not type(module) and _has_parameters(module, other))
            or [n for n, _ in module.named_children()] != [n for n, _ in other.named_children()]
            or _own_shapes(module) != _own_shapes(other)
        ):
            changed.add(name)
    return changed


@dataclass
class _Call:
    start: int
    end: int
    output: Any  # the output's structure, each tensor as (per-image shape, dtype, batched)


def _spec(value: Any, batch: int) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            batched = x.dim() > 0 and x.shape[0] == batch
            return ("tensor", tuple(x.shape[1:]) if batched else tuple(x.shape), x.dtype, batched)
        return x

    return pytree.tree_map(one, value)


def _materialize(spec: Any, batch: int, device: torch.device) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 4 and x[0] == "tensor":
            shape = (batch, *x[1]) if x[3] else x[1]
            return torch.zeros(shape, dtype=x[2], device=device)
        return x

    return pytree.tree_map(one, spec, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 4 and x[0] == "tensor")


def _trace(model: nn.Module, sample: torch.Tensor) -> dict[str, _Call]:
    """Each module's first call's start and last call's end (event counts) and its last output's structure."""
    calls: dict[str, _Call] = {}
    clock = iter(range(1 << 30))
    handles = []

    def before(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any) -> None:
            tick = next(clock)
            calls.setdefault(name, _Call(tick, tick, None))

        return hook

    def after(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            calls[name].end, calls[name].output = next(clock), _spec(output, len(sample))

        return hook

    for name, module in model.named_modules():
        if name:
            handles += [module.register_forward_pre_hook(before(name)), module.register_forward_hook(after(name))]
    try:
        with torch.no_grad():
            forward_logits(model, sample)
    finally:
        for handle in handles:
            handle.remove()
    return calls


class PrefixCut:
    """A student split at module ``name``: :meth:`prefix` computes the cut's output, :meth:`suffix` the logits from
    it (the modules that finish by the cut's end stubbed out, the cut returning the given tensor)."""

    def __init__(self, model: nn.Module, name: str, calls: dict[str, _Call], image_shape: tuple[int, ...]) -> None:
        self.name, self.image_shape = name, image_shape
        modules = dict(model.named_modules())
        end = calls[name].end
        done = {n for n, c in calls.items() if c.end <= end}
        self.done = done  #: every module that finishes by the cut's end (the cut included): frozen
        order = {n: (c.start, c.end) for n, c in calls.items()}
        self.stubbed = {n: calls[n].output for n in outermost_before(order, end + 1, done)}
        self.modules = {n: modules[n] for n in self.stubbed}
        self.frozen = [p for n in done for p in modules[n].parameters(recurse=False)]

    def prefix(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """The cut's output on ``images`` (no gradient; the forward pass stops there)."""
        kept: list[torch.Tensor] = []

        def hook(_m: nn.Module, _args: Any, output: Any) -> None:
            kept.append(output)
            raise _Stop

        handle = self.modules[self.name].register_forward_hook(hook)
        try:
            with torch.no_grad():
                forward_logits(model, images)
        except _Stop:
            pass
        finally:
            handle.remove()
        return kept[0]

    @contextmanager
    def stubbed_out(self, cached: torch.Tensor) -> Iterator[None]:
        """The stubbed modules' forwards replaced: the cut returns ``cached``, the others zeros of their shapes."""
        batch, device = len(cached), cached.device
        saved = {n: m.__dict__.get("forward") for n, m in self.modules.items()}
        try:
            for n, module in self.modules.items():
                if n == self.name:
                    module.forward = lambda *_a, **_k: cached  # type: ignore[method-assign]
                else:
                    spec = self.stubbed[n]
                    module.forward = lambda *_a, _s=spec, **_k: _materialize(_s, batch, device)  # type: ignore[method-assign]
            yield
        finally:
            for n, module in self.modules.items():
                if saved[n] is None:
                    del module.forward
                else:
                    module.forward = saved[n]  # type: ignore[method-assign]

    def suffix(self, model: nn.Module, cached: torch.Tensor) -> torch.Tensor:
        """The student's logits from the cut's output ``cached`` (its layers after the cut run; gradients flow)."""
        blank = torch.zeros((len(cached), *self.image_shape), device=cached.device)
        with self.stubbed_out(cached):
            return forward_logits(model, blank)


def _agrees(cut: PrefixCut, model: nn.Module, sample: torch.Tensor) -> bool:
    try:
        with torch.no_grad():
            full = forward_logits(model, sample)
            cached = cut.prefix(model, sample)
            if not isinstance(cached, torch.Tensor):
                return False
            alone = cut.suffix(model, cached)
    except Exception as exc:  # a cut the model's forward does not survive: the next candidate
        logger.debug("cut at %s fails: %s", cut.name, exc)
        return False
    scale = float(full.abs().max()) + 1.0
    return alone.shape == full.shape and bool((alone.float() - full.float()).abs().max() <= 1e-4 * scale)


def find_cut(student: nn.Module, teacher: nn.Module, sample: torch.Tensor) -> PrefixCut | None:
    """The latest cut before the first module pruning changed whose logits from the cut's output alone are the
    student's on ``sample`` (eval mode); None where the change starts at once, or no candidate checks out."""
    changed = changed_modules(student, teacher)
    if "" in changed:
        return None
    calls = _trace(student.eval(), sample)
    starts = [calls[n].start for n in changed if n in calls]
    if not starts:
        return None
    first = min(starts)
    candidates = sorted(
        (n for n, c in calls.items() if c.end < first and n not in changed and c.output is not None),
        key=lambda n: (-calls[n].end, n.count(".")),
    )
    for name in [n for n in candidates if isinstance(calls[n].output, tuple) and calls[n].output[0] == "tensor"][
        :CANDIDATES
    ]:
        cut = PrefixCut(student, name, calls, tuple(sample.shape[1:]))
        if _agrees(cut, student, sample):
            return cut
    return None


def _seconds(call: Callable[[], Any], repeats: int = 2) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def views_for(samples: int, images: int, augment: bool) -> int:
    """Views of each image that ``samples`` drawn images use about :data:`USES_PER_VIEW` times each (1 without
    augmentation; at most :data:`MAX_VIEWS`)."""
    if not augment:
        return 1
    return max(1, min(MAX_VIEWS, math.ceil(samples / (USES_PER_VIEW * max(1, images)))))


@dataclass
class ViewCache:
    """Fixed views of every image: the student's output at the cut, the teacher's logits and block outputs."""

    cut: PrefixCut
    views: int
    prefix: torch.Tensor
    logits: torch.Tensor
    blocks: dict[str, torch.Tensor]


def plan_cache(
    student: nn.Module,
    teacher: nn.Module,
    images: torch.Tensor,
    *,
    samples: int,
    augment: bool,
    block_bytes: dict[str, int],
    device: torch.device,
) -> tuple[PrefixCut, int] | None:
    """The cut and the number of views worth caching for ``samples`` drawn images (None: caching not worth it);
    ``block_bytes``: the bytes per image of each teacher block output matched (those after the cut are cached)."""
    batch = images[:8].to(device=device, dtype=torch.float32)  # enough to check the cut and time its share
    cut = find_cut(student, teacher, batch[:4])
    if cut is None:
        return None
    n = len(images)
    full = _seconds(lambda: forward_logits(student, batch))
    prefix = _seconds(lambda: cut.prefix(student, batch))
    share = min(1.0, prefix / max(full, 1e-9))
    with torch.no_grad():
        per_image = cut.prefix(student, batch[:1]).numel() * 4 + sum(
            b for name, b in block_bytes.items() if name not in cut.done
        )
        per_image += forward_logits(teacher, batch[:1]).numel() * 4
    views = views_for(samples, n, augment)
    while views > 1 and views * n * per_image > CACHE_BYTES:
        views -= 1
    if views * n * per_image > CACHE_BYTES:
        return None
    # cost in student forward passes: a step's teacher forward (1) and the student's forward and backward (3), against
    # the suffix's (3 of what is left) and the cache's teacher forward and student prefix, once per view
    estimate = 4 * samples / (3 * (1 - share) * samples + views * n * (1 + share))
    logger.info(
        "cut at %s: %.0f %% of a forward pass before it, %d views, %.1fx estimated",
        cut.name,
        100 * share,
        views,
        estimate,
    )
    return (cut, views) if estimate >= MIN_SPEEDUP else None
