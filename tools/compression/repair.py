"""A round's repair, judged on calibration images it was not fit on: the recovery that keeps the pruned model
closest to the original there, never one that makes it worse than no recovery.

Recovery fits on calibration images, and what it fits it may fit too well: a refit that reproduces the original on
those images can move everything else (see :mod:`tools.compression.ridge`). Each layer's refit is already chosen on
held-out folds; the model as a whole is judged here. The last ``holdout`` share of the calibration images
(:class:`~tools.compression.reference.ReferencePasses` holds them out) is never fit on: the configured recovery runs
on the others and, in the same forward pass, gives its logits on the held-out ones; the pruned model without recovery
is run on them too. Where the recovered model is further from the original there (mean KL divergence of the class
probabilities) than the unrecovered one, the round is recovered the other way: BatchNorm statistics re-estimated on
the fit images where the model has BatchNorm and that is closer, else no recovery. The report lists every method
tried with its held-out KL and agreement (:class:`~tools.compression.recovery.JudgedRecovery`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tools.compression.calibration import chunks
from tools.compression.forward import forward_logits
from tools.compression.recovery import JudgedRecovery, RecoveryConfig, RecoveryReport, recover_
from tools.compression.reference import ReferencePasses
from tools.models.base import clone_module

logger = logging.getLogger(__name__)

__all__ = ["MIN_HELD_OUT", "held_out_count", "kl_agreement", "repair_"]

#: Fewer held-out images than this judge nothing: the configured recovery is fit on every calibration image.
MIN_HELD_OUT = 8


def held_out_count(images: int, share: float) -> int:
    """Calibration images to hold out of ``images`` at ``share`` (0 where that leaves too few to judge on or to fit)."""
    count = round(images * share)
    return count if count >= MIN_HELD_OUT and images - count >= MIN_HELD_OUT else 0


def kl_agreement(reference: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """Mean KL divergence of ``logits``' class probabilities from ``reference``'s, and their top-1 agreement."""
    ref_log = F.log_softmax(reference.float(), -1)
    log = F.log_softmax(logits.float(), -1)
    kl = float((ref_log.exp() * (ref_log - log)).sum(-1).mean())
    agreement = float((reference.argmax(-1) == logits.argmax(-1)).float().mean())
    return kl, agreement


def _logits(model: nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([forward_logits(model.eval(), part).float() for part in chunks(images, batch_size)])


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())


def _recover(
    model: nn.Module,
    passes: ReferencePasses,
    consumers: Sequence[str],
    config: RecoveryConfig,
    kept_outputs: Mapping[str, Sequence[bool]] | None = None,
) -> tuple[RecoveryReport, torch.Tensor]:
    """``config``'s recovery of ``model`` fit on the passes' fit images; its logits on the held-out ones."""
    rows, stats = None, None
    if config.method == "reconstruct":
        rows, stats = passes.outputs(consumers, config.max_rows), passes.batchnorm_stats()
    logits: list[torch.Tensor] = []
    report = recover_(
        model,
        passes.original,
        passes.all_images,
        consumers,
        config,
        rows,
        stats,
        logits_out=logits,
        fit=passes.fit,
        kept_outputs=kept_outputs,
    )
    held = logits[0][passes.fit :] if logits else _logits(model, passes.held_images, passes.batch_size)
    return report, held


def repair_(
    pruned: nn.Module,
    passes: ReferencePasses,
    consumers: Sequence[str],
    config: RecoveryConfig,
    kept_outputs: Mapping[str, Sequence[bool]] | None = None,
) -> RecoveryReport:
    """Repair ``pruned`` IN PLACE: ``config``'s recovery where it is closer to the original than the alternatives on
    the held-out calibration images, else the closest of them (see module doc). Without held-out images (or with
    ``none``), ``config``'s recovery fit on every calibration image, unjudged."""
    if config.method == "none" or passes.held_images.shape[0] == 0:
        rows, stats = None, None
        if config.method == "reconstruct":
            rows, stats = passes.outputs(consumers, config.max_rows), passes.batchnorm_stats()
        images = passes.images
        return recover_(pruned, passes.original, images, consumers, config, rows, stats, kept_outputs=kept_outputs)
    reference = passes.held_logits()
    unrepaired = clone_module(pruned)
    report, held = _recover(pruned, passes, consumers, config, kept_outputs)
    tried = [(JudgedRecovery(method=config.method, **_judge(reference, held)), pruned)]
    plain = JudgedRecovery(method="none", **_judge(reference, _logits(unrepaired, passes.held_images, 64)))
    if plain.kl < tried[0][0].kl:
        tried.append((plain, unrepaired))
        if config.method == "reconstruct" and _has_batchnorm(unrepaired):
            bn_model = clone_module(unrepaired)
            _, bn_held = _recover(bn_model, passes, consumers, config.model_copy(update={"method": "bn"}), kept_outputs)
            tried.append((JudgedRecovery(method="bn", **_judge(reference, bn_held)), bn_model))
    else:
        tried.append((plain, unrepaired))
    best, model = min(tried, key=lambda item: item[0].kl)
    report.judged = [judged for judged, _ in tried]
    if best.method != config.method:
        logger.info(
            "recovery %s was further from the original on %d held-out calibration images (KL %.4f) than %s (%.4f): "
            "kept %s",
            config.method,
            reference.shape[0],
            tried[0][0].kl,
            best.method,
            best.kl,
            best.method,
        )
        pruned.load_state_dict(model.state_dict())
        report = RecoveryReport(
            method=best.method,
            requested=config.method,
            skipped=report.skipped,
            layers=report.layers if best.method == config.method else [],
            calibration_samples=report.calibration_samples,
            fit_samples=report.fit_samples,
            judged=report.judged,
            seconds=report.seconds,
        )
    return report


def _judge(reference: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    kl, agreement = kl_agreement(reference, logits)
    return {"kl": round(kl, 6), "agreement": round(agreement, 5)}
