"""Top-k labels for image files from any saved artifact, run by its own runtime (``profiling-agent predict``).

The artifact (original, pruned, or deployed through PyTorch, ONNX Runtime or OpenVINO) is loaded with
:func:`tools.artifacts.io.load_compressed`; the images are preprocessed as the run's original model
expects them, and the labels are the original's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from pydantic import BaseModel

from tools.artifacts.io import load_compressed, load_original
from tools.evaluation.datasets import to_pil
from tools.models.base import logits_of
from tools.store.files import read_json

__all__ = ["Prediction", "original_of", "predict"]


class Prediction(BaseModel):
    image: str
    top: list[tuple[str, float]]


def original_of(artifact_dir: Path) -> Path:
    """The original model an artifact was made from (the artifact itself for an original)."""
    meta_file = artifact_dir / "artifact.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{artifact_dir} is not a model artifact (no artifact.json): pass RUN/models/<name>")
    meta = read_json(meta_file)
    if meta.get("kind") == "original":
        return artifact_dir
    return (artifact_dir.parent / meta["base"]).resolve()


def predict(artifact_dir: Path, images: list[Path], top_k: int = 5) -> list[Prediction]:
    """Top-``top_k`` (label, probability) of each image under the artifact at ``artifact_dir``."""
    from tools.stages import ops

    original = original_of(artifact_dir)
    shape = ops.resolve_input_shape(original)
    labels = load_original(original).id2label
    pictures = []
    for path in images:
        try:
            with Image.open(path) as opened:  # in the mode the model takes: greyscale or RGB
                pictures.append(to_pil(opened).convert("L" if shape.channels == 1 else "RGB"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read image {path}: {exc}; pass image files (JPEG, PNG, ...)") from None
    batch = ops.preprocess_of(original, shape)(pictures)
    model = load_compressed(artifact_dir)
    with torch.no_grad():
        probs = torch.softmax(logits_of(model(batch)).float(), dim=-1)
    k = min(top_k, probs.shape[-1])
    values, indices = probs.topk(k, dim=-1)
    return [
        Prediction(
            image=str(path),
            top=[(str(labels.get(int(i), int(i))), round(float(v), 4)) for v, i in zip(vals, idxs, strict=True)],
        )
        for path, vals, idxs in zip(images, values, indices, strict=True)
    ]
