"""Any PyTorch image classifier: ``--model module.path:factory --weights FILE``, built, checked, saved.

A *factory* is a callable importable as ``module.path:name`` that builds the model with no arguments
(``tools.zoo.cifar_resnet:resnet20``, ``torchvision.models:resnet18``, ``my_models:Net``). Its weights
come from a state dict file (:mod:`tools.models.checkpoints`); without ``--weights`` the model keeps its
seeded initial weights and is marked untrained. Its preprocessing is part of its spec
(:mod:`tools.models.specs`).

The run's original artifact of a factory model is ``model.safetensors`` (the state dict, shared tensors
stored once) plus ``factory.json`` (the :class:`FactorySpec`, without the weights path); a later process
rebuilds it by importing the factory and loading the safetensors -- nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field, ValidationError
from torch import nn

from tools.models.base import LoadedModel, ModelLoadError, family_of, logits_of
from tools.models.checkpoints import OPTIONAL_BUFFERS, load_saved, load_state_dict_file, load_weights
from tools.models.input_shape import resolve_factory_spec
from tools.models.specs import FACTORY_RE, FactorySpec, Preprocessing, validation_message
from tools.store.files import META_FILE, WEIGHTS_FILE, StagingDir, atomic_write_json
from tools.text import first_line, preview

logger = logging.getLogger(__name__)

SOURCE = "factory"
FACTORY_FILE = "factory.json"


@dataclasses.dataclass
class FactoryModel(LoadedModel):
    """A :class:`LoadedModel` built by a factory: the spec that rebuilds it (and, inherited, its preprocessing).

    ``preprocessing`` is ``Preprocessing.model_dump()``.
    """

    factory_spec: FactorySpec | None = None


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
    if not FACTORY_RE.match(factory.strip()):
        raise ModelLoadError(f"--model {factory!r} is not a factory: write module.path:callable")
    module_name, _, attr = factory.strip().partition(":")
    dirs = [*search_dirs, os.getcwd()]
    try:
        module = _import_module(module_name, dirs)
    except ModuleNotFoundError as exc:
        raise ModelLoadError(
            f"cannot import module {module_name!r} of --model {factory}: {first_line(exc)} "
            "(put it on PYTHONPATH or run from its directory)"
        ) from None
    except Exception as exc:  # the module's own code failed
        raise ModelLoadError(
            f"importing module {module_name!r} of --model {factory} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    target = getattr(module, attr, None)
    if target is None:
        available = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        )
        hint = f"; callables there: {preview(available, 8)}" if available else ""
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
            f"calling {factory}() failed: {type(exc).__name__}: {first_line(exc)} "
            "(the factory must build the model with no arguments)"
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"{factory}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def count_outputs(model: nn.Module, pre: Preprocessing) -> int:
    """Number of logits for one input of ``pre``'s shape (a dry run); ``ModelLoadError`` if it fails."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = torch.zeros(1, *pre.input_shape(), device=device)
    try:
        with torch.no_grad():
            logits = logits_of(model(example))
    except Exception as exc:
        raise ModelLoadError(
            f"the model does not run on a {tuple(example.shape)} input: {type(exc).__name__}: {first_line(exc)} "
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
    spec = resolve_factory_spec(model, spec)  # the channels / image size no flag gave, from the model
    pre = spec.preprocessing()
    outputs = count_outputs(model, pre)
    if spec.labels and len(spec.labels) != outputs:
        raise ModelLoadError(f"{len(spec.labels)} labels given but {spec.factory}() has {outputs} outputs")
    labels = spec.labels or [f"class_{i}" for i in range(outputs)]
    return _factory_model(model, spec, labels, pre, untrained=spec.weights is None)


def _factory_model(
    model: nn.Module, spec: FactorySpec, labels: Sequence[str], pre: Preprocessing, *, untrained: bool
) -> FactoryModel:
    """The :class:`FactoryModel` of ``model``, built by ``spec``'s factory, with these class names and preprocessing."""
    return FactoryModel(
        model=model,
        processor=None,
        family=family_of(model),
        source=SOURCE,
        spec=spec.factory,
        untrained=untrained,
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
    atomic_write_json(out / FACTORY_FILE, artifact.model_dump(mode="json"))
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
    atomic_write_json(out / META_FILE, meta)
    return out


def save_factory_loaded(loaded: LoadedModel, out_dir: Path) -> None:
    """Write the original artifact of a :class:`FactoryModel` into ``out_dir`` atomically (a staging dir)."""
    if not isinstance(loaded, FactoryModel) or loaded.factory_spec is None:
        raise ValueError(f"factory model {loaded.spec!r} carries no FactorySpec: build it with build_factory_model")
    with StagingDir(out_dir) as tmp:
        save_factory_original(loaded, loaded.factory_spec, tmp)


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
    from safetensors.torch import load_file

    out = Path(out_dir)
    try:
        artifact = FactoryArtifact.model_validate_json((out / FACTORY_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{out} is not a factory model artifact (no {FACTORY_FILE})") from None
    except ValidationError as exc:
        raise ModelLoadError(f"{out / FACTORY_FILE} is invalid: {validation_message(exc)}") from None
    spec = artifact.spec
    model = call_factory(spec.factory, [artifact.import_root] if artifact.import_root else [])
    try:
        missing, unexpected = load_saved(model, load_file(str(out / WEIGHTS_FILE), device="cpu"))
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load {out / WEIGHTS_FILE} into {spec.factory}(): {first_line(exc)}; unless the factory has "
            "changed since, the file is damaged: start the run again with a new --run-dir"
        ) from None
    missing = [k for k in missing if k.rpartition(".")[2] not in OPTIONAL_BUFFERS]
    if missing or unexpected:
        raise ModelLoadError(
            f"{out / WEIGHTS_FILE} does not fit {spec.factory}() any more (has the factory changed?): "
            f"missing {preview(sorted(missing))}; unexpected {preview(sorted(unexpected))}"
        )
    model.eval()
    return _factory_model(model, spec, spec.labels, spec.preprocessing(), untrained=artifact.untrained)
