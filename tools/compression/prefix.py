"""Run only what follows a change: the original's outputs of the modules before it, replayed from a cache.

A sensitivity probe changes one unit of a copy of the model; every module that runs before the first changed one
computes exactly what it computed in the original. :class:`PrefixCache` records, on one forward pass of the
original over the calibration batch, the outputs of the modules that end before some unit starts (the call order
comes from a pass on one image), and :meth:`PrefixCache.skip` makes those modules of a probe return their cached
outputs instead of running, so a probe's passes cost only the part of the network after its first change. On
average over the units of a network that is about half of each pass.

What counts as changed is measured, not assumed: every parameter and buffer of the probe is compared with the
original's, and a module gone counts as a change of the one that held it (a removed block:
:meth:`PrefixCache.first_change`), so a unit that also touches an earlier module (a shared embedding, a class token)
skips less, never wrongly. Only modules called once per forward pass whose outputs are tensors (or tuples of
tensors) are cached, within :data:`MAX_CACHE_BYTES`; a call on another batch than the cached one runs the
module as usual. The modules stay untouched outside :meth:`PrefixCache.skip`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from tools.compression.forward import forward_with_hooks

logger = logging.getLogger(__name__)

__all__ = ["MAX_CACHE_BYTES", "PrefixCache", "outermost_before"]

#: Memory the cached outputs may take (float32 activations of the calibration batch).
MAX_CACHE_BYTES = 2 * 1024**3


def _cacheable(output: Any) -> bool:
    if isinstance(output, torch.Tensor):
        return True
    return isinstance(output, tuple) and all(o is None or isinstance(o, torch.Tensor) for o in output)


def _nbytes(output: Any) -> int:
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size()
    return sum(_nbytes(o) for o in output if o is not None)


def _detached(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    return tuple(None if o is None else o.detach().clone() for o in output)


def _batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim:
            return int(value.shape[0])
    return None


def _owner(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _within(name: str, container: str) -> bool:
    return container == "" or name == container or name.startswith(container + ".")


class PrefixCache:
    """The original's outputs, on one batch, of the modules that run before some unit (see module doc)."""

    def __init__(
        self,
        model: nn.Module,
        first_call: dict[str, int],
        order: dict[str, tuple[int, int]],
        outputs: dict[str, Any],
        batch: int,
    ):
        self.first_call = first_call
        self.order = order
        self.outputs = outputs
        self.batch = batch
        self._state = {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}
        self._module_names = {name for name, _ in model.named_modules()}

    @staticmethod
    def call_order(
        model: nn.Module, example: torch.Tensor
    ) -> tuple[dict[str, int], dict[str, tuple[int, int]], dict[str, int]]:
        """On one pass over ``example``: the event at which each module is first called; the (start, end) events of
        the modules called exactly once with a cacheable output; and the bytes of that output per image."""
        events: dict[str, list[int]] = {}
        sizes: dict[str, int] = {}
        counter = [0]
        handles = []

        def pre(name: str) -> Any:
            def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
                events.setdefault(name, []).append(counter[0])
                counter[0] += 1

            return hook

        def post(name: str) -> Any:
            def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                events.setdefault(name, []).append(counter[0])
                counter[0] += 1
                sizes[name] = _nbytes(output) // max(1, example.shape[0]) if _cacheable(output) else -1

            return hook

        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(pre(name)))
            handles.append(module.register_forward_hook(post(name)))
        forward_with_hooks(model, example, handles)
        first_call = {name: calls[0] for name, calls in events.items()}
        order = {
            name: (calls[0], calls[1])
            for name, calls in events.items()
            if name and len(calls) == 2 and sizes.get(name, -1) >= 0
        }
        return first_call, order, {name: sizes[name] for name in order}

    @classmethod
    def build(
        cls,
        model: nn.Module,
        images: torch.Tensor,
        starts: Iterable[str],
        max_bytes: int = MAX_CACHE_BYTES,
    ) -> tuple[PrefixCache, torch.Tensor]:
        """Cache, on one pass of ``model`` over ``images``, the outputs a probe of each of the modules ``starts``
        (a unit's first module) can replay; also the logits of that pass."""
        first_call, order, sizes = cls.call_order(model, images[:1])
        firsts = sorted({first_call[name] for name in starts if name in first_call})
        wanted: dict[str, None] = {}
        for first in firsts:
            wanted.update(dict.fromkeys(outermost_before(order, first, order)))
        per_image, kept = 0, []
        for name in sorted(wanted, key=lambda n: order[n][0]):  # the earliest first: they serve the most units
            if (per_image + sizes[name]) * images.shape[0] > max_bytes:
                continue
            per_image += sizes[name]
            kept.append(name)
        outputs: dict[str, Any] = {}
        handles = []
        for name in kept:

            def hook(module: nn.Module, args: tuple[Any, ...], output: Any, name: str = name) -> None:
                outputs[name] = _detached(output)

            handles.append(model.get_submodule(name).register_forward_hook(hook))
        logits = forward_with_hooks(model, images, handles).float().cpu()  # compared on the CPU, as every probe's
        logger.debug("prefix cache: %d module outputs, %.1f MB", len(outputs), per_image * images.shape[0] / 1e6)
        return cls(model, first_call, order, outputs, int(images.shape[0])), logits

    def first_change(self, model: nn.Module) -> int:
        """The event at which the first module whose parameters or buffers differ from the original's starts."""
        state = model.state_dict(keep_vars=True)
        changed = {_owner(k) for k in self._state.keys() ^ state.keys()}
        # modules gone (a removed block): their parameter-free first steps (the pooling that opens a
        # squeeze-excitation) are gone too, so the change starts where the module that held them does
        changed |= {_owner(name) for name in self._module_names - {name for name, _ in model.named_modules()}}
        for key, value in state.items():
            before = self._state.get(key)
            if before is not None and (before.shape != value.shape or not torch.equal(before, value.detach())):
                changed.add(_owner(key))
        first = max(self.first_call.values(), default=0) + 1
        for name in changed:
            calls = [start for module, start in self.first_call.items() if _within(module, name)]
            if not calls:
                return 0  # a change in a module that never runs: replay nothing
            first = min(first, *calls)
        return first

    def replayed(self, first: int) -> list[str]:
        """The cached modules that end before event ``first``, outermost only."""
        return outermost_before(self.order, first, self.outputs)

    @contextlib.contextmanager
    def skip(self, model: nn.Module, first: int) -> Iterator[list[str]]:
        """Within, the cached modules of ``model`` that end before ``first`` return their cached outputs when
        called on the cached batch; the names replayed are yielded."""
        names = self.replayed(first)
        patched = []
        for name in names:
            module = model.get_submodule(name)
            module.forward = self._replay(module, name)  # type: ignore[method-assign]
            patched.append(module)
        try:
            yield names
        finally:
            for module in patched:
                del module.forward

    def _replay(self, module: nn.Module, name: str) -> Any:
        cached, forward, batch = self.outputs[name], type(module).forward, self.batch

        def replay(*args: Any, **kwargs: Any) -> Any:
            if _batch_of(args, kwargs) != batch:
                return forward(module, *args, **kwargs)
            return _detached(cached)  # a copy: what follows may work in place

        return replay


def outermost_before(order: dict[str, tuple[int, int]], first: int, among: Iterable[str]) -> list[str]:
    """The modules of ``among`` that end before event ``first`` and lie within no other such module."""
    done = sorted((n for n in among if order[n][1] < first), key=lambda n: order[n][0])
    outer: list[str] = []
    for name in done:
        if not any(_within(name, o) for o in outer):
            outer.append(name)
    return outer
