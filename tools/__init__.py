"""ProfilingAgent's torch work, by pipeline stage: models, profiling, compression, deploy, artifacts, evaluation.

Import submodules by their full path (``from tools.models.sources import acquire_model``). The one name
offered here, :func:`load_compressed` (rebuild a saved model artifact), is imported on first use, so that
``import tools`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tools.artifacts.io import load_compressed

__all__ = ["load_compressed"]


def __getattr__(name: str) -> Any:
    if name == "load_compressed":
        from tools.artifacts.io import load_compressed

        return load_compressed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
