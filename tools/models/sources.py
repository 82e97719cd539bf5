"""Where models come from: a registry of model sources, behind one ``acquire_model`` verb.

Sources (tried in order, first that ``accepts`` the spec wins):

* ``builtin`` — the paper's four architectures (``vit-b16``, ``deit-b16``, ``swin-b``, ``resnet-101``)
  built from their published configurations with seeded random weights: no network, marked untrained.
* ``demo`` — the small digits classifiers that ship with the package (``digits-vit``, ``digits-cnn``).
* ``factory`` — ``module.path:callable`` plus a state dict file (:mod:`tools.models.factory`).
* ``local`` — a directory in ``save_pretrained`` format.
* ``hub`` — a Hugging Face hub id (needs the network, or the local HF cache).

Each source also knows how the run's original artifact of its models is written and read back
(:func:`source_named`): ``save_pretrained`` files for all but ``factory``, which saves its state dict
and spec.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.models.base import LoadedModel, ModelLoadError, resolve_device
from tools.models.builtin import BUILTIN_MODELS, DEMO_MODELS, load_builtin
from tools.models.factory import build_factory_model, load_factory_original, save_factory_loaded
from tools.models.pretrained import load_pretrained, save_pretrained_original
from tools.models.specs import FactorySpec, is_factory_spec

logger = logging.getLogger(__name__)


def _load_factory(spec: str, options: Mapping[str, Any] | None = None) -> LoadedModel:
    if options is not None:
        return build_factory_model(FactorySpec.model_validate({**options, "factory": spec}))
    return build_factory_model(FactorySpec.from_options(spec))


def _reload_pretrained(path: Path, meta: Mapping[str, Any]) -> LoadedModel:
    """A saved ``save_pretrained`` original, with the spec, source and ``untrained`` it was saved with."""
    loaded = acquire_model(str(path), device="cpu")
    loaded.spec, loaded.source = meta.get("spec", loaded.spec), meta.get("source", loaded.source)
    loaded.untrained = bool(meta.get("untrained", False))
    return loaded


@dataclass(frozen=True)
class ModelSource:
    """A kind of model spec: whether a spec is one, how to load it, how to save and reload its original."""

    name: str
    accepts: Callable[[str], bool]
    load: Callable[[str], LoadedModel]
    save_original: Callable[[LoadedModel, Path], None] = save_pretrained_original
    """Write the run's original artifact into a directory (atomically: complete or absent)."""
    load_original: Callable[[Path, Mapping[str, Any]], LoadedModel] = _reload_pretrained
    """Read back what ``save_original`` wrote, given the directory and its ``artifact.json``."""


MODEL_SOURCES: list[ModelSource] = [
    ModelSource("builtin", lambda s: s in BUILTIN_MODELS, load_builtin),
    ModelSource("demo", lambda s: s in DEMO_MODELS, lambda s: load_pretrained(str(DEMO_MODELS[s]), "demo")),
    ModelSource(
        "factory",
        is_factory_spec,
        _load_factory,
        save_original=save_factory_loaded,
        load_original=lambda path, meta: load_factory_original(path),
    ),
    ModelSource("local", lambda s: Path(s).is_dir(), lambda s: load_pretrained(s, "local")),
    ModelSource(
        "hub",
        lambda s: not Path(s).exists() and s.count("/") <= 1 and not s.startswith((".", "/")),
        lambda s: load_pretrained(s, "hub"),
    ),
]


def source_named(name: str | None) -> ModelSource:
    """The source called ``name``; ``local`` (``save_pretrained`` originals) for a name not registered."""
    by_name = {source.name: source for source in MODEL_SOURCES}
    return by_name.get(name or "", by_name["local"])


def acquire_model(spec: str, device: str = "cpu", factory_options: Mapping[str, Any] | None = None) -> LoadedModel:
    """Load ``spec`` through the first model source that accepts it, in eval mode on ``device``.

    ``factory_options`` (``FactorySpec`` fields but ``factory``) apply to a ``module:factory`` spec only.
    """
    if factory_options is not None:
        if not is_factory_spec(spec):
            raise ModelLoadError(
                f"--weights/--labels/--image-size/--mean/--std/--channels: only for --model module.path:factory, "
                f"not {spec!r}"
            )
        loaded = _load_factory(spec, factory_options)
    else:
        for source in MODEL_SOURCES:
            if source.accepts(spec):
                loaded = source.load(spec)
                break
        else:
            raise ModelLoadError(
                f"model {spec!r} not found: give a Hugging Face id, a save_pretrained directory, "
                f"module.path:factory (with --weights), or one of {', '.join((*BUILTIN_MODELS, *DEMO_MODELS))}"
            )
    loaded.model.to(resolve_device(device))
    logger.info("acquired %s (%s, %s)", spec, type(loaded.model).__name__, loaded.source)
    return loaded
