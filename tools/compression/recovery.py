"""Training-free recovery after pruning: one verb, :func:`recover_`, with a :class:`RecoveryConfig`.

``none``
    Nothing: the pruned model as Torch-Pruning left it (the uniform baselines' setting).
``bn``
    BatchNorm re-calibration: pruning shifts the distribution each BatchNorm after a pruned layer sees;
    every BatchNorm's running mean and variance are re-estimated on the calibration images.
``reconstruct``
    Least-squares reconstruction of every layer that consumes pruned channels (``fc2`` after MLP hidden
    channels, the output projection after attention heads, the next convolution after a conv group), then
    BatchNorm re-calibration where the model has BatchNorm. In one forward pass of the pruned model over
    the calibration batch, each consumer, in forward order, is refitted just before it runs: its new
    weight ``W`` minimises ``||X' W^T + b - Y||^2 + lam ||W - W0||^2``, where ``X'`` are the rows it now
    receives (so errors of earlier layers are compensated), ``Y`` what the original model's same layer
    produced on the same images, ``W0`` its weights for the kept inputs, and ``lam`` is ``ridge`` times
    the mean diagonal of ``X'^T X'``. The bias (where the layer has one) is refitted without penalty,
    which is the bias correction. Solved in closed form in float64. In the same pass, what shift is left at
    each BatchNorm is corrected differentially just before it runs (its running statistics move by the change
    of its input statistics from the original to the repaired model on the calibration images), so every
    later layer is refitted on, and every later BatchNorm corrected for, what the repaired model really gives
    it; an unpruned model is left exactly as it was, and the pass's logits are the repaired model's.

Consumers are named by the prune report (``AppliedPruning.consumers``); the rows are those of
:mod:`tools.compression.calibration`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from tools.compression.calibration import (
    DEFAULT_MAX_ROWS,
    capture,
    input_rows_with_images,
    row_index,
    run_with_pre_hooks,
)
from tools.compression.forward import forward_logits, forward_with_hooks
from tools.compression.ridge import DEFAULT_FOLDS, RIDGE_GRID, LayerFit, cross_validated_fit, fit_seconds

logger = logging.getLogger(__name__)

__all__ = [
    "RECOVERY_METHODS",
    "BatchNormStats",
    "JudgedRecovery",
    "RecoveryConfig",
    "RecoveryReport",
    "batchnorm_input_stats",
    "batchnorm_stats_hooks",
    "recalibrate_batchnorm_",
    "reconstruct_",
    "recover_",
    "refit_seconds",
]

RecoveryMethod = Literal["none", "bn", "reconstruct"]
#: Recovery methods, by name, with what each does.
RECOVERY_METHODS: dict[str, str] = {
    "none": "no recovery",
    "bn": "BatchNorm statistics re-estimated on the calibration images",
    "reconstruct": "least-squares refit of the layers consuming pruned channels, then BatchNorm re-calibration",
}


class RecoveryConfig(BaseModel):
    """How a pruned model is repaired without training."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: RecoveryMethod = Field(default="reconstruct", description="none, bn or reconstruct.")
    ridge: float | None = Field(
        default=None,
        ge=0.0,
        description="Ridge strength, relative to the mean input energy; None: chosen per layer by cross-validation "
        "over images (tools.compression.ridge).",
    )
    folds: int = Field(default=DEFAULT_FOLDS, ge=2, description="Folds of images the ridge strength is chosen on.")
    holdout: float = Field(
        default=0.25,
        ge=0.0,
        lt=1.0,
        description="Share of the calibration images a round's recovery is not fit on but judged on, against the "
        "pruned model unrepaired (and BatchNorm re-estimation): the better one is kept. 0: not judged.",
    )
    max_rows: int = Field(default=DEFAULT_MAX_ROWS, ge=16, description="Rows per layer used in the fit.")
    batch_size: int = Field(default=64, ge=1, description="Images per forward pass of BatchNorm re-calibration.")


class JudgedRecovery(BaseModel):
    """One recovery method of a round, judged against the original on calibration images it was not fit on."""

    method: str
    kl: float = Field(description="Mean KL divergence from the original's class probabilities.")
    agreement: float = Field(description="Share of images whose top-1 class is the original's.")


class RecoveryReport(BaseModel):
    """What recovery did."""

    method: str
    requested: str | None = Field(default=None, description="The configured method, where another one was kept.")
    reconstructed: list[str] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)
    layers: list[LayerFit] = Field(
        default_factory=list, description="Each refitted layer: its choice and what it bought on held-out folds."
    )
    batchnorm_layers: int = 0
    calibration_samples: int = 0
    fit_samples: int = Field(default=0, description="Calibration images the repair was fit on.")
    judged: list[JudgedRecovery] = Field(
        default_factory=list, description="The methods tried, judged on the calibration images they were not fit on."
    )
    seconds: float = 0.0


BatchNormStats = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""Per BatchNorm (by name): mean and variance of its input channels over a batch, in eval mode."""


#: Values per channel past which a BatchNorm's input statistics are taken on a regular grid of its positions (every
#: s-th row and column): a 260-px batch of 125 images gives 2 million values a channel, their mean and variance
#: the same to 1e-3 from a quarter of a million, at an eighth of the cost (the statistics were a quarter of a
#: recovery pass). The original's and the pruned model's are taken on the same grid: the grid is set by the images
#: the statistics are of, not by the chunk a pass runs at a time. EfficientNet-Lite2 at 260 px: the original's,
#: gathered in chunks of 2 images, were of every position, the pruned model's, in one pass over the 188 fit images,
#: of every fourth row and column; the difference of the two grids shifted every BatchNorm after the pruned layers,
#: and reconstruction lost to no recovery in every round (round 0's held-out KL 0.0157, no recovery's 0.0122; on
#: the same grid 0.0104, as before passes were chunked).
MAX_STATISTIC_VALUES = 1 << 18


def _input_stats(x: torch.Tensor, images: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (population) variance of a BatchNorm's input, in float64.

    Computed by batch normalization's own training statistics (one fused, numerically stable pass: about 40 %
    faster than ``torch.var_mean`` on a 224-px activation, and no float64 copy of it), on a grid of the positions
    of a large activation (:data:`MAX_STATISTIC_VALUES`). ``images``: how many images the statistics are pooled over
    (``x`` may be a chunk of them), which sets the grid; default ``x``'s."""
    total = x.shape[0] if images is None else images
    if x.ndim == 4 and total * x.shape[2] * x.shape[3] > MAX_STATISTIC_VALUES:
        stride = math.ceil(math.sqrt(total * x.shape[2] * x.shape[3] / MAX_STATISTIC_VALUES))
        x = x[:, :, ::stride, ::stride]
    channels = x.shape[1]
    n = x.numel() // channels
    if n < 2:  # batch_norm refuses a single value per channel
        var, mean = torch.var_mean(x.detach().double(), [d for d in range(x.ndim) if d != 1], correction=0)
        return mean, var
    mean = torch.zeros(channels, dtype=torch.float32, device=x.device)
    var = torch.ones(channels, dtype=torch.float32, device=x.device)
    F.batch_norm(x.detach().float(), mean, var, training=True, momentum=1.0)  # the output is not used
    return mean.double(), var.double() * ((n - 1) / n)  # batch_norm keeps the unbiased estimate


def _batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
    }


def _batchnorm_hooks(model: nn.Module, sums: dict[str, list[Any]], images: int | None) -> dict[nn.Module, Any]:
    """Forward pre-hooks that pool each tracking BatchNorm's input mean and variance over calls into ``sums``
    (Chan et al.'s pairwise update, in float64), of ``images`` images in all; see :func:`_stats_of`."""

    def hook_for(name: str) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
            mean, var = _input_stats(args[0], images)
            n = args[0].numel() // args[0].shape[1]
            entry = sums.setdefault(name, [0, 0.0, 0.0])
            total = entry[0] + n
            delta = mean - entry[1]
            entry[2] = entry[2] + var * n + delta.pow(2) * (entry[0] * n / total)
            entry[1] = entry[1] + delta * (n / total)
            entry[0] = total

        return hook

    return {module: hook_for(name) for name, module in _batchnorm_layers(model).items()}


def _stats_of(sums: dict[str, list[Any]]) -> BatchNormStats:
    return {name: (mean, squares / max(1, n)) for name, (n, mean, squares) in sums.items()}


def _shift_(
    module: nn.modules.batchnorm._BatchNorm,
    after: tuple[torch.Tensor, torch.Tensor],
    before: tuple[torch.Tensor, torch.Tensor],
) -> bool:
    """Move ``module``'s running statistics by the change of its input statistics (``before`` -> ``after``);
    False where the widths differ (a BatchNorm sliced with its convolution keeps its sliced statistics)."""
    (mean_a, var_a), (mean_b, var_b) = after, before
    running_mean, running_var = module.running_mean, module.running_var
    if running_mean is None or running_var is None or not (running_mean.shape == mean_a.shape == mean_b.shape):
        return False
    eps = float(module.eps)
    new_mean = running_mean.double() + (mean_a - mean_b).to(running_mean.device)
    new_var = running_var.double() * ((var_a + eps) / (var_b + eps)).to(running_var.device)
    running_mean.copy_(new_mean.to(running_mean.dtype))
    running_var.copy_(new_var.to(running_var.dtype))
    return True


def batchnorm_input_stats(model: nn.Module, batch: torch.Tensor, batch_size: int = 64) -> BatchNormStats:
    """Per BatchNorm (by name): mean and variance of its input channels over ``batch``, in eval mode."""
    stats, hooks = batchnorm_stats_hooks(model, batch.shape[0])
    run_with_pre_hooks(model, batch, hooks, batch_size)
    return stats()


def batchnorm_stats_hooks(
    model: nn.Module, images: int | None = None
) -> tuple[Callable[[], BatchNormStats], dict[nn.Module, Any]]:
    """Forward pre-hooks that gather :func:`batchnorm_input_stats` on whatever passes the caller runs (over
    ``images`` images in all, in chunks or not: the same grid of positions either way), and the function that gives
    the statistics after them."""
    sums: dict[str, list[Any]] = {}
    return lambda: _stats_of(sums), _batchnorm_hooks(model, sums, images)


def recalibrate_batchnorm_(
    model: nn.Module,
    batch: torch.Tensor,
    batch_size: int = 64,
    reference: nn.Module | None = None,
    *,
    stats: BatchNormStats | None = None,
    reference_stats: BatchNormStats | None = None,
) -> int:
    """Correct every tracking BatchNorm's running statistics for the shift pruning caused; the number changed.

    With ``reference`` (the unpruned model), the correction is differential: each BatchNorm's running mean
    moves by the change of its input mean on ``batch`` (pruned minus reference) and its running variance
    scales by the ratio of the input variances, so statistics estimated on the training data are kept where
    pruning changed nothing (an unpruned model is left exactly as it was) and a small calibration set adds
    little noise. BatchNorms whose width changed (sliced with their convolution) keep their sliced statistics.
    Without ``reference``, the statistics are re-estimated on ``batch`` outright. ``stats`` / ``reference_stats``:
    :func:`batchnorm_input_stats` of ``model`` / ``reference`` on ``batch`` where the caller has them (a pass each).
    """
    layers = _batchnorm_layers(model)
    if not layers:
        return 0
    if reference is None:
        return _reestimate(list(layers.values()), model, batch, batch_size)
    after = stats if stats is not None else batchnorm_input_stats(model, batch, batch_size)
    before = reference_stats if reference_stats is not None else batchnorm_input_stats(reference, batch, batch_size)
    return sum(
        _shift_(module, after[name], before[name])
        for name, module in layers.items()
        if name in after and name in before
    )


def _reestimate(
    layers: list[nn.modules.batchnorm._BatchNorm], model: nn.Module, batch: torch.Tensor, batch_size: int
) -> int:
    momenta = [m.momentum for m in layers]
    model.eval()
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
        m.train()
    try:
        with torch.no_grad():  # each chunk normalized by its own statistics: ``batch_size`` images, never fewer
            for part in batch.split(batch_size):
                forward_logits(model, part)
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
            m.eval()
    return len(layers)


def _fit_rows(
    module: nn.Module, x: torch.Tensor, images: int, fit: int, max_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The input rows of ``module`` that come from the first ``fit`` of the pass's ``images``, in the order the
    original's output rows on those images are captured, and the image of each row. The images lie along the first
    axis of ``x`` (batch-first layers), own consecutive runs of it (Swin's attention runs on ``images x windows``),
    or lie along its second axis (sequence-first layers: ``nn.TransformerEncoderLayer`` without ``batch_first``).
    ``ValueError`` (the layer is not refit) where both of the last two readings fit its shape: ``images x k`` rows
    of ``images`` entries each could be either, and the wrong one would fit rows of other images."""
    per = _entries_per_image(x, images)
    sequence_first = x.ndim >= 3 and int(x.shape[1]) == images and not isinstance(module, nn.Conv2d)
    if per > 1 and sequence_first:
        raise ValueError(f"input {tuple(x.shape)} for {images} images: windows of each image or positions of all")
    if per:
        rows, owners = input_rows_with_images(module, x[: fit * per], max_rows)
        return rows, owners // per
    if sequence_first:
        part = x[:, :fit]
        rows, _ = input_rows_with_images(module, part, max_rows)  # position-major rows: the image is the row % fit
        index = row_index(part[..., 0].numel(), max_rows)
        flat = torch.arange(part[..., 0].numel()) if index is None else index
        return rows, (flat // max(1, math.prod(part.shape[2:-1]))) % part.shape[1]
    return input_rows_with_images(module, x[:fit], max_rows)


def _entries_per_image(x: torch.Tensor, images: int) -> int:
    """How many entries of ``x``'s first axis each of the pass's ``images`` owns (consecutive); 0 where its first
    axis is not the images' (a sequence-first layer's positions)."""
    first = int(x.shape[0]) if x.ndim >= 2 else 0
    return first // images if images > 0 and first >= images and first % images == 0 else 0


def _refit(
    name: str,
    module: nn.Conv2d | nn.Linear,
    x: torch.Tensor,
    images: torch.Tensor,
    y_rows: torch.Tensor,
    ridge: float | None,
    folds: int,
) -> LayerFit:
    """Refit ``module``'s weight (and bias) from its input rows ``x`` (the image of each row: ``images``) to
    ``y_rows``: at the fixed relative strength ``ridge``, or with the strength (or no refit) chosen by
    cross-validation over images where ``ridge`` is None (:func:`tools.compression.ridge.cross_validated_fit`)."""
    weight, bias = module.weight, module.bias
    out = weight.shape[0]
    w0 = weight.detach().reshape(out, -1)
    if x.shape[1] != w0.shape[1]:
        raise ValueError(f"input rows have {x.shape[1]} columns, the weight {w0.shape[1]}")
    if y_rows.shape[1] != out:  # which of the original's outputs it kept is not known here
        raise ValueError(f"its own outputs were pruned too ({out} of {y_rows.shape[1]} kept), so it stays as pruned")
    new_w, new_b, record = cross_validated_fit(
        name,
        x,
        y_rows,
        images,
        w0,
        None if bias is None else bias.detach(),
        folds=folds if ridge is None else 0,  # a fixed strength: no folds
        grid=RIDGE_GRID,
        fixed_ridge=1e-2 if ridge is None else ridge,
    )
    if record.choice == "kept":
        return record
    module.weight = nn.Parameter(new_w.reshape(weight.shape).to(weight.dtype), requires_grad=weight.requires_grad)
    if bias is not None and new_b is not None:
        module.bias = nn.Parameter(new_b.to(bias.dtype), requires_grad=bias.requires_grad)
    return record


def _kept(targets: torch.Tensor, mask: Sequence[bool] | None) -> torch.Tensor:
    """The columns of the original's output rows ``targets`` that a layer whose outputs were pruned kept."""
    if mask is None or len(mask) != targets.shape[1]:
        return targets
    return targets[:, torch.tensor(list(mask), dtype=torch.bool, device=targets.device)]


def refit_seconds(model: nn.Module, consumers: Sequence[str], config: RecoveryConfig) -> float:
    """About how long ``config``'s reconstruction of ``model``'s ``consumers`` spends in its fits (shapes only)."""
    if config.method != "reconstruct":
        return 0.0
    total = 0.0
    for name in dict.fromkeys(consumers):
        try:
            module = model.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(module, nn.Conv2d | nn.Linear) and _reconstructable(module) is None:
            inputs, outputs = module.weight[0].numel(), module.weight.shape[0]
            total += fit_seconds(inputs, outputs, cross_validated=config.ridge is None, folds=config.folds)
    return total


def _reconstructable(module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "grouped convolution"
        if module.padding_mode != "zeros":
            return f"padding mode {module.padding_mode} not supported"
        return None
    return f"{type(module).__name__} is not a Conv2d/Linear"


def reconstruct_(
    pruned: nn.Module,
    original: nn.Module,
    batch: torch.Tensor,
    consumers: Sequence[str],
    *,
    ridge: float | None = None,
    folds: int = DEFAULT_FOLDS,
    max_rows: int = DEFAULT_MAX_ROWS,
    fit: int | None = None,
    targets: dict[str, torch.Tensor] | None = None,
    logits_out: list[torch.Tensor] | None = None,
    reference_stats: BatchNormStats | None = None,
    batchnorm_out: list[str] | None = None,
    layers_out: list[LayerFit] | None = None,
    kept_outputs: Mapping[str, Sequence[bool]] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Refit each of ``consumers`` in ``pruned`` (IN PLACE) to reproduce ``original``'s outputs; see module doc.

    ``fit``: only the first ``fit`` images of ``batch`` are fit on (None: all); the others run through the repaired
    layers in the same pass, so ``logits_out`` holds the repaired model's logits on images it was not fit on.
    ``targets``: the original's output rows by layer name on the fit images (``capture(original, batch[:fit],
    names, outputs=True)``), when the caller already has them. With ``reference_stats`` (:func:`batchnorm_input_stats`
    of ``original`` on the fit images), each tracking BatchNorm is corrected in the same pass, just before it runs, by
    the change of its input statistics on the fit images (what the refitted and corrected layers before it now give
    it); ``batchnorm_out`` receives the names of those corrected, ``layers_out`` each refit's :class:`LayerFit`.
    ``logits_out`` receives the logits of the pass. ``kept_outputs``: which of its outputs each layer whose own
    output channels were pruned kept (:meth:`PruneReport.kept_outputs`), so that a consumer pruned that way too is
    fit to the original's outputs it kept. Returns (layers refitted, {layer: why not}).
    """
    fit = batch.shape[0] if fit is None else max(1, min(fit, batch.shape[0]))
    names, skipped = _refittable(pruned, original, consumers)
    if not names and reference_stats is None:
        return [], skipped
    missing = [n for n in names if targets is None or n not in targets]
    targets = {
        **(targets or {}),
        **(capture(original, batch[:fit], missing, outputs=True, max_rows=max_rows) if missing else {}),
    }
    hooks = _PassHooks(
        images=batch.shape[0],
        fit=fit,
        max_rows=max_rows,
        ridge=ridge,
        folds=folds,
        targets=targets,
        kept_outputs=kept_outputs or {},
        skipped=skipped,
        layers_out=layers_out,
    )
    logits = hooks.run(pruned, batch, names, reference_stats)
    if logits_out is not None:
        logits_out.append(logits.float())
    if batchnorm_out is not None:
        batchnorm_out.extend(hooks.corrected)
    for name in names:
        if name not in hooks.done and name not in skipped:
            skipped[name] = "not reached by the forward pass"
    return hooks.done, skipped


def _refittable(pruned: nn.Module, original: nn.Module, consumers: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The ``consumers`` reconstruction can refit (each once, in order), and why not each of the others."""
    skipped: dict[str, str] = {}
    names = []
    for name in dict.fromkeys(consumers):
        try:
            issue = _reconstructable(pruned.get_submodule(name))
            original.get_submodule(name)
        except AttributeError:
            issue = "no such module in both models"
        if issue:
            skipped[name] = issue
        else:
            names.append(name)
    return names, skipped


@dataclass
class _PassHooks:
    """The forward pre-hooks of one reconstruction pass over ``images`` images (the first ``fit`` fit on), which
    refit each consumer and correct each BatchNorm just before it runs, and what they did (see :func:`reconstruct_`)."""

    images: int
    fit: int
    max_rows: int
    ridge: float | None
    folds: int
    targets: dict[str, torch.Tensor]
    kept_outputs: Mapping[str, Sequence[bool]]
    skipped: dict[str, str]
    layers_out: list[LayerFit] | None
    done: list[str] = field(default_factory=list)
    corrected: list[str] = field(default_factory=list)

    def refit(self, module: Any, args: tuple[Any, ...], name: str) -> None:
        """Refit the consumer ``name`` to the original's outputs from the rows it is about to receive."""
        if name in self.done or name in self.skipped or name not in self.targets:
            return
        try:
            rows, images = _fit_rows(module, args[0], self.images, self.fit, self.max_rows)
            if rows.shape[0] != self.targets[name].shape[0]:
                raise ValueError(f"{rows.shape[0]} input rows against {self.targets[name].shape[0]} output rows")
            wanted = _kept(self.targets[name], self.kept_outputs.get(name))
            record = _refit(name, module, rows, images, wanted, self.ridge, self.folds)
            self.done.append(name)
            if self.layers_out is not None:
                self.layers_out.append(record)
        except (RuntimeError, ValueError) as exc:  # singular or shape-mismatched: keep the layer as it is
            self.skipped[name] = f"fit failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    def correct(self, module: Any, args: tuple[Any, ...], name: str, reference: BatchNormStats) -> None:
        """Correct the BatchNorm ``name`` for the change of the input it is about to receive on the fit images."""
        fit_part = args[0][: self.fit * max(1, _entries_per_image(args[0], self.images))]
        if name in reference and _shift_(module, _input_stats(fit_part, self.fit), reference[name]):
            self.corrected.append(name)

    def run(
        self, pruned: nn.Module, batch: torch.Tensor, names: list[str], reference: BatchNormStats | None
    ) -> torch.Tensor:
        """The logits of ``pruned`` on ``batch``, its consumers ``names`` refitted and, with ``reference`` (the
        original's :func:`batchnorm_input_stats`), its BatchNorms corrected on the way."""
        handles = [pruned.get_submodule(n).register_forward_pre_hook(partial(self.refit, name=n)) for n in names]
        if reference is not None:
            for name, module in _batchnorm_layers(pruned).items():
                handles.append(module.register_forward_pre_hook(partial(self.correct, name=name, reference=reference)))
        return forward_with_hooks(pruned, batch, handles)


def recover_(
    pruned: nn.Module,
    original: nn.Module,
    batch: torch.Tensor | None,
    consumers: Sequence[str],
    config: RecoveryConfig | None = None,
    targets: dict[str, torch.Tensor] | None = None,
    reference_stats: BatchNormStats | None = None,
    logits_out: list[torch.Tensor] | None = None,
    fit: int | None = None,
    kept_outputs: Mapping[str, Sequence[bool]] | None = None,
) -> RecoveryReport:
    """Repair ``pruned`` IN PLACE with ``config.method`` on the calibration ``batch`` (see module doc).

    ``fit``: the repair is fit on the first ``fit`` images of ``batch`` only (None: all); ``targets`` and
    ``reference_stats`` are then of those images. ``targets``: the original's output rows by consumer (as
    :func:`reconstruct_` takes them); ``reference_stats``: :func:`batchnorm_input_stats` of ``original`` on the fit
    images, for a caller repairing many copies of one model. ``logits_out`` receives the repaired model's logits on
    ``batch`` where recovery ran it anyway (``reconstruct``); on the images after ``fit`` they are out of sample.
    ``kept_outputs``: as :func:`reconstruct_` takes them.
    """
    config = config or RecoveryConfig()
    report = RecoveryReport(method=config.method)
    if config.method == "none":
        return report
    if batch is None or batch.shape[0] == 0:
        report.method = "none"
        report.skipped["*"] = "no calibration images (no dataset): recovery needs data"
        return report
    fit = batch.shape[0] if fit is None else max(1, min(fit, batch.shape[0]))
    start = time.perf_counter()
    report.calibration_samples = int(batch.shape[0])
    report.fit_samples = fit
    if config.method == "reconstruct":
        if reference_stats is None and _batchnorm_layers(pruned):
            reference_stats = batchnorm_input_stats(original, batch[:fit], config.batch_size)
        corrected: list[str] = []
        report.reconstructed, report.skipped = reconstruct_(
            pruned,
            original,
            batch,
            consumers,
            ridge=config.ridge,
            folds=config.folds,
            max_rows=config.max_rows,
            fit=fit,
            targets=targets,
            logits_out=logits_out,
            reference_stats=reference_stats,
            batchnorm_out=corrected,
            layers_out=report.layers,
            kept_outputs=kept_outputs,
        )
        report.batchnorm_layers = len(corrected)
    else:  # alone, BatchNorm is re-estimated outright
        report.batchnorm_layers = recalibrate_batchnorm_(pruned, batch[:fit], config.batch_size)
    report.seconds = round(time.perf_counter() - start, 3)
    _log_recovery(report)
    return report


def _log_recovery(report: RecoveryReport) -> None:
    """Log what recovery did, and in how long."""
    kept = sum(1 for layer in report.layers if layer.choice == "kept")
    logger.info(
        "recovery %s: %d layers refitted (%d kept as pruned: the refit did not beat them out of sample), "
        "%d BatchNorm corrected in %.2f s",
        report.method,
        len(report.reconstructed) - kept,
        kept,
        report.batchnorm_layers,
        report.seconds,
    )
