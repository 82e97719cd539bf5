"""Hugging Face image classifiers: ``save_pretrained`` directories and hub ids, loaded and saved as originals.

:func:`load_pretrained` reads a local directory (or the HF cache) first and the hub only when it can be
reached; :func:`save_pretrained_original` writes the run's original artifact of such a model (also used
for the built-in and demo models): the ``save_pretrained`` files, the image processor, and the metadata.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

from tools.models.base import LoadedModel, ModelLoadError, family_of, id2label_of
from tools.store.files import META_FILE, StagingDir, atomic_write_json
from tools.text import first_line

logger = logging.getLogger(__name__)

#: The metadata copy a saved original keeps next to its ``save_pretrained`` files (read back: ``untrained``).
MARKER_FILE = "profiling_agent.json"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (no retries, no long waits)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _read_config(spec: str, source: str) -> Any:
    """The model's config: local files first, then the hub if it can be reached (failing fast if not)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/HF errors here
        if source != "hub":
            raise ModelLoadError(f"cannot read a model config from directory {spec!r}: {first_line(exc)}") from exc
    if not hub_reachable():
        raise ModelLoadError(
            f"model {spec!r} is not a local directory, not in the Hugging Face cache, and the hub cannot be "
            "reached: pass a save_pretrained directory or check the network"
        )
    try:
        return AutoConfig.from_pretrained(spec)
    except Exception as exc:
        raise ModelLoadError(f"cannot load {spec!r} from the Hugging Face hub: {first_line(exc)}") from exc


def _model_dir(spec: str, source: str) -> Path | None:
    """The directory ``from_pretrained`` reads ``spec`` from: the spec itself, or its Hugging Face cache snapshot."""
    if source != "hub":
        return Path(spec)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec, "config.json")
    except Exception:  # an id the cache cannot even look up
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def _unreadable(file: Path) -> bool:
    """Whether a weights file fails a cheap check: the safetensors header, the torch zip's directory (at its end)."""
    import zipfile

    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), "pt"):
                return False
        if zipfile.is_zipfile(file):  # torch.save's format: a zip, its directory at the end
            zipfile.ZipFile(file).close()
            return False
        with file.open("rb") as handle:
            return handle.read(1) != b"\x80"  # not a pickle either (torch's legacy format): cut short or not torch
    except Exception:
        return True


def damaged_weights(directory: Path) -> Path | None:
    """The first weights file in a ``save_pretrained`` directory that cannot be read; None when all look sound."""
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        for file in sorted(directory.glob(pattern)):
            if _unreadable(file):
                return file
    return None


def _weights_error(spec: str, source: str, exc: BaseException) -> ModelLoadError:
    """One line naming the weights file that failed (when one is found damaged) and what to do."""
    directory = _model_dir(spec, source)
    file = damaged_weights(directory) if directory is not None and directory.is_dir() else None
    reason = f"{type(exc).__name__}: {first_line(exc)}"
    if file is None:
        where = f"the model in {directory}" if directory is not None else f"model {spec!r}"
        return ModelLoadError(f"cannot load {where}: {reason} (rerun with --debug for the traceback)")
    if directory is not None and (directory / MARKER_FILE).is_file():
        todo = "the run's copy of the model is damaged: start the run again with a new --run-dir"
    elif source == "hub":
        todo = f"the download is damaged: remove it with `hf cache rm model/{spec}` and rerun to download it again"
    else:
        todo = "the file is damaged or incomplete (an interrupted copy?): copy it again or save the model again"
    return ModelLoadError(f"cannot read weights file {file}: {reason}; {todo}")


#: An image processor's file in a ``save_pretrained`` directory.
PROCESSOR_FILE = "preprocessor_config.json"
#: The oldest transformers that reads image processors without torchvision (5.17 needs it), as pyproject.toml says.
MIN_TRANSFORMERS = "5.18"


def _version() -> str:
    import transformers

    return str(transformers.__version__)


def load_pretrained(spec: str, source: str) -> LoadedModel:
    """An image classifier and its image processor from a ``save_pretrained`` directory or a hub id."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    config = _read_config(spec, source)
    try:
        model = AutoModelForImageClassification.from_pretrained(spec, config=config)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise _weights_error(spec, source, exc) from exc
        raise ModelLoadError(
            f"{spec!r} is a {config.model_type!r} model, not an image classifier: "
            "pass a model with an image-classification head"
        ) from exc
    except Exception as exc:  # a damaged weights file: SafetensorError, UnpicklingError, OSError ...
        raise _weights_error(spec, source, exc) from exc
    try:
        processor = AutoImageProcessor.from_pretrained(spec)
    except ImportError as exc:  # a library the processor needs is missing: guessing its normalisation would be wrong
        raise ModelLoadError(
            f"cannot read the image processor of {spec}: {first_line(exc)} (transformers {_version()}); "
            f"install transformers>={MIN_TRANSFORMERS} (pip install -e . does), which reads it without torchvision"
        ) from exc
    except Exception as exc:
        processor_file = Path(spec) / PROCESSOR_FILE
        if processor_file.is_file():
            raise ModelLoadError(
                f"cannot read {processor_file}: {first_line(exc)}; fix or remove it (without it images are "
                "normalised with mean 0.5 and std 0.5)"
            ) from exc
        # no preprocessor_config.json; said once, when the model is acquired, not for the run's copy
        logger.log(
            logging.INFO if (Path(spec) / MARKER_FILE).is_file() else logging.WARNING,
            "%s has no image processor (preprocessor_config.json): images are resized to the model's input size and "
            "normalised with mean 0.5 and std 0.5 per channel; if it was trained otherwise, save its processor there "
            "(AutoImageProcessor.save_pretrained)",
            spec,
        )
        processor = None
    untrained = False
    marker = Path(spec) / MARKER_FILE
    if marker.is_file():
        untrained = bool(json.loads(marker.read_text()).get("untrained", False))
    return LoadedModel(
        model=model.eval(),
        processor=processor,
        family=family_of(model),
        source=source,
        spec=spec,
        untrained=untrained,
        id2label=id2label_of(model),
    )


def save_pretrained_original(loaded: LoadedModel, out_dir: Path) -> None:
    """Write ``out_dir`` atomically: ``save_pretrained`` files (safetensors), the processor, then the metadata."""
    with StagingDir(out_dir) as tmp:
        cast(Any, loaded.model).save_pretrained(tmp, safe_serialization=True)
        if loaded.processor is not None:
            loaded.processor.save_pretrained(tmp)
        meta = {
            "format": 1,
            "kind": "original",
            "spec": loaded.spec,
            "source": loaded.source,
            "family": loaded.family,
            "untrained": loaded.untrained,
            "model_class": type(loaded.model).__name__,
        }
        atomic_write_json(tmp / MARKER_FILE, meta)
        atomic_write_json(tmp / META_FILE, meta)
