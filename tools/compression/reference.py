"""What the unpruned original computes on the calibration images, computed once for every prune and probe of a run.

Pruning a copy of the original and repairing it reads three things of the original on the calibration images: the
data-aware importance scores (:data:`tools.compression.importance.DATA_AWARE`), the input statistics of every
BatchNorm (the reference of the differential correction) and the output rows of the layers that recovery refits.
Each is a forward pass of the original; for a 224-px model on a few hundred images, each costs as much as the
refitting pass itself. :class:`ReferencePasses` computes each once, on first use (the BatchNorm statistics in the
first pass that captures output rows, when that comes first), and keeps it: the rounds of a run
all prune the same original on the same images, so after the first round a prune costs one pass (the refit) plus one
for consumers never refitted before. :func:`reference_passes` keeps the latest one per process, keyed by the model
and a fingerprint of the images.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from tools.compression.calibration import capture, chunks
from tools.compression.forward import forward_logits
from tools.compression.importance import DATA_AWARE
from tools.compression.recovery import BatchNormStats, batchnorm_input_stats, batchnorm_stats_hooks

__all__ = ["ReferencePasses", "reference_passes"]


class ReferencePasses:
    """The original's activations on ``images``, each computed on first use (see module doc).

    With ``holdout`` N, the last N images are held out: every activation is of the others (``fit_images``), which
    prunes and repairs are fit on, and the held-out ones (``held_images``) only judge them, against the original's
    logits on them (:meth:`held_logits`)."""

    def __init__(
        self,
        original: nn.Module,
        images: torch.Tensor,
        targets: torch.Tensor | None = None,
        batch_size: int = 64,
        holdout: int = 0,
    ) -> None:
        self.original = original.eval()
        held = max(0, min(holdout, images.shape[0] - 1))
        self.all_images = images
        self.images = images[: images.shape[0] - held]
        self.held_images = images[images.shape[0] - held :]
        self.targets = None if targets is None else targets[: images.shape[0] - held]
        self.batch_size = batch_size
        self._scores: dict[str, dict[str, torch.Tensor]] = {}
        self._batchnorm: BatchNormStats | None = None
        self._outputs: dict[tuple[str, int], torch.Tensor] = {}
        self._held_logits: torch.Tensor | None = None

    @property
    def fit(self) -> int:
        """How many of the images (the first ones) prunes and repairs are fit on."""
        return int(self.images.shape[0])

    def held_logits(self) -> torch.Tensor:
        """The original's logits on the held-out images."""
        if self._held_logits is None:
            with torch.no_grad():
                self._held_logits = torch.cat(
                    [forward_logits(self.original, part).float() for part in chunks(self.held_images, self.batch_size)]
                    or [torch.empty(0)]
                )
        return self._held_logits

    def channel_scores(self, importance: str) -> dict[str, torch.Tensor] | None:
        """The data-aware criterion's per-layer input-channel scores (None: ``importance`` is not data-aware)."""
        if importance not in DATA_AWARE:
            return None
        if importance not in self._scores:
            self._scores[importance] = DATA_AWARE[importance](self.original, self.images, self.targets, self.batch_size)
        return self._scores[importance]

    def batchnorm_stats(self) -> BatchNormStats | None:
        """Every tracking BatchNorm's input mean and variance (None: the model has no BatchNorm)."""
        if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.original.modules()):
            return None
        if self._batchnorm is None:
            self._batchnorm = batchnorm_input_stats(self.original, self.images, self.batch_size)
        return self._batchnorm

    def outputs(self, names: Iterable[str], max_rows: int) -> dict[str, torch.Tensor]:
        """The output rows of the named layers (as recovery's targets), the missing ones in one pass (which also
        gathers the BatchNorm statistics if they are not there yet: a caller that runs it with modules replayed,
        :class:`~tools.compression.prefix.PrefixCache`, asks for :meth:`batchnorm_stats` first)."""
        wanted = list(dict.fromkeys(names))
        missing = [n for n in wanted if (n, max_rows) not in self._outputs]
        if missing:
            stats, hooks = batchnorm_stats_hooks(self.original, self.fit)
            gather = self._batchnorm is None and bool(hooks)  # the BatchNorm statistics in the same pass
            extra = hooks if gather else None
            found = capture(self.original, self.images, missing, outputs=True, max_rows=max_rows, pre_hooks=extra)
            self._outputs.update({(n, max_rows): rows for n, rows in found.items()})
            if gather:
                self._batchnorm = stats()
        return {n: self._outputs[(n, max_rows)] for n in wanted if (n, max_rows) in self._outputs}


def _fingerprint(images: torch.Tensor) -> tuple[Any, ...]:
    flat = images.detach().reshape(images.shape[0], -1).double()
    return tuple(images.shape), round(float(flat.sum()), 6), round(float(flat[:, ::97].pow(2).sum()), 6)


_LATEST: dict[tuple[Any, ...], ReferencePasses] = {}


def reference_passes(
    key: str, load: Any, images: torch.Tensor, targets: torch.Tensor | None = None, holdout: int = 0
) -> ReferencePasses:
    """The :class:`ReferencePasses` of the model ``key`` names (``load()`` builds it) on ``images`` (the last
    ``holdout`` held out): the one kept from the last call when the key, images and holdout are the same, else a new
    one (which replaces it)."""
    full_key = (key, _fingerprint(images), None if targets is None else tuple(targets.tolist()), holdout)
    if full_key not in _LATEST:
        _LATEST.clear()
        _LATEST[full_key] = ReferencePasses(load(), images, targets, holdout=holdout)
    return _LATEST[full_key]
