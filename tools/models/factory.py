"""Any PyTorch image classifier: ``--model module.path:factory --weights FILE`` and its preprocessing.

A *factory* is a callable importable as ``module.path:name`` that builds the model with no arguments
(``tools.zoo.cifar_resnet:resnet20``, ``torchvision.models:resnet18``, ``my_models:Net``). Its weights
come from a state dict file -- safetensors, or a torch file read with ``weights_only=True`` so that no
arbitrary code is unpickled -- given bare or nested under ``state_dict`` / ``model`` /
``model_state_dict``, with any ``module.`` (DataParallel) or ``_orig_mod.`` (``torch.compile``) prefix
stripped. Without ``--weights`` the model keeps its seeded initial weights and is marked untrained.

A plain model has no image processor, so the preprocessing is part of the spec: ``image_size``
(height, width), ``channels`` (1: greyscale 'L' images, 3: RGB), and the per-channel ``mean`` / ``std``
applied after scaling pixels to [0, 1] -- what ``torchvision.transforms.ToTensor`` + ``Normalize`` do.

The run's original artifact of a factory model is ``model.safetensors`` (the state dict, shared tensors
stored once) plus ``factory.json`` (the :class:`FactorySpec`, without the weights path); a later process
rebuilds it by importing the factory and loading the safetensors -- nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from torch import nn

from tools.models.sources import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    LoadedModel,
    ModelLoadError,
    build_preprocess,
    family_of,
    logits_of,
)

logger = logging.getLogger(__name__)

SOURCE = "factory"
WEIGHTS_FILE = "model.safetensors"
FACTORY_FILE = "factory.json"
META_FILE = "artifact.json"
DEFAULT_IMAGE_SIZE = (224, 224)
#: Keys under which training scripts commonly nest the state dict, tried in this order.
NESTED_KEYS = ("state_dict", "model_state_dict", "model")
#: Key prefixes added by wrappers: ``nn.DataParallel`` / DDP and ``torch.compile``.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
#: Buffers that checkpoints often lack and whose absence changes nothing in eval mode.
OPTIONAL_BUFFERS = ("num_batches_tracked",)

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_FACTORY_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}$")
_SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Parsing options
# --------------------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _preview(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(str(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def parse_labels(value: str | Sequence[str] | None) -> list[str]:
    """Class names: comma-separated (``"cat,dog"``), a file with one name per line, or a list; [] for None.

    Blank lines of a file are skipped; names are stripped; empty or duplicate names are errors.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ModelLoadError("--labels is empty: give comma-separated class names or a file, one name per line")
        path = Path(text).expanduser()
        if path.is_file():
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"cannot read labels file {text}: {_first_line(exc)}") from exc
            names = [line.strip() for line in lines if line.strip()]
            if not names:
                raise ModelLoadError(f"labels file {text} has no class names (one name per line)")
        elif "," in text:
            names = [part.strip() for part in text.split(",")]
        else:
            raise ModelLoadError(
                f"--labels {text!r} is neither a file nor a comma-separated list: "
                "give 'name0,name1,...' or a file with one class name per line"
            )
    else:
        names = [str(v).strip() for v in value]
    if any(not name for name in names):
        raise ModelLoadError(f"--labels has an empty class name at position {names.index('')}: {_preview(names)}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ModelLoadError(f"--labels names {_preview(duplicates)} more than once: class names must be unique")
    return names


def parse_image_size(value: str | int | Sequence[int]) -> tuple[int, int]:
    """(height, width) from ``"32"``, ``"32x48"`` (height x width), an int, or a pair."""
    parts: list[Any]
    if isinstance(value, bool):
        parts = []
    elif isinstance(value, int):
        parts = [value, value]
    elif isinstance(value, str):
        text = value.strip().lower().replace("×", "x")
        parts = [p.strip() for p in text.split("x")] if "x" in text else [text, text]
    else:
        parts = list(value)
        if len(parts) == 1:
            parts = parts * 2
    try:
        if len(parts) != 2:
            raise ValueError
        height, width = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ModelLoadError(f"--image-size {value!r}: give one size (32) or height x width (32x48)") from None
    if height < 1 or width < 1:
        raise ModelLoadError(f"--image-size {value!r}: sizes must be positive")
    return height, width


def parse_floats(value: str | float | Sequence[float], name: str = "value") -> list[float]:
    """Floats from ``"0.5"``, ``"0.485,0.456,0.406"``, a number, or a sequence (finite values only)."""
    items: list[Any]
    if isinstance(value, bool):
        items = [None]
    elif isinstance(value, int | float):
        items = [value]
    elif isinstance(value, str):
        items = [p.strip() for p in value.strip().strip("()[]").split(",")]
    else:
        items = list(value)
    try:
        floats = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ModelLoadError(
            f"--{name} {value!r}: give one number or comma-separated numbers (0.485,0.456,0.406)"
        ) from None
    if not floats or not all(math.isfinite(v) for v in floats):
        raise ModelLoadError(f"--{name} {value!r}: give finite numbers")
    return floats


def is_factory_spec(spec: str) -> bool:
    """Whether ``spec`` reads as ``module.path:callable`` (and is not an existing directory)."""
    return bool(_FACTORY_RE.match(spec.strip())) and not Path(spec).is_dir()


# --------------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------------


class Preprocessing(BaseModel):
    """How images become model inputs: resize, 'L' (1 channel) or 'RGB' (3), scale to [0, 1], normalise."""

    model_config = ConfigDict(extra="forbid")

    image_size: tuple[int, int] = Field(description="(height, width) the images are resized to.")
    channels: int = Field(description="1: greyscale 'L' images; 3: RGB.")
    mean: list[float] = Field(description="Per-channel mean subtracted after scaling to [0, 1].")
    std: list[float] = Field(description="Per-channel std divided by after subtracting the mean.")

    @field_validator("image_size")
    @classmethod
    def _positive_size(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) < 1:
            raise ValueError(f"image_size {value} must be positive")
        return value

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: int) -> int:
        if value not in (1, 3):
            raise ValueError(f"channels must be 1 (greyscale) or 3 (RGB), not {value}")
        return value

    @model_validator(mode="after")
    def _broadcast(self) -> Preprocessing:
        for name in ("mean", "std"):
            values: list[float] = getattr(self, name)
            if len(values) == 1 and self.channels > 1:
                setattr(self, name, values * self.channels)
            elif len(values) != self.channels:
                raise ValueError(
                    f"{len(values)} {name} values for {self.channels} channels: give one value or one per channel"
                )
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be positive, not {self.std}")
        return self

    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width)."""
        return (self.channels, *self.image_size)


class FactorySpec(Preprocessing):
    """A plain PyTorch classifier: its factory, weights, class names and preprocessing."""

    factory: str = Field(description="'module.path:callable' that builds the model with no arguments.")
    weights: str | None = Field(default=None, description="State dict file (safetensors or torch); None: untrained.")
    labels: list[str] = Field(default_factory=list, description="Class names in output order; [] for class_N.")

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str) -> str:
        value = value.strip()
        if not _FACTORY_RE.match(value):
            raise ValueError(f"factory {value!r} must read module.path:callable")
        return value

    @classmethod
    def from_options(
        cls,
        factory: str,
        *,
        weights: str | os.PathLike[str] | None = None,
        labels: str | Sequence[str] | None = None,
        image_size: str | int | Sequence[int] | None = None,
        mean: str | float | Sequence[float] | None = None,
        std: str | float | Sequence[float] | None = None,
        channels: int | str | None = None,
    ) -> FactorySpec:
        """Parse command-line values (strings or parsed values) into a spec; ``ModelLoadError`` on bad input.

        Defaults: ``image_size`` 224x224; ``channels`` = the number of ``mean`` values when more than one,
        else 3; ``mean`` / ``std`` = the ImageNet statistics for 3 channels, 0.5 otherwise (one value is
        used for every channel). ``weights`` must exist and is stored as an absolute path.
        """
        if not _FACTORY_RE.match(factory.strip()):
            raise ModelLoadError(f"--model {factory!r} is not a factory: write module.path:callable")
        mean_values = None if mean is None else parse_floats(mean, "mean")
        std_values = None if std is None else parse_floats(std, "std")
        if channels is None:
            counts = [len(v) for v in (mean_values, std_values) if v is not None and len(v) > 1]
            n_channels = counts[0] if counts else 3
        else:
            try:
                n_channels = int(channels)
            except (TypeError, ValueError):
                raise ModelLoadError(f"--channels {channels!r}: give 1 (greyscale) or 3 (RGB)") from None
        if mean_values is None:
            mean_values = list(IMAGENET_MEAN) if n_channels == 3 else [0.5]
        if std_values is None:
            std_values = list(IMAGENET_STD) if n_channels == 3 else [0.5]
        weights_path: str | None = None
        if weights is not None:
            path = Path(weights).expanduser()
            if not path.is_file():
                raise ModelLoadError(f"--weights {str(weights)!r}: no such file")
            weights_path = str(path.resolve())
        size = DEFAULT_IMAGE_SIZE if image_size is None else parse_image_size(image_size)
        try:
            return cls(
                factory=factory.strip(),
                weights=weights_path,
                labels=parse_labels(labels),
                image_size=size,
                mean=mean_values,
                std=std_values,
                channels=n_channels,
            )
        except ValidationError as exc:
            raise ModelLoadError(f"--model {factory}: {_validation_message(exc)}") from None

    def preprocessing(self) -> Preprocessing:
        return Preprocessing(image_size=self.image_size, channels=self.channels, mean=self.mean, std=self.std)


def _validation_message(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


@dataclasses.dataclass
class FactoryModel(LoadedModel):
    """A :class:`LoadedModel` built by a factory: the spec that rebuilds it and its preprocessing.

    ``preprocessing`` is ``Preprocessing.model_dump()``; it is the field proposed for ``LoadedModel``
    itself (re-declaring it here stays valid once the base class has it).
    """

    preprocessing: dict[str, Any] | None = None
    factory_spec: FactorySpec | None = None


def preprocess_for(spec: Preprocessing | Mapping[str, Any]) -> Callable[[list[Image.Image]], torch.Tensor]:
    """Images -> normalised batch ``(N, channels, height, width)`` for a factory model.

    Reuses :func:`tools.models.build_preprocess` (no processor): ``convert('L' | 'RGB')``, bilinear resize
    to ``image_size``, scale to [0, 1], ``(x - mean) / std``.
    """
    pre = spec if isinstance(spec, Preprocessing) else Preprocessing.model_validate(dict(spec))
    return build_preprocess(None, pre.input_shape(), mean=list(pre.mean), std=list(pre.std))


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------


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
        raise ModelLoadError(f"cannot read weights file {path} as a torch file: {reason}") from None
    except Exception as exc:  # corrupt zip, truncated file, wrong format ...
        raise ModelLoadError(
            f"cannot read weights file {path} as a torch or safetensors file: {_first_line(exc)}"
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
            return dict(candidate)
    nested = [where for where, c in candidates[:-1]]
    hint = f" (nor is what is {' / '.join(nested)})" if nested else ""
    raise ModelLoadError(
        f"{path} is not a state dict: it holds {_describe(obj)}{hint}; expected names -> tensors, bare or "
        f"under {' / '.join(repr(k) for k in NESTED_KEYS)}"
    )


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    stripped = True
    while stripped and state:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):
                state = {key[len(prefix) :]: value for key, value in state.items()}
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
        raise ModelLoadError(f"weights file {str(path)!r} not found" if not file.exists() else f"{path} is not a file")
    if _is_safetensors(file):
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(str(file), device="cpu")
        except Exception as exc:
            raise ModelLoadError(f"cannot read safetensors file {file}: {_first_line(exc)}") from None
    else:
        obj = _torch_load(file)
    return _strip_prefixes(_as_state_dict(obj, file))


# --------------------------------------------------------------------------------------------------
# Building the model
# --------------------------------------------------------------------------------------------------


@contextmanager
def _extra_sys_path(directory: str | None) -> Iterator[None]:
    if not directory or directory in sys.path:
        yield
        return
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        if directory in sys.path:
            sys.path.remove(directory)


def _import_module(module_name: str, fallback_dirs: Sequence[str]) -> Any:
    """Import ``module_name``; when it is not found, retry with each of ``fallback_dirs`` on sys.path."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != top:
            raise  # the module exists but one of its own imports is missing
        for directory in fallback_dirs:
            if (Path(directory) / f"{top}.py").is_file() or (Path(directory) / top).is_dir():
                with _extra_sys_path(directory):
                    return importlib.import_module(module_name)
        raise


def import_factory(factory: str, search_dirs: Sequence[str] = ()) -> Callable[[], Any]:
    """The callable named by ``module.path:name``; ``ModelLoadError`` if it cannot be imported.

    A module that is not importable as is is looked for in ``search_dirs``, then the current directory.
    """
    if not _FACTORY_RE.match(factory.strip()):
        raise ModelLoadError(f"--model {factory!r} is not a factory: write module.path:callable")
    module_name, _, attr = factory.strip().partition(":")
    dirs = [*search_dirs, os.getcwd()]
    try:
        module = _import_module(module_name, dirs)
    except ModuleNotFoundError as exc:
        raise ModelLoadError(
            f"cannot import module {module_name!r} of --model {factory}: {_first_line(exc)} "
            "(put it on PYTHONPATH or run from its directory)"
        ) from None
    except Exception as exc:  # the module's own code failed
        raise ModelLoadError(
            f"importing module {module_name!r} of --model {factory} failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    target = getattr(module, attr, None)
    if target is None:
        available = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        )
        hint = f"; callables there: {_preview(available, 8)}" if available else ""
        raise ModelLoadError(f"module {module_name!r} has no {attr!r} for --model {factory}{hint}")
    if not callable(target):
        raise ModelLoadError(f"{factory} is a {type(target).__name__}, not a callable that builds a model")
    return target  # type: ignore[no-any-return]


def _import_root(factory: str) -> str | None:
    """The sys.path entry the factory's module was imported from (None when unknown)."""
    module_name = factory.partition(":")[0]
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    root = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    for _ in range(depth):
        root = root.parent
    return str(root)


def call_factory(factory: str, search_dirs: Sequence[str] = ()) -> nn.Module:
    """Import and call the factory with no arguments (seeded), returning the ``nn.Module`` in eval mode."""
    build = import_factory(factory, search_dirs)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build()
    except Exception as exc:
        raise ModelLoadError(
            f"calling {factory}() failed: {type(exc).__name__}: {_first_line(exc)} "
            "(the factory must build the model with no arguments)"
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"{factory}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


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
            f"weights {source} do not fit {factory}(): {len(mismatched)} shape mismatches ({_preview(mismatched, 3)})"
        )
    result = model.load_state_dict(dict(state), strict=False)
    missing = [k for k in result.missing_keys if k.rpartition(".")[2] not in OPTIONAL_BUFFERS]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys ({_preview(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys ({_preview(unexpected)})")
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


def count_outputs(model: nn.Module, pre: Preprocessing) -> int:
    """Number of logits for one input of ``pre``'s shape (a dry run); ``ModelLoadError`` if it fails."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = torch.zeros(1, *pre.input_shape(), device=device)
    try:
        with torch.inference_mode():
            logits = logits_of(model(example))
    except Exception as exc:
        raise ModelLoadError(
            f"the model does not run on a {tuple(example.shape)} input: {type(exc).__name__}: {_first_line(exc)} "
            "(check --image-size and --channels)"
        ) from None
    if logits.ndim != 2 or logits.shape[0] != 1:
        raise ModelLoadError(
            f"the model returned an output of shape {tuple(logits.shape)} for one image: expected (1, classes)"
        )
    return int(logits.shape[-1])


def build_factory_model(spec: FactorySpec, *, search_dirs: Sequence[str] = ()) -> FactoryModel:
    """Import and call ``spec.factory``, load ``spec.weights``, and check the outputs by a dry run.

    ``id2label`` comes from ``spec.labels`` (their count must equal the number of outputs), else
    ``class_0``, ``class_1``, ... The model is untrained (seeded initial weights) when no weights are given.
    """
    model = call_factory(spec.factory, search_dirs)
    if spec.weights is not None:
        state = load_state_dict_file(spec.weights)
        load_weights(model, state, source=spec.weights, factory=spec.factory)
        logger.info("loaded %d tensors from %s into %s()", len(state), spec.weights, spec.factory)
    else:
        logger.warning("%s: no --weights given, the model keeps its initial (random) weights", spec.factory)
    model.eval()
    pre = spec.preprocessing()
    outputs = count_outputs(model, pre)
    if spec.labels and len(spec.labels) != outputs:
        raise ModelLoadError(f"{len(spec.labels)} labels given but {spec.factory}() has {outputs} outputs")
    labels = spec.labels or [f"class_{i}" for i in range(outputs)]
    return FactoryModel(
        model=model,
        processor=None,
        family=family_of(model),
        source=SOURCE,
        spec=spec.factory,
        untrained=spec.weights is None,
        id2label=dict(enumerate(labels)),
        preprocessing=pre.model_dump(mode="json"),
        factory_spec=spec,
    )


# --------------------------------------------------------------------------------------------------
# The run's original artifact
# --------------------------------------------------------------------------------------------------


class FactoryArtifact(BaseModel):
    """What ``factory.json`` holds: the spec (no weights path), whether it is untrained, where it imports from."""

    format: int = 1
    spec: FactorySpec
    untrained: bool
    import_root: str | None = Field(
        default=None, description="Directory the factory's module was imported from, tried when it is not importable."
    )


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def save_factory_original(loaded: LoadedModel, spec: FactorySpec, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``model.safetensors`` (shared tensors once), ``factory.json`` and, last, ``artifact.json``.

    ``out_dir`` is created if needed; callers that want an atomic directory write into a staging dir.
    The ``labels`` saved are the model's ``id2label`` (so ``class_N`` names survive too).
    """
    from safetensors.torch import save_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = [loaded.id2label[i] for i in sorted(loaded.id2label)]
    stored = spec.model_copy(update={"weights": None, "labels": labels})
    model = loaded.model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    save_model(model.cpu(), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    model.to(device)
    artifact = FactoryArtifact(spec=stored, untrained=loaded.untrained, import_root=_import_root(spec.factory))
    _write_json(out / FACTORY_FILE, artifact.model_dump(mode="json"))
    meta = {
        "format": 1,
        "kind": "original",
        "spec": loaded.spec,
        "source": SOURCE,
        "family": loaded.family,
        "untrained": loaded.untrained,
        "model_class": type(model).__name__,
        "factory": stored.factory,
    }
    _write_json(out / META_FILE, meta)
    return out


def is_factory_artifact(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an original artifact written by :func:`save_factory_original`."""
    meta = Path(path) / META_FILE
    if not meta.is_file() or not (Path(path) / FACTORY_FILE).is_file():
        return False
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("source") == SOURCE
    except (OSError, ValueError):
        return False


def load_factory_original(out_dir: str | os.PathLike[str]) -> FactoryModel:
    """Rebuild a saved factory model: import the factory, call it, load ``model.safetensors`` (on CPU)."""
    from safetensors.torch import load_model

    out = Path(out_dir)
    try:
        artifact = FactoryArtifact.model_validate_json((out / FACTORY_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{out} is not a factory model artifact (no {FACTORY_FILE})") from None
    except ValidationError as exc:
        raise ModelLoadError(f"{out / FACTORY_FILE} is invalid: {_validation_message(exc)}") from None
    spec = artifact.spec
    model = call_factory(spec.factory, [artifact.import_root] if artifact.import_root else [])
    try:
        missing, unexpected = load_model(model, str(out / WEIGHTS_FILE), strict=False, device="cpu")
    except Exception as exc:
        raise ModelLoadError(f"cannot load {out / WEIGHTS_FILE} into {spec.factory}(): {_first_line(exc)}") from None
    missing = [k for k in missing if k.rpartition(".")[2] not in OPTIONAL_BUFFERS]
    if missing or unexpected:
        raise ModelLoadError(
            f"{out / WEIGHTS_FILE} does not fit {spec.factory}() any more (has the factory changed?): "
            f"missing {_preview(sorted(missing))}; unexpected {_preview(sorted(unexpected))}"
        )
    model.eval()
    return FactoryModel(
        model=model,
        processor=None,
        family=family_of(model),
        source=SOURCE,
        spec=spec.factory,
        untrained=artifact.untrained,
        id2label=dict(enumerate(spec.labels)),
        preprocessing=spec.preprocessing().model_dump(mode="json"),
        factory_spec=spec,
    )


__all__ = [
    "FACTORY_FILE",
    "SOURCE",
    "FactoryArtifact",
    "FactoryModel",
    "FactorySpec",
    "Preprocessing",
    "build_factory_model",
    "call_factory",
    "count_outputs",
    "import_factory",
    "is_factory_artifact",
    "is_factory_spec",
    "load_factory_original",
    "load_state_dict_file",
    "load_weights",
    "parse_floats",
    "parse_image_size",
    "parse_labels",
    "preprocess_for",
    "save_factory_original",
]
