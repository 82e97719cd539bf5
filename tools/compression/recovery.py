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
    which is the bias correction. Solved in closed form in float64. What shift is left at each BatchNorm
    is then corrected differentially (the change of its input statistics from the original to the
    pruned model on the calibration images), which leaves an unpruned model exactly as it was.

Consumers are named by the prune report (``AppliedPruning.consumers``); the rows are those of
:mod:`tools.compression.calibration`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from tools.compression.calibration import DEFAULT_MAX_ROWS, capture, chunks, input_rows, run_with_pre_hooks
from tools.compression.forward import forward_logits

logger = logging.getLogger(__name__)

__all__ = [
    "RECOVERY_METHODS",
    "BatchNormStats",
    "RecoveryConfig",
    "RecoveryReport",
    "batchnorm_input_stats",
    "recalibrate_batchnorm_",
    "reconstruct_",
    "recover_",
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
    ridge: float = Field(default=1e-2, ge=0.0, description="Ridge strength, relative to the mean input energy.")
    max_rows: int = Field(default=DEFAULT_MAX_ROWS, ge=16, description="Rows per layer used in the fit.")
    batch_size: int = Field(default=64, ge=1, description="Images per forward pass of BatchNorm re-calibration.")


class RecoveryReport(BaseModel):
    """What recovery did."""

    method: str
    reconstructed: list[str] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)
    batchnorm_layers: int = 0
    calibration_samples: int = 0
    seconds: float = 0.0


BatchNormStats = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""Per BatchNorm (by name): mean and variance of its input channels over a batch, in eval mode."""


def _batchnorm_hooks(model: nn.Module, sums: dict[str, list[Any]]) -> dict[nn.Module, Any]:
    """Forward pre-hooks that add each tracking BatchNorm's input sums to ``sums`` (see :func:`_stats_of`)."""

    def hook_for(name: str) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach().double()
            dims = [d for d in range(x.ndim) if d != 1]
            entry = sums.setdefault(name, [0.0, 0.0, 0])
            entry[0] = entry[0] + x.sum(dims)
            entry[1] = entry[1] + x.pow(2).sum(dims)
            entry[2] += x.numel() // x.shape[1]

        return hook

    return {
        module: hook_for(name)
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
    }


def _stats_of(sums: dict[str, list[Any]]) -> BatchNormStats:
    stats = {}
    for name, (total, squares, n) in sums.items():
        mean = total / max(1, n)
        stats[name] = (mean, (squares / max(1, n) - mean.pow(2)).clamp_min(0.0))
    return stats


def batchnorm_input_stats(model: nn.Module, batch: torch.Tensor, batch_size: int = 64) -> BatchNormStats:
    """Per BatchNorm (by name): mean and variance of its input channels over ``batch``, in eval mode."""
    sums: dict[str, list[Any]] = {}
    run_with_pre_hooks(model, batch, _batchnorm_hooks(model, sums), batch_size)
    return _stats_of(sums)


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
    layers: dict[str, nn.modules.batchnorm._BatchNorm] = {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    }
    if not layers:
        return 0
    if reference is None:
        return _reestimate(list(layers.values()), model, batch, batch_size)
    after = stats if stats is not None else batchnorm_input_stats(model, batch, batch_size)
    before = reference_stats if reference_stats is not None else batchnorm_input_stats(reference, batch, batch_size)
    changed = 0
    for name, module in layers.items():
        if name not in after or name not in before or after[name][0].shape != before[name][0].shape:
            continue
        (mean_a, var_a), (mean_b, var_b) = after[name], before[name]
        running_mean, running_var = module.running_mean, module.running_var
        if running_mean is None or running_var is None or running_mean.shape != mean_a.shape:
            continue
        eps = float(module.eps)
        new_mean = running_mean.double() + (mean_a - mean_b).to(running_mean.device)
        new_var = running_var.double() * ((var_a + eps) / (var_b + eps)).to(running_var.device)
        running_mean.copy_(new_mean.to(running_mean.dtype))
        running_var.copy_(new_var.to(running_var.dtype))
        changed += 1
    return changed


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
        with torch.no_grad():
            for part in chunks(batch, batch_size):
                forward_logits(model, part)
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
            m.eval()
    return len(layers)


def _refit(module: nn.Conv2d | nn.Linear, x_rows: torch.Tensor, y_rows: torch.Tensor, ridge: float) -> None:
    """Set ``module``'s weight (and bias) to the ridge least-squares fit of ``y_rows`` from ``x_rows``."""
    weight = module.weight
    out = weight.shape[0]
    x = x_rows.double()
    w0 = weight.detach().double().reshape(out, -1)
    bias = module.bias
    k = x.shape[1]
    if k != w0.shape[1]:
        raise ValueError(f"input rows have {k} columns, the weight {w0.shape[1]}")
    if bias is not None:
        x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
        w0 = torch.cat([w0, bias.detach().double()[:, None]], 1)
    gram = x.T @ x
    lam = ridge * float(torch.diagonal(gram)[:k].mean().clamp_min(1e-12))
    penalty = torch.full((x.shape[1],), lam, dtype=x.dtype, device=x.device)
    if bias is not None:
        penalty[-1] = lam * 1e-6  # the bias is (almost) free: that is the bias correction
    rhs = x.T @ y_rows.double().to(x.device) + penalty[:, None] * w0.T
    solution = torch.linalg.solve(gram + torch.diag(penalty), rhs).T  # (out, k [+1])
    if not torch.isfinite(solution).all():
        raise ValueError("the least-squares fit is not finite")
    new_w = solution[:, :k].reshape(weight.shape).to(weight.dtype)
    module.weight = nn.Parameter(new_w, requires_grad=weight.requires_grad)
    if bias is not None:
        module.bias = nn.Parameter(solution[:, k].to(bias.dtype), requires_grad=bias.requires_grad)


def _reconstructable(module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "grouped convolution"
        if isinstance(module.padding, str) or module.padding_mode != "zeros":
            return "padding mode not supported"
        return None
    return f"{type(module).__name__} is not a Conv2d/Linear"


def reconstruct_(
    pruned: nn.Module,
    original: nn.Module,
    batch: torch.Tensor,
    consumers: Sequence[str],
    *,
    ridge: float = 1e-2,
    max_rows: int = DEFAULT_MAX_ROWS,
    targets: dict[str, torch.Tensor] | None = None,
    logits_out: list[torch.Tensor] | None = None,
    stats_out: BatchNormStats | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Refit each of ``consumers`` in ``pruned`` (IN PLACE) to reproduce ``original``'s outputs; see module doc.

    ``targets``: the original's output rows by layer name (``capture(original, batch, names, outputs=True)``),
    when the caller already has them. ``logits_out`` receives the logits of the refitting pass, which are
    the refitted model's logits on ``batch``; ``stats_out`` the refitted model's :func:`batchnorm_input_stats` on
    ``batch``, from the same pass. Returns (layers refitted, {layer: why not}).
    """
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
    if not names and stats_out is None:
        return [], skipped
    missing = [n for n in names if targets is None or n not in targets]
    targets = {
        **(targets or {}),
        **(capture(original, batch, missing, outputs=True, max_rows=max_rows) if missing else {}),
    }
    done: list[str] = []
    handles = []

    def pre_hook(module: Any, args: tuple[Any, ...], name: str) -> None:
        if name in done or name in skipped or name not in targets:
            return
        try:
            _refit(module, input_rows(module, args[0], max_rows), targets[name], ridge)
            done.append(name)
        except (RuntimeError, ValueError) as exc:  # singular or shape-mismatched: keep the layer as it is
            skipped[name] = f"fit failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    for name in names:
        module = pruned.get_submodule(name)
        handles.append(module.register_forward_pre_hook(lambda m, a, name=name: pre_hook(m, a, name)))
    sums: dict[str, list[Any]] = {}
    if stats_out is not None:  # after the refit hooks, so a BatchNorm sees what the refitted layers give it
        handles += [m.register_forward_pre_hook(h) for m, h in _batchnorm_hooks(pruned, sums).items()]
    try:
        with torch.no_grad():
            logits = forward_logits(pruned.eval(), batch)
        if logits_out is not None:
            logits_out.append(logits.float())
    finally:
        for h in handles:
            h.remove()
    if stats_out is not None:
        stats_out.update(_stats_of(sums))
    for name in names:
        if name not in done and name not in skipped:
            skipped[name] = "not reached by the forward pass"
    return done, skipped


def recover_(
    pruned: nn.Module,
    original: nn.Module,
    batch: torch.Tensor | None,
    consumers: Sequence[str],
    config: RecoveryConfig | None = None,
    targets: dict[str, torch.Tensor] | None = None,
    reference_stats: BatchNormStats | None = None,
) -> RecoveryReport:
    """Repair ``pruned`` IN PLACE with ``config.method`` on the calibration ``batch`` (see module doc).

    ``targets``: the original's output rows by consumer (as :func:`reconstruct_` takes them); ``reference_stats``:
    :func:`batchnorm_input_stats` of ``original`` on ``batch``, for a caller repairing many copies of one model.
    """
    config = config or RecoveryConfig()
    report = RecoveryReport(method=config.method)
    if config.method == "none":
        return report
    if batch is None or batch.shape[0] == 0:
        report.method = "none"
        report.skipped["*"] = "no calibration images (no dataset): recovery needs data"
        return report
    start = time.perf_counter()
    report.calibration_samples = int(batch.shape[0])
    stats: BatchNormStats | None = None
    if config.method == "reconstruct":
        stats = {} if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pruned.modules()) else None
        report.reconstructed, report.skipped = reconstruct_(
            pruned,
            original,
            batch,
            consumers,
            ridge=config.ridge,
            max_rows=config.max_rows,
            targets=targets,
            stats_out=stats,
        )
    # after reconstruction only the shift that is left is corrected; alone, BatchNorm is re-estimated outright
    reference = original if config.method == "reconstruct" else None
    report.batchnorm_layers = recalibrate_batchnorm_(
        pruned, batch, config.batch_size, reference=reference, stats=stats, reference_stats=reference_stats
    )
    report.seconds = round(time.perf_counter() - start, 3)
    logger.info(
        "recovery %s: %d layers refitted, %d BatchNorm re-estimated in %.2f s",
        config.method,
        len(report.reconstructed),
        report.batchnorm_layers,
        report.seconds,
    )
    return report
