"""Safe save / load of original, pruned and quantized models, and the structure that rebuilds them.

Every model artifact is a directory with its deployed file (no pickle) and ``artifact.json``:

* ``original``: written and read back by the model's source (:func:`tools.models.sources.source_named`):
  a ``save_pretrained`` directory (config, ``model.safetensors``, image processor), or a factory model's
  ``model.safetensors`` and ``factory.json``.
* ``pruned``: ``model.safetensors`` plus a description of how the structure differs from the original
  (per-module attributes and parameter shapes), so the model is rebuilt from the original's config,
  resized, and loaded, without unpickling anything.
* ``quantized``: the quantization backend's deployed file (``model.safetensors`` with int8 weights and
  scales for ``torch-ao-dynamic``, an int8 ``model.onnx`` for ``onnxruntime``), the float structure,
  and the quantization report naming the backend that loads it back (:func:`deployed_file`).

A pruned or quantized artifact also carries its ``recipe_hash`` (:func:`recipe_hash`: sha256 of the canonical
JSON of everything that decides its weights: plan, importance, recovery, fine-tuning, backend, input shape,
calibration images, source model). ``tools.ops`` reuses a complete artifact only when that hash matches the
recipe at hand (:func:`stale_reason`), and rebuilds it otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tools.compression.quantization import (
    QUANTIZATION_BACKENDS,
    ModuleBackend,
    QuantizedModel,
    QuantReport,
    get_backend,
)
from tools.models.base import LoadedModel, family_of
from tools.models.sources import source_named
from tools.store.files import META_FILE, WEIGHTS_FILE, StagingDir, atomic_write_json, read_json, sha256_of
from tools.text import first_line

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig
    from tools.compression.recipes import PruningConfig, RecoveryConfig
    from tools.schemas import InputShape, OptimizationPlan, QuantizationRecommendation

logger = logging.getLogger(__name__)

ArtifactKind = Literal["original", "pruned", "quantized"]
_SIMPLE = (int, float, bool, str)


def deployed_file(artifact_dir: Path) -> Path:
    """The file an artifact deploys (its ``memory_mb``): the quantization backend's, else ``model.safetensors``."""
    artifact_dir = Path(artifact_dir)
    try:
        meta = read_json(artifact_dir / META_FILE)
    except (OSError, ValueError):
        return artifact_dir / WEIGHTS_FILE
    quantization = meta.get("quantization") if isinstance(meta, dict) else None
    if meta.get("kind") == "quantized" and isinstance(quantization, dict):
        backend = QUANTIZATION_BACKENDS.get(str(quantization.get("backend")))
        if backend is not None:
            return artifact_dir / backend.deployed_file
    return artifact_dir / WEIGHTS_FILE


def deployed_files(artifact_dir: Path) -> list[Path]:
    """Every file the deployed model needs: :func:`deployed_file`, plus a separate weights file (OpenVINO's .bin)."""
    main = deployed_file(artifact_dir)
    try:
        quantization = read_json(Path(artifact_dir) / META_FILE).get("quantization") or {}
    except (OSError, ValueError, AttributeError):
        return [main]
    backend = QUANTIZATION_BACKENDS.get(str(quantization.get("backend")))
    weights = getattr(backend, "weights_file", None)
    return [main, Path(artifact_dir) / weights] if weights else [main]


def is_complete(artifact_dir: Path) -> bool:
    """An artifact directory is complete once its metadata exists (it is written last, by rename)."""
    return (artifact_dir / META_FILE).is_file() and all(f.is_file() for f in deployed_files(artifact_dir))


# --- recipe hashes: reuse an artifact only if it was built from the recipe at hand -------------------


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
    """The recipe hash of a pruned model (``tools.ops.prune``): everything that decides its weights -- the
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


def quantize_recipe_hash(
    source_dir: Path,
    recommendations: list[QuantizationRecommendation],
    backend: str,
    shape: InputShape | None = None,
    calibration: torch.Tensor | None = None,
) -> str:
    """The recipe hash of a quantized model (``tools.ops.quantize``): the source model's identity (a rebuilt
    pruned model changes it), the recommendations without their justifications, the backend asked for, the
    export shape and the calibration images."""
    return recipe_hash(
        {
            "kind": "quantized",
            "source": artifact_identity(source_dir),
            "recommendations": [r.model_dump(exclude={"justification"}) for r in recommendations],
            "backend": backend,
            "shape": list(shape.as_tuple()) if shape is not None else None,
            "calibration": tensor_digest(calibration),
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


# --- structure of a compressed model ---------------------------------------------------------------


def _simple_attrs(module: nn.Module) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, _SIMPLE):
            attrs[key] = value
        elif isinstance(value, tuple | list) and all(isinstance(v, _SIMPLE) for v in value):
            attrs[key] = list(value)
    return attrs


def describe_structure(model: nn.Module, reference: nn.Module) -> dict[str, dict[str, Any]]:
    """Per module: the attributes and parameter/buffer shapes that differ from ``reference``."""
    ref_modules = dict(reference.named_modules())
    structure: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        ref = ref_modules.get(name)
        if ref is None:
            continue
        ref_attrs = _simple_attrs(ref)
        attrs = {k: v for k, v in _simple_attrs(module).items() if k in ref_attrs and ref_attrs[k] != v}
        shapes = {}
        for kind in ("_parameters", "_buffers"):
            mine, theirs = getattr(module, kind), getattr(ref, kind)
            for key, tensor in mine.items():
                other = theirs.get(key)
                if tensor is not None and other is not None and tensor.shape != other.shape:
                    shapes[key] = list(tensor.shape)
        if attrs or shapes:
            structure[name] = {"attrs": attrs, "shapes": shapes}
    return structure


def apply_structure(model: nn.Module, structure: dict[str, dict[str, Any]]) -> None:
    """Resize ``model`` in place to the described structure (values are placeholders: zeros)."""
    modules = dict(model.named_modules())
    for name, change in structure.items():
        module = modules[name]
        for key, value in change.get("attrs", {}).items():
            current = getattr(module, key, None)
            setattr(module, key, tuple(value) if isinstance(current, tuple) else value)
        for key, shape in change.get("shapes", {}).items():
            if key in module._parameters and module._parameters[key] is not None:
                old = module._parameters[key]
                assert old is not None
                module._parameters[key] = nn.Parameter(
                    torch.zeros(shape, dtype=old.dtype, device=old.device), requires_grad=old.requires_grad
                )
            elif key in module._buffers and module._buffers[key] is not None:
                old_buf = module._buffers[key]
                assert old_buf is not None
                module._buffers[key] = torch.zeros(shape, dtype=old_buf.dtype, device=old_buf.device)


# --- save -------------------------------------------------------------------------------------------


def save_original(loaded: LoadedModel, out_dir: Path) -> Path:
    """Save the acquired model once, so that every node starts from the same weights (its source's format)."""
    if is_complete(out_dir):
        return out_dir
    source_named(loaded.source).save_original(loaded, out_dir)
    return out_dir


def _state_for_save(model: nn.Module) -> dict[str, torch.Tensor]:
    state = {}
    seen: dict[int, str] = {}
    for key, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        # safetensors refuses shared storage: keep one copy of tied tensors and record the alias.
        ident = tensor.data_ptr()
        if ident in seen and tensor.numel() > 0:
            continue
        seen[ident] = key
        state[key] = tensor.detach().cpu().contiguous()
    return state


def save_compressed(
    model: nn.Module,
    out_dir: Path,
    *,
    base_dir: Path,
    kind: ArtifactKind,
    recipe: dict[str, Any],
    quant_report: QuantReport | None = None,
    float_model: nn.Module | None = None,
    example_input: torch.Tensor | None = None,
    calibration: torch.Tensor | None = None,
    recipe_key: str | None = None,
) -> Path:
    """Save a pruned or quantized model as deployed, plus its structure, recipe and ``recipe_key`` (its
    :func:`recipe_hash`, which decides whether the artifact may be reused).

    For a quantized model pass its ``quant_report`` and ``float_model`` (the float model it was
    quantized from, whose structure is the one rebuilt on load). ``model`` is the quantized module
    for in-memory torch backends; a backend that quantizes while saving (``onnxruntime``) quantizes
    ``float_model`` (or ``model``) itself from ``example_input`` (see :func:`save_quantized`).
    """
    if kind == "quantized":
        if quant_report is None:
            raise ValueError("a quantized artifact needs its QuantReport")
        in_memory = isinstance(get_backend(quant_report.backend), ModuleBackend)
        return save_quantized(
            float_model if float_model is not None else model,
            out_dir,
            base_dir=base_dir,
            recipe=recipe,
            report=quant_report,
            example_input=example_input,
            qmodel=model if in_memory else None,
            calibration=calibration,
            recipe_key=recipe_key,
        )
    reference = load_original(base_dir).model
    with StagingDir(out_dir) as tmp:
        save_file(_state_for_save(model), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        atomic_write_json(tmp / META_FILE, _meta(kind, base_dir, out_dir, reference, model, recipe, None, recipe_key))
    return out_dir


def save_quantized(
    float_model: nn.Module,
    out_dir: Path,
    *,
    base_dir: Path,
    recipe: dict[str, Any],
    report: QuantReport,
    example_input: torch.Tensor | None = None,
    qmodel: nn.Module | None = None,
    calibration: torch.Tensor | None = None,
    recipe_key: str | None = None,
) -> Path:
    """Quantize ``float_model`` with ``report``'s backend and save the artifact (or save ``qmodel``, an
    in-memory torch backend's result). The report written is the one the backend carried out.
    ``calibration``: preprocessed images for backends that quantize activations statically; ``recipe_key``:
    the recipe's :func:`recipe_hash`."""
    reference = load_original(base_dir).model
    backend = get_backend(report.backend)
    with StagingDir(out_dir) as tmp:
        done = backend.save(
            float_model, report, tmp, example_input=example_input, qmodel=qmodel, calibration=calibration
        )
        meta = _meta("quantized", base_dir, out_dir, reference, float_model, recipe, done, recipe_key)
        atomic_write_json(tmp / META_FILE, meta)
    return out_dir


def _meta(
    kind: ArtifactKind,
    base_dir: Path,
    out_dir: Path,
    reference: nn.Module,
    model: nn.Module,
    recipe: dict[str, Any],
    quant_report: QuantReport | None,
    recipe_key: str | None = None,
) -> dict[str, Any]:
    return {
        "format": 1,
        "kind": kind,
        "base": os.path.relpath(base_dir.resolve(), out_dir.resolve().parent),
        "family": family_of(reference),
        "model_class": type(reference).__name__,
        "structure": describe_structure(model, reference),
        "recipe": recipe,
        "recipe_hash": recipe_key,
        "quantization": quant_report.model_dump() if quant_report else None,
    }


# --- load -------------------------------------------------------------------------------------------

_ORIGINALS: dict[tuple[str, float], LoadedModel] = {}


def load_original(path: Path) -> LoadedModel:
    """The original model saved by :func:`save_original` (cached per process; a fresh copy each call)."""
    key = (str(path.resolve()), (path / WEIGHTS_FILE).stat().st_mtime)
    if key not in _ORIGINALS:
        _ORIGINALS.clear()
        meta = read_json(path / META_FILE)
        _ORIGINALS[key] = source_named(meta.get("source")).load_original(path, meta)
    cached = _ORIGINALS[key]
    # replace() keeps the subclass (FactoryModel) and every field, preprocessing included
    return dataclasses.replace(cached, model=copy.deepcopy(cached.model), id2label=dict(cached.id2label))


def load_compressed(path: str | Path, device: str = "cpu") -> nn.Module | QuantizedModel:
    """Rebuild any model artifact (original, pruned or quantized) without unpickling, ready to run.

    An ``nn.Module``, except for a quantized artifact whose backend deploys another runtime: an
    ``onnxruntime`` artifact loads as an :class:`tools.deploy.onnxruntime.OrtModel` (callable
    ``pixel_values -> logits``, CPU, ``torch.get_num_threads()`` threads). :func:`load_module` insists
    on an ``nn.Module``.
    """
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(
            f"{path} is not a complete model artifact (no {META_FILE} / {deployed_file(path).name})"
        )
    meta = read_json(path / META_FILE)
    if meta["kind"] == "original":
        return load_original(path).model.to(device).eval()
    base = (path.parent / meta["base"]).resolve()

    def rebuild() -> nn.Module:
        model = load_original(base).model
        apply_structure(model, meta["structure"])
        return model

    if meta["kind"] == "quantized":
        report = QuantReport.model_validate(meta["quantization"])
        deployed = get_backend(report.backend).load(path, report, rebuild)
        return deployed.to(device).eval() if isinstance(deployed, nn.Module) else deployed
    model = rebuild()
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except Exception as exc:  # SafetensorError: a damaged or cut-short file
        raise ValueError(
            f"cannot read {path / WEIGHTS_FILE}: {first_line(exc)}; the file is damaged: save or build the model "
            "again (in a run: start it again with a new --run-dir)"
        ) from None
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not _is_tied(model, k, tensors)]
    if missing:
        raise ValueError(f"artifact {path} lacks tensors for {missing[:5]}")
    return model.to(device).eval()


def load_module(path: str | Path, device: str = "cpu") -> nn.Module:
    """:func:`load_compressed` for an artifact that must load as an ``nn.Module`` (a float model, say)."""
    model = load_compressed(path, device)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{path} deploys {type(model).__name__}, not a torch module: it cannot be used as one")
    return model


def _is_tied(model: nn.Module, key: str, tensors: dict[str, torch.Tensor]) -> bool:
    """A key missing from the file because it shares storage with a saved one."""
    state = model.state_dict()
    ptr = state[key].data_ptr()
    return any(state[k].data_ptr() == ptr for k in tensors if k in state)
