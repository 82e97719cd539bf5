"""Recipe hashes: reuse an artifact only if it was built from the recipe at hand.

A pruned or quantized artifact carries its ``recipe_hash`` (:func:`recipe_hash`: sha256 of the canonical JSON of
everything that decides its weights: plan, importance, recovery, fine-tuning, backend, input shape, calibration
images, source model). ``tools.stages.ops`` reuses a complete artifact only when that hash matches the recipe at hand
(:func:`stale_reason`), and rebuilds it otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tools.artifacts.io import is_complete
from tools.deploy.base import PRECISION_BF16, PRECISION_FP32
from tools.deploy.cpu import int8_recipe_key
from tools.deploy.export_form import export_form_key
from tools.deploy.registry import runtime_and_precision
from tools.store.files import META_FILE, read_json, sha256_of

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig
    from tools.compression.recipes import PruningConfig, RecoveryConfig
    from tools.schemas import InputShape, OptimizationPlan, QuantizationRecommendation


def recipe_hash(recipe: Mapping[str, Any]) -> str:
    """sha256 of ``recipe`` as canonical JSON (sorted keys, no whitespace): the same for the same content,
    whatever the key order; tuples hash as lists, anything else not JSON as its ``str``."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def tensor_digest(tensor: torch.Tensor | None) -> str | None:
    """sha256 of a tensor's dtype, shape and values (None for None): identifies calibration images in a recipe."""
    if tensor is None:
        return None
    data = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def artifact_identity(artifact_dir: Path) -> str:
    """What a model derived from this artifact depends on: its recipe hash where it has one, else the sha256 of
    its ``artifact.json`` (an original's, written once)."""
    meta = Path(artifact_dir) / META_FILE
    stored = read_json(meta).get("recipe_hash")
    return str(stored) if stored else sha256_of(meta)


def stored_recipe_hash(artifact_dir: Path) -> str | None:
    """The recipe hash a complete artifact was built with (None: absent, incomplete, or written before hashes)."""
    if not is_complete(artifact_dir):
        return None
    try:
        value = read_json(Path(artifact_dir) / META_FILE).get("recipe_hash")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def prune_recipe_hash(
    original_dir: Path,
    plan: OptimizationPlan,
    shape: InputShape,
    config: PruningConfig,
    recovery: RecoveryConfig,
    *,
    calibration: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    finetune: DistillConfig | None = None,
    finetune_images: torch.Tensor | None = None,
) -> str:
    """The recipe hash of a pruned model (``tools.stages.ops.prune``): everything that decides its weights -- the
    original, the recommendations, importance/round_to/seed, recovery, fine-tuning, the input shape, the
    calibration images and targets -- and nothing that does not (justifications, the planner's ``max_ratio``)."""
    tuned = finetune is not None and finetune.steps > 0
    images, targets = calibration if calibration is not None else (None, None)
    return recipe_hash(
        {
            "kind": "pruned",
            "original": artifact_identity(original_dir),
            "pruning": [r.model_dump(exclude={"justification"}) for r in plan.pruning_recommendations],
            "config": config.model_dump(exclude={"max_ratio"}),
            "recovery": recovery.model_dump(),
            "finetune": finetune.model_dump() if tuned and finetune is not None else None,
            "shape": list(shape.as_tuple()),
            "calibration": tensor_digest(images),
            "calibration_targets": tensor_digest(targets),
            "finetune_images": tensor_digest(finetune_images) if tuned else None,
        }
    )


def distill_recipe_hash(
    source_dir: Path, config: DistillConfig, images: torch.Tensor, start: Path | None = None
) -> str:
    """The recipe hash of a model distilled from a saved one (``tools.stages.cross_fit.distill_saved``): the source
    model's identity, the distillation recipe, the images it ran on and, where the student started from another saved
    model (``start``), that one's identity."""
    recipe = {
        "kind": "distilled",
        "source": artifact_identity(source_dir),
        "finetune": config.model_dump(),
        "finetune_images": tensor_digest(images),
    }
    return recipe_hash(recipe if start is None else {**recipe, "start": artifact_identity(start)})


def quantize_recipe_hash(
    source_dir: Path,
    recommendations: list[QuantizationRecommendation],
    backend: str,
    shape: InputShape | None = None,
    calibration: torch.Tensor | None = None,
    *,
    int8_target: str | None = None,
    accuracy_control: str | None = None,
) -> str:
    """The recipe hash of a quantized model (``tools.stages.ops.quantize``): the source model's identity (a rebuilt
    pruned model changes it), the backend asked for, the export shape and the export form
    (``tools.deploy.export_form.export_form_key``); for a backend that quantizes, also the recommendations' layers
    and dtypes, the calibration images, the CPU kind int8 is built for (``vnni`` / ``no-vnni``) and its settings and
    what accuracy control judges by (its digest). Nothing that builds nothing: justifications, quantization types
    (each backend is dynamic or static by itself), and for a float backend the rest of the int8 recipe."""
    quantizes = runtime_and_precision(backend)[1] not in (PRECISION_FP32, PRECISION_BF16)
    int8 = {
        "recommendations": [r.model_dump(include={"layer", "dtype"}) for r in recommendations],
        "calibration": tensor_digest(calibration),
        "int8_target": int8_target,
        **({"int8_settings": int8_recipe_key(int8_target)} if int8_target else {}),
        "accuracy_control": accuracy_control,
    }
    return recipe_hash(
        {
            "kind": "quantized",
            "source": artifact_identity(source_dir),
            "backend": backend,
            "shape": list(shape.as_tuple()) if shape is not None else None,
            "export_form": export_form_key(),
            **(int8 if quantizes else {}),
        }
    )


def stale_reason(artifact_dir: Path, wanted_hash: str) -> str | None:
    """Why the complete artifact in ``artifact_dir`` cannot be reused for the recipe hashed ``wanted_hash``;
    None when it can, or when there is no complete artifact (nothing to reuse, nothing stale)."""
    if not is_complete(artifact_dir):
        return None
    stored = stored_recipe_hash(artifact_dir)
    if stored == wanted_hash:
        return None
    if stored is None:
        return f"{artifact_dir} carries no recipe hash (built before artifacts were hashed)"
    return f"{artifact_dir} was built from another recipe (hash {stored[:12]}, now {wanted_hash[:12]})"


__all__ = [
    "artifact_identity",
    "prune_recipe_hash",
    "quantize_recipe_hash",
    "recipe_hash",
    "stale_reason",
    "stored_recipe_hash",
    "tensor_digest",
]
