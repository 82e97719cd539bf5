"""One layer's least-squares refit, its ridge strength chosen on images it was not fit on.

Recovery refits a layer that consumes pruned channels so that, on the calibration images, it reproduces what the
original's same layer produced: rows ``X`` (what the pruned model now feeds it) and targets ``Y`` (the original's
outputs). Fit on a few hundred images of a 1000-class model, the plain fit reproduces those images and little else: an
EfficientNet-Lite2 whose head convolution lost 90 % of its channels had its classifier refit on 125 images (one row an
image, 128 inputs) to 98.4 % agreement with the original on them and 4.8 % on 375 others, where the unrepaired cut
kept 37.9 %.

So the strength is chosen by K-fold cross-validation over *images* (rows of one image are never split across folds:
neighbouring positions of a convolution are nearly copies of each other, and a fold of rows would reward fitting
them). Every option is scored by its squared error on the held-out folds, computed in closed form from per-fold
sufficient statistics (row counts, sums, Gram and cross matrices), so a fold costs a Cholesky solve, not a pass:

``kept``   the weights as pruning left them (the original's weights for the kept inputs)
``bias``   those weights, the bias refit (bias correction; layers with a bias)
``ridge``  ``W`` minimising ``||X W^T + b - Y||^2 + lam ||W - W0||^2`` (``b`` free where the layer has one), ``lam``
           one of :data:`RIDGE_GRID` times the mean input energy of a column

The option with the least held-out error is refit on every fold; :class:`LayerFit` keeps the choice and what it bought
out of sample (held-out error against ``kept``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, Field

__all__ = ["DEFAULT_FOLDS", "MIN_CV_IMAGES", "RIDGE_GRID", "LayerFit", "cross_validated_fit", "fit_seconds"]

#: Ridge strengths tried, relative to the mean energy of an input column (the sum of its squares over the rows).
RIDGE_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
#: Folds of images the strength is chosen on.
DEFAULT_FOLDS = 4
#: Fewer images than this: no cross-validation, the fixed strength (``fixed_ridge``) is used.
MIN_CV_IMAGES = 4

#: The float64 speeds the cost estimate of a fit assumes, one thread: a Cholesky factorisation, and the products and
#: triangular solves with its targets. Fixed figures, so that estimates never depend on timing; within 0.7-1.2x of
#: fits measured on an Intel Xeon with the other core busy (1,024 to 1,280 inputs, 128 to 1,000 targets).
FACTOR_FLOPS_PER_SECOND = 1e10
PRODUCT_FLOPS_PER_SECOND = 3e10

Choice = Literal["kept", "bias", "ridge"]


def fit_seconds(inputs: int, outputs: int, *, cross_validated: bool = True, folds: int = DEFAULT_FOLDS) -> float:
    """About how long one layer's fit takes (``inputs`` columns, ``outputs`` targets): a Cholesky solve and its
    held-out error for every option on every fold and the final fit, or one solve at a fixed strength."""
    solves = folds * (len(RIDGE_GRID) + 2) + 1 if cross_validated else 1
    factor = inputs**3 / 3 / FACTOR_FLOPS_PER_SECOND
    return solves * (factor + 3 * inputs * inputs * outputs / PRODUCT_FLOPS_PER_SECOND)


class LayerFit(BaseModel):
    """What recovery did to one layer, and what it bought on images the fit did not see."""

    layer: str
    choice: Choice = Field(description="kept (as pruned), bias (bias refit) or ridge (weights and bias refit).")
    ridge: float | None = Field(default=None, description="The chosen strength (relative), for ridge.")
    images: int = Field(description="Images the rows came from.")
    rows: int
    folds: int = Field(description="Cross-validation folds (0: too few images, the fixed strength).")
    heldout_error_kept: float | None = Field(
        default=None, description="Held-out squared error of the weights as pruned, relative to the targets' energy."
    )
    heldout_error: float | None = Field(default=None, description="The same for the choice.")

    @property
    def gain(self) -> float | None:
        """The share of the held-out error the choice removed against keeping the layer as pruned."""
        if self.heldout_error is None or not self.heldout_error_kept:
            return None
        return 1.0 - self.heldout_error / self.heldout_error_kept


@dataclass
class _Stats:
    """Sufficient statistics of a set of rows: count, sums, Gram, cross products, target energy (float64)."""

    n: float
    sx: torch.Tensor  # (k,)
    sy: torch.Tensor  # (out,)
    gram: torch.Tensor  # (k, k)
    cross: torch.Tensor  # (k, out)
    yy: float

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor) -> _Stats:
        return cls(float(x.shape[0]), x.sum(0), y.sum(0), x.T @ x, x.T @ y, float(y.pow(2).sum()))

    def __sub__(self, other: _Stats) -> _Stats:
        return _Stats(
            self.n - other.n,
            self.sx - other.sx,
            self.sy - other.sy,
            self.gram - other.gram,
            self.cross - other.cross,
            self.yy - other.yy,
        )


def _sum(parts: list[_Stats]) -> _Stats:
    total = parts[0]
    for part in parts[1:]:
        total = _Stats(
            total.n + part.n,
            total.sx + part.sx,
            total.sy + part.sy,
            total.gram + part.gram,
            total.cross + part.cross,
            total.yy + part.yy,
        )
    return total


def _error(s: _Stats, w: torch.Tensor, b: torch.Tensor) -> float:
    """``sum ||W x + b - y||^2`` over the rows of ``s``, from its statistics (``w``: (out, k), ``b``: (out,))."""
    value = (
        float(((w @ s.gram) * w).sum())
        - 2.0 * float((w * s.cross.T).sum())
        + s.yy
        + 2.0 * float(b @ (w @ s.sx))
        - 2.0 * float(b @ s.sy)
        + s.n * float(b @ b)
    )
    return max(value, 0.0)


def _solve(s: _Stats, w0: torch.Tensor, b0: torch.Tensor, choice: Choice, rel: float, has_bias: bool):
    """The (weight, bias) option ``choice`` fits on the rows of ``s``."""
    if choice == "kept" or s.n <= 0:
        return w0, b0
    mx, my = s.sx / s.n, s.sy / s.n
    if choice == "bias":
        return w0, my - w0 @ mx
    gram, cross = s.gram, s.cross
    if has_bias:  # centred: the bias is free
        gram = gram - torch.outer(s.sx, mx)
        cross = cross - torch.outer(s.sx, my)
    k = gram.shape[0]
    lam = rel * float(torch.diagonal(gram).mean().clamp_min(1e-12))
    system = gram + lam * torch.eye(k, dtype=gram.dtype, device=gram.device)
    rhs = cross + lam * w0.T
    factor, info = torch.linalg.cholesky_ex(system)
    solution = torch.cholesky_solve(rhs, factor) if int(info) == 0 else torch.linalg.lstsq(system, rhs).solution
    w = solution.T
    if not torch.isfinite(w).all():
        raise ValueError("the least-squares fit is not finite")
    return w, (my - w @ mx) if has_bias else b0


def cross_validated_fit(
    layer: str,
    x: torch.Tensor,
    y: torch.Tensor,
    images: torch.Tensor,
    w0: torch.Tensor,
    b0: torch.Tensor | None,
    *,
    folds: int = DEFAULT_FOLDS,
    grid: tuple[float, ...] = RIDGE_GRID,
    fixed_ridge: float = 1e-2,
) -> tuple[torch.Tensor, torch.Tensor | None, LayerFit]:
    """The refit weight (out, k) and bias of one layer from rows ``x`` (n, k) and targets ``y`` (n, out), ``images``
    the image each row came from; ``w0``/``b0`` the layer as pruned. ``folds`` under 2 (or fewer than
    :data:`MIN_CV_IMAGES` images): no cross-validation, the plain refit at ``fixed_ridge``. See the module doc."""
    if y.shape[1] != w0.shape[0] or x.shape[1] != w0.shape[1] or x.shape[0] != y.shape[0]:
        raise ValueError(  # a layer whose own outputs were pruned too: its targets are the original's outputs
            f"rows {tuple(x.shape)} and targets {tuple(y.shape)} do not fit the weight {tuple(w0.shape)}"
        )
    x, y = x.double(), y.double().to(x.device)
    w0 = w0.double().to(x.device)
    has_bias = b0 is not None
    b = b0.double().to(x.device) if b0 is not None else torch.zeros(w0.shape[0], dtype=x.dtype, device=x.device)
    ids = torch.unique(images)
    count = int(ids.numel())
    record = LayerFit(layer=layer, choice="ridge", images=count, rows=int(x.shape[0]), folds=0)
    if count < MIN_CV_IMAGES or folds < 2:  # no cross-validation: the fixed strength, as a plain refit
        w, bias = _solve(_Stats.of(x, y), w0, b, "ridge", fixed_ridge, has_bias)
        record.ridge = fixed_ridge
        return w, (bias if has_bias else None), record
    k_folds = min(folds, count)
    fold_of = torch.empty(int(images.max()) + 1, dtype=torch.long)
    fold_of[ids.cpu()] = torch.arange(count) % k_folds
    row_fold = fold_of[images.cpu()].to(x.device)
    parts = [_Stats.of(x[row_fold == f], y[row_fold == f]) for f in range(k_folds)]
    total = _sum(parts)
    options: list[tuple[Choice, float | None]] = [("kept", None)]
    options += [("bias", None)] if has_bias else []
    options += [("ridge", rel) for rel in grid]
    errors: dict[tuple[Choice, float | None], float] = {}
    for choice, rel in options:
        error = 0.0
        try:
            for part in parts:
                w, bias = _solve(total - part, w0, b, choice, rel or 0.0, has_bias)
                error += _error(part, w, bias)
        except (RuntimeError, ValueError):
            continue
        errors[(choice, rel)] = error
    best = min(errors, key=lambda option: (errors[option], options.index(option)))
    energy = max(total.yy, 1e-30)
    record.folds, record.choice, record.ridge = k_folds, best[0], best[1]
    record.heldout_error_kept = errors[("kept", None)] / energy
    record.heldout_error = errors[best] / energy
    w, bias = _solve(total, w0, b, best[0], best[1] or 0.0, has_bias)
    return w, (bias if has_bias else None), record
