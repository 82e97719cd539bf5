"""The losses and the augmentation of knowledge distillation (:mod:`tools.compression.distill`): Hinton's KL divergence
between softened logits, the block outputs' normalized squared error, and per-image flips and translations."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["augment_batch", "distill_loss", "feature_loss"]


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` on softened logits, averaged over rows (logits of any rank)."""
    s = student.float().reshape(-1, student.shape[-1]) / temperature
    t = teacher.float().reshape(-1, teacher.shape[-1]) / temperature
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")
    return kl * temperature**2


def augment_batch(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per-image random horizontal flip and translation by up to 1/8 of the side (reflect padding).

    Only 4-D (N, C, H, W) batches of at least 8x8 are changed; anything else comes back as it is.
    ``generator`` lives on the CPU, so results do not depend on the device.
    """
    if batch.dim() != 4 or min(batch.shape[-2:]) < 8:
        return batch
    n, _, h, w = batch.shape
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.where(flips.to(batch.device)[:, None, None, None], batch.flip(-1), batch)
    pad = max(1, min(h, w) // 8)
    padded = F.pad(out, (pad, pad, pad, pad), mode="reflect")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator).tolist()
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets)])


def feature_loss(
    student: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor], scales: dict[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """Mean over the blocks of ``MSE(student, teacher) / mean(teacher^2)`` (``scales``: each block's
    ``mean(teacher^2)`` taken over more images than ``teacher`` holds, a whole batch of which it is a chunk)."""
    scales = scales or {}
    terms = [
        F.mse_loss(student[n].float(), t.float())
        / (scales[n] if n in scales else t.float().pow(2).mean().clamp_min(1e-6))
        for n, t in teacher.items()
        if n in student
    ]
    return torch.stack(terms).mean() if terms else torch.zeros(())
