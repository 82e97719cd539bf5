"""State dict files, read without running code, and loaded into a model with one-line error messages.

:func:`load_state_dict_file` reads safetensors, or a torch file with ``weights_only=True`` so that no
arbitrary code is unpickled; the state dict may be bare or nested under ``state_dict`` /
``model_state_dict`` / ``model``, and any ``module.`` (DataParallel) or ``_orig_mod.`` (``torch.compile``)
prefix is stripped. :func:`load_weights` loads it and reports mismatches, with a hint for a key prefix.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.models.base import ModelLoadError
from tools.text import first_line, preview

logger = logging.getLogger(__name__)

#: Keys under which training scripts commonly nest the state dict, tried in this order.
NESTED_KEYS = ("state_dict", "model_state_dict", "model")
#: Key prefixes added by wrappers: ``nn.DataParallel`` / DDP and ``torch.compile``.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
#: Buffers that checkpoints often lack and whose absence changes nothing in eval mode.
OPTIONAL_BUFFERS = ("num_batches_tracked",)

_SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024
#: What to do about a weights file that cannot be read.
DAMAGED_HINT = (
    "it is damaged, cut short or no state dict: copy it again, or pass a file written by "
    "torch.save(model.state_dict(), ...) or safetensors"
)


def _is_safetensors(path: Path) -> bool:
    """safetensors files start with an 8-byte little-endian header length, then a JSON object."""
    if path.suffix == ".safetensors":
        return True
    with path.open("rb") as handle:
        head = handle.read(9)
    if len(head) < 9:
        return False
    size = int.from_bytes(head[:8], "little")
    return 0 < size < _SAFETENSORS_HEADER_LIMIT and head[8:9] == b"{"


def _unpickler_error(message: str) -> str:
    """The reason torch's weights-only unpickler gives, on one line."""
    match = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", message, re.S)
    return " ".join((match.group(1) if match else message).split())


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickler_error(str(exc))
        found = re.search(r"GLOBAL ([\w.]+)", reason)
        if found or re.search(r"global|reduce|class", reason, re.I):
            what = f"an object of class {found.group(1)}" if found else "objects other than tensors"
            raise ModelLoadError(
                f"refusing to unpickle {path}: it holds {what}, and arbitrary code is never run on load; "
                "save model.state_dict() (torch.save or safetensors) and pass that file"
            ) from None
        raise ModelLoadError(f"cannot read weights file {path} as a torch file: {reason}; {DAMAGED_HINT}") from None
    except Exception as exc:  # corrupt zip, truncated file, wrong format ...
        raise ModelLoadError(
            f"cannot read weights file {path} as a torch or safetensors file: {first_line(exc)}; {DAMAGED_HINT}"
        ) from None


def _describe(obj: Any) -> str:
    if isinstance(obj, Mapping):
        keys = [f"{k} ({type(v).__name__})" for k, v in list(obj.items())[:4]]
        more = f", ... ({len(obj)} keys)" if len(obj) > 4 else ""
        return f"a dict of {', '.join(keys)}{more}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


def _as_state_dict(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    """The state dict in a loaded checkpoint: the object itself or one nested under ``NESTED_KEYS``."""
    candidates: list[tuple[str, Any]] = []
    if isinstance(obj, Mapping):
        candidates = [(f"under {key!r}", obj[key]) for key in NESTED_KEYS if isinstance(obj.get(key), Mapping)]
        candidates.append(("", obj))
    for where, candidate in candidates:
        if candidate and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in candidate.items()):
            if where:
                logger.info("weights %s: state dict found %s", path, where)
            return _with_metadata(candidate, getattr(candidate, "_metadata", None))
    nested = [where for where, c in candidates[:-1]]
    hint = f" (nor is what is {' / '.join(nested)})" if nested else ""
    raise ModelLoadError(
        f"{path} is not a state dict: it holds {_describe(obj)}{hint}; expected names -> tensors, bare or "
        f"under {' / '.join(repr(k) for k in NESTED_KEYS)}"
    )


def _with_metadata(state: Mapping[str, torch.Tensor], metadata: Any) -> OrderedDict[str, torch.Tensor]:
    """``state`` as an ordered dict carrying a torch checkpoint's module versions (``_metadata``), if it has them."""
    out: OrderedDict[str, torch.Tensor] = OrderedDict(state)
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without a wrapper's prefix on every key (its module versions re-keyed the same way)."""
    stripped = True
    while stripped and state:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):
                metadata = getattr(state, "_metadata", None)
                if metadata is not None:
                    wrapper = prefix.removesuffix(".")
                    metadata = {
                        ("" if k == wrapper else k[len(prefix) :]): v
                        for k, v in metadata.items()
                        if k == wrapper or k.startswith(prefix)
                    }
                state = _with_metadata({key[len(prefix) :]: value for key, value in state.items()}, metadata)
                logger.info("weights: stripped the %r prefix of every key", prefix)
                stripped = True
    return state


def load_state_dict_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a state dict (CPU tensors) from safetensors or a torch file, without unpickling code.

    Torch files are read with ``torch.load(map_location="cpu", weights_only=True)``; the state dict may
    be nested under ``state_dict`` / ``model_state_dict`` / ``model``; ``module.`` and ``_orig_mod.``
    prefixes are stripped. Raises ``ModelLoadError`` (one line) for a missing or unreadable file, a file
    that is not a state dict, or a pickle that needs arbitrary classes.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        what = "not found" if not file.exists() else "is not a file"
        raise ModelLoadError(f"weights file {str(path)!r} {what}: pass the path of the model's state dict file")
    if _is_safetensors(file):
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(str(file), device="cpu")
        except Exception as exc:
            raise ModelLoadError(f"cannot read safetensors file {file}: {first_line(exc)}; {DAMAGED_HINT}") from None
    else:
        obj = _torch_load(file)
    return _strip_prefixes(_as_state_dict(obj, file))


def versioned(model: nn.Module, state: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """``state`` as ``load_state_dict`` takes it, with module versions: its own (a torch checkpoint keeps them in
    ``_metadata``), else ``model``'s (a safetensors file keeps none, and some modules refuse a state without one:
    torchvision's MNASNet raises "version should be set to 1 or 2")."""
    own = getattr(state, "_metadata", None)
    return _with_metadata(state, own if own is not None else getattr(model.state_dict(), "_metadata", None))


def load_saved(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load tensors the project saved (:func:`versioned`, strict=False): (missing keys, unexpected keys), without the
    keys a file leaves out because they share storage with a saved one (tied weights; safetensors keeps one)."""
    result = model.load_state_dict(versioned(model, tensors), strict=False)
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors if k in state}
    missing = [k for k in result.missing_keys if state[k].data_ptr() not in loaded]
    return missing, list(result.unexpected_keys)


def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor], *, source: str, factory: str) -> None:
    """Load ``state`` into ``model`` (strict=False) and raise ``ModelLoadError`` on any real mismatch.

    Missing ``num_batches_tracked`` buffers are tolerated; other missing keys, unexpected keys and shape
    mismatches are reported, a few of each, in one line.
    """
    own = model.state_dict()
    mismatched = [
        f"{key} {tuple(value.shape)} vs model {tuple(own[key].shape)}"
        for key, value in state.items()
        if key in own and tuple(own[key].shape) != tuple(value.shape)
    ]
    if mismatched:
        raise ModelLoadError(
            f"weights {source} do not fit {factory}(): {len(mismatched)} shape mismatches ({preview(mismatched, 3)})"
        )
    result = model.load_state_dict(versioned(model, state), strict=False)
    missing = [k for k in result.missing_keys if k.rpartition(".")[2] not in OPTIONAL_BUFFERS]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys ({preview(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys ({preview(unexpected)})")
        raise ModelLoadError(
            f"weights {source} do not fit {factory}(): {'; '.join(parts)}{_prefix_hint(missing, unexpected)}"
        )
    tolerated = len(result.missing_keys) - len(missing)
    if tolerated:
        logger.info(
            "weights %s: %d %s buffers absent (kept at their initial values)", source, tolerated, OPTIONAL_BUFFERS
        )


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    """A hint when the checkpoint's keys carry (or lack) one extra leading component."""
    if not missing or not unexpected:
        return ""
    heads = {key.split(".", 1)[0] for key in unexpected if "." in key}
    if len(heads) == 1:
        head = next(iter(heads))
        if {key.split(".", 1)[1] for key in unexpected if "." in key} & set(missing):
            return f" -- the checkpoint's keys carry an extra {head + '.'!r} prefix"
    return ""
