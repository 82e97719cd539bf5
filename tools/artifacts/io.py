"""Safe save / load of original, pruned and quantized models.

Every model artifact is a directory with its deployed file (no pickle) and ``artifact.json``:

* ``original``: written and read back by the model's source (:func:`tools.models.sources.source_named`):
  a ``save_pretrained`` directory (config, ``model.safetensors``, image processor), or a factory model's
  ``model.safetensors`` and ``factory.json``.
* ``pruned``: ``model.safetensors`` plus a description of how the structure differs from the original
  (:mod:`tools.artifacts.structure`), so the model is rebuilt from the original's config, resized, and loaded,
  without unpickling anything.
* ``quantized``: the deployment backend's deployed file (``model.safetensors`` with int8 weights and
  scales for ``torch-ao-dynamic``, an int8 ``model.onnx`` for ``onnxruntime``...), the float structure,
  and the quantization report naming the backend that loads it back (:func:`deployed_file`, through
  :data:`tools.deploy.registry.BACKENDS`).

A pruned or quantized artifact also carries its recipe hash (:mod:`tools.artifacts.hashes`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tools.artifacts.structure import apply_structure, describe_structure
from tools.deploy.accuracy import AccuracyControl
from tools.deploy.base import Build, ModuleBackend, QuantizedModel, QuantReport
from tools.deploy.cpu import detect_cpu
from tools.deploy.registry import BACKENDS, get_backend
from tools.models.base import LoadedModel, clone_module, family_of
from tools.models.checkpoints import load_saved
from tools.models.sources import source_named
from tools.store.files import META_FILE, WEIGHTS_FILE, StagingDir, atomic_write_json, read_json
from tools.text import first_line

logger = logging.getLogger(__name__)

ArtifactKind = Literal["original", "pruned", "quantized"]


def deployed_file(artifact_dir: Path) -> Path:
    """The file an artifact deploys (its ``memory_mb``): the quantization backend's, else ``model.safetensors``."""
    artifact_dir = Path(artifact_dir)
    try:
        meta = read_json(artifact_dir / META_FILE)
    except (OSError, ValueError):
        return artifact_dir / WEIGHTS_FILE
    quantization = meta.get("quantization") if isinstance(meta, dict) else None
    if meta.get("kind") == "quantized" and isinstance(quantization, dict):
        backend = BACKENDS.get(str(quantization.get("backend")))
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
    backend = BACKENDS.get(str(quantization.get("backend")))
    weights = getattr(backend, "weights_file", None)
    return [main, Path(artifact_dir) / weights] if weights else [main]


def is_complete(artifact_dir: Path) -> bool:
    """An artifact directory is complete once its metadata exists (it is written last, by rename)."""
    return (artifact_dir / META_FILE).is_file() and all(f.is_file() for f in deployed_files(artifact_dir))


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
    accuracy_control: AccuracyControl | None = None,
) -> Path:
    """Quantize ``float_model`` with ``report``'s backend and save the artifact (or save ``qmodel``, an
    in-memory torch backend's result). The report written is the one the backend carried out.
    ``calibration``: preprocessed images for backends that quantize activations statically; ``recipe_key``:
    the recipe's :func:`recipe_hash`; ``accuracy_control``: for the mixed-precision backends."""
    reference = load_original(base_dir).model
    backend = get_backend(report.backend)
    with StagingDir(out_dir) as tmp:
        build = Build(float_model, report, tmp, example_input, qmodel, calibration, accuracy_control)
        done = backend.save(build)
        meta = _meta("quantized", base_dir, out_dir, reference, float_model, recipe, done, recipe_key)
        atomic_write_json(tmp / META_FILE, meta)
    return out_dir


def copy_artifact(source: Path, target: Path) -> Path:
    """Copy the complete artifact at ``source`` to ``target`` (replaced whole), its original found from there:
    the files as they are, ``artifact.json`` with its ``base`` made relative to ``target``."""
    source, target = Path(source), Path(target)
    if not is_complete(source):
        raise FileNotFoundError(f"{source} is not a complete model artifact: nothing to copy")
    meta = read_json(source / META_FILE)
    if meta.get("base"):
        base = (source.parent / meta["base"]).resolve()
        meta["base"] = os.path.relpath(base, target.resolve().parent)
    with StagingDir(target) as tmp:
        for item in source.iterdir():
            if item.is_file() and item.name != META_FILE:
                shutil.copy2(item, tmp / item.name)
        atomic_write_json(tmp / META_FILE, meta)
    return target


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
#: The CPU-kind warnings already given by this process (one per artifact).
_WARNED: set[str] = set()


def load_original(path: Path) -> LoadedModel:
    """The original model saved by :func:`save_original` (cached per process; a fresh copy each call)."""
    key = (str(path.resolve()), (path / WEIGHTS_FILE).stat().st_mtime)
    if key not in _ORIGINALS:
        _ORIGINALS.clear()
        meta = read_json(path / META_FILE)
        _ORIGINALS[key] = source_named(meta.get("source")).load_original(path, meta)
    cached = _ORIGINALS[key]
    # replace() keeps the subclass (FactoryModel) and every field, preprocessing included
    return dataclasses.replace(cached, model=clone_module(cached.model), id2label=dict(cached.id2label))


def load_compressed(path: str | Path, device: str = "cpu") -> nn.Module | QuantizedModel:
    """Rebuild any model artifact (original, pruned or quantized) without unpickling, ready to run.

    An ``nn.Module``, except for a quantized artifact whose backend deploys another runtime: an
    ``onnxruntime`` artifact loads as an :class:`tools.deploy.onnxruntime.session.OrtModel` (callable
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
        warning = report.int8.warning(detect_cpu(), path) if report.int8 is not None else None
        if warning and warning not in _WARNED:  # built for VNNI, loaded where int8 pair sums saturate: once a process
            _WARNED.add(warning)
            logger.warning(warning)
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
    missing, _ = load_saved(model, tensors)
    if missing:
        raise ValueError(f"artifact {path} lacks tensors for {missing[:5]}")
    return model.to(device).eval()


def load_module(path: str | Path, device: str = "cpu") -> nn.Module:
    """:func:`load_compressed` for an artifact that must load as an ``nn.Module`` (a float model, say)."""
    model = load_compressed(path, device)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{path} deploys {type(model).__name__}, not a torch module: it cannot be used as one")
    return model


__all__ = [
    "ArtifactKind",
    "deployed_file",
    "deployed_files",
    "is_complete",
    "load_compressed",
    "load_module",
    "load_original",
    "save_compressed",
    "save_original",
    "save_quantized",
]
