"""Accuracy, label matching, latency and size measurements shared by the baseline and the compressed models.

Label matching follows the paper (dataset class names are matched to the model's ``id2label`` by
name, substrings included) with guards that keep it honest:

1. names are normalised (case, ``_``/``-``/punctuation -> space, apostrophes dropped, single-digit
   tokens spelled out) and synonym lists (``"tench, Tinca tinca"``, ``"T-shirt/top"``) give
   alternatives: the whole name and each part;
2. tiers, loosest last: ``exact`` (equal alternatives), ``variant`` (equal after singularising each
   word and dropping spaces: ``cats`` ~ ``cat``, ``t shirt`` ~ ``tshirt``), ``word`` (one name is
   a whole-word run inside the other: ``cat`` ~ ``tabby cat``), and ``substring`` (the shorter,
   >= 4 letters, ends where a word of the longer ends: ``plane`` ~ ``airplane``, but never
   ``cat`` ~ ``catamaran``);
3. a dataset class takes the first tier where it has any candidate, and only if that candidate is
   unique (within ``exact``/``variant``, a single candidate matched by its primary name wins);
   several candidates make it ambiguous, so it stays unmatched;
4. a model class serves at most one dataset class: classes matched in a tighter tier are taken
   first, and two dataset classes claiming the same model class in one tier both stay unmatched.

The prediction is always the argmax over all model classes; a sample counts as correct when that
argmax is the model class its dataset class was matched to, and samples of unmatched classes are
left out of the accuracy.
"""

from __future__ import annotations

import logging
import os
import random
import re
import statistics
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, Field
from torch import nn
from tqdm import tqdm

from tools.evaluation.datasets import EvalDataset
from tools.models.sources import logits_of

logger = logging.getLogger(__name__)

Preprocess = Callable[[list[Image.Image]], Any]

MATCH_TIERS: tuple[str, ...] = ("exact", "variant", "word", "substring")
MIN_SUBSTRING_LETTERS = 4
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SYNONYM_SEPARATORS = re.compile(r"[,;/|]")
_GENERIC_LABEL = re.compile(r"^label[ _]?\d+$", re.IGNORECASE)


class EvaluationError(ValueError):
    """Bad input to an evaluation or timing function (one line, actionable)."""


class LabelMatchError(EvaluationError):
    """No dataset class could be matched to a model class."""


class LabelMatch(BaseModel):
    """How dataset classes map onto model classes.

    ``mapping``: dataset label index -> model class index; ``unmatched``: dataset class names that
    match nothing (or several things); ``matched_names``: dataset name -> model name.
    """

    mapping: dict[int, int]
    unmatched: list[str] = Field(default_factory=list)
    matched_names: dict[str, str] = Field(default_factory=dict)
    match_kinds: dict[str, str] = Field(default_factory=dict, description="Dataset name -> matching tier.")
    ambiguous: dict[str, list[str]] = Field(
        default_factory=dict, description="Unmatched dataset name -> model names it could not choose from."
    )

    @property
    def matched_count(self) -> int:
        return len(self.mapping)

    def is_complete(self) -> bool:
        return not self.unmatched


# ---------------------------------------------------------------------------------------------- matching


def normalise_label(name: str) -> str:
    """Lower case; ``_``, ``-``, punctuation -> space; apostrophes dropped; single digits spelled out."""
    text = unicodedata.normalize("NFKC", str(name)).lower()
    text = re.sub(r"['’`]", "", text)
    text = re.sub(r"[^\w]+|_", " ", text)
    words = [_DIGIT_WORDS[int(w)] if len(w) == 1 and w.isdigit() else w for w in text.split()]
    return " ".join(words)


def label_alternatives(name: str) -> list[str]:
    """Normalised alternatives of a class name: the primary part first, then the others and the whole name."""
    parts = [normalise_label(p) for p in _SYNONYM_SEPARATORS.split(str(name))]
    whole = normalise_label(str(name))
    ordered: list[str] = []
    for alt in [*parts, whole]:
        if alt and alt not in ordered:
            ordered.append(alt)
    return ordered


def _singular(word: str) -> str:
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _stem(alt: str) -> str:
    return " ".join(_singular(w) for w in alt.split())


def _contains_words(outer: str, inner: str) -> bool:
    """``inner``'s words appear as a contiguous run of whole words in ``outer`` (and the two differ)."""
    return outer != inner and f" {inner} " in f" {outer} "


def _contains_word_end(outer: str, inner: str) -> bool:
    """``inner`` (>= MIN_SUBSTRING_LETTERS letters) occurs in ``outer``, ending where a word of it ends."""
    if outer == inner or len(inner.replace(" ", "")) < MIN_SUBSTRING_LETTERS:
        return False
    start = outer.find(inner)
    while start >= 0:
        end = start + len(inner)
        if end == len(outer) or outer[end] == " ":
            return True
        start = outer.find(inner, start + 1)
    return False


@dataclass(frozen=True)
class _Name:
    """A class name's normalised alternatives (primary first) and their singularised forms."""

    alts: tuple[str, ...]
    stems: tuple[str, ...]

    @classmethod
    def of(cls, name: str) -> _Name:
        alts = tuple(label_alternatives(name))
        return cls(alts, tuple(_stem(a) for a in alts))

    def keys(self, tier: str) -> tuple[str, ...]:
        """Lookup keys of the index-based tiers: the alternatives, or their stems with spaces removed."""
        return self.alts if tier == "exact" else tuple(s.replace(" ", "") for s in self.stems)


def _loose_hit(tier: str, d: _Name, m: _Name) -> bool:
    if tier == "word":
        return any(_contains_words(sm, sd) or _contains_words(sd, sm) for sm in m.stems for sd in d.stems)
    return any(_contains_word_end(am, ad) or _contains_word_end(ad, am) for am in m.alts for ad in d.alts)


def _candidates(tier: str, d: _Name, models: dict[int, _Name], index: dict[str, dict[int, bool]]) -> dict[int, bool]:
    """Model classes that ``d`` matches in ``tier`` -> whether the model's primary name took part."""
    if tier in ("exact", "variant"):
        hits: dict[int, bool] = {}
        for key in d.keys(tier):
            for m_index, primary in index.get(key, {}).items():
                hits[m_index] = hits.get(m_index, False) or primary
        if len(hits) > 1:
            primaries = [m for m, p in hits.items() if p]
            if len(primaries) == 1:
                return {primaries[0]: True}
        return hits
    return {m_index: False for m_index, m in models.items() if _loose_hit(tier, d, m)}


def _build_index(tier: str, models: dict[int, _Name]) -> dict[str, dict[int, bool]]:
    index: dict[str, dict[int, bool]] = {}
    if tier in ("exact", "variant"):
        for m_index, m in models.items():
            for position, key in enumerate(m.keys(tier)):
                slot = index.setdefault(key, {})
                slot[m_index] = slot.get(m_index, False) or position == 0
    return index


def match_labels(model_id2label: Mapping[int, str] | Mapping[str, str], dataset_labels: Sequence[str]) -> LabelMatch:
    """Match dataset class names to model classes (rules in the module docstring).

    Raises :class:`LabelMatchError` when no dataset class matches any model class.
    """
    if not dataset_labels:
        raise LabelMatchError("the dataset has no class names: cannot match it to the model's classes")
    if not model_id2label:
        raise LabelMatchError("the model has no id2label: set config.id2label to its class names")
    model_names = {int(k): str(v) for k, v in model_id2label.items()}
    models = {m_index: _Name.of(name) for m_index, name in model_names.items()}
    wanted = [_Name.of(str(n)) for n in dataset_labels]

    mapping: dict[int, int] = {}
    kinds: dict[int, str] = {}
    ambiguous: dict[int, list[int]] = {}
    for tier in MATCH_TIERS:
        claimed = set(mapping.values())
        free = {m_index: m for m_index, m in models.items() if m_index not in claimed}
        index = _build_index(tier, free)
        proposals: dict[int, int] = {}
        for d_index, d in enumerate(wanted):
            if d_index in mapping or d_index in ambiguous or not d.alts:
                continue
            hits = _candidates(tier, d, free, index)
            if len(hits) == 1:
                proposals[d_index] = next(iter(hits))
            elif hits:
                ambiguous[d_index] = sorted(hits)
        taken: dict[int, list[int]] = {}
        for d_index, m_index in proposals.items():
            taken.setdefault(m_index, []).append(d_index)
        for m_index, d_indices in taken.items():
            if len(d_indices) == 1:
                mapping[d_indices[0]] = m_index
                kinds[d_indices[0]] = tier
            else:
                for d_index in d_indices:
                    ambiguous[d_index] = [m_index]

    if not mapping:
        hint = ""
        if all(_GENERIC_LABEL.match(n) for n in model_names.values()):
            hint = " (the model's labels are generic LABEL_n: its config carries no class names)"
        raise LabelMatchError(
            f"no dataset class ({_preview(dataset_labels)}) matches a model class "
            f"({_preview(list(model_names.values()))}){hint}: use a dataset of the model's classes"
        )
    result = LabelMatch(
        mapping=dict(sorted(mapping.items())),
        unmatched=[str(n) for i, n in enumerate(dataset_labels) if i not in mapping],
        matched_names={str(dataset_labels[d]): model_names[m] for d, m in sorted(mapping.items())},
        match_kinds={str(dataset_labels[d]): kinds[d] for d in sorted(mapping)},
        ambiguous={str(dataset_labels[d]): [model_names[m] for m in ms] for d, ms in sorted(ambiguous.items())},
    )
    if result.unmatched:
        logger.warning(
            "%d/%d dataset classes match no model class and are left out: %s",
            len(result.unmatched),
            len(dataset_labels),
            _preview(result.unmatched),
        )
    loose = {d: k for d, k in result.match_kinds.items() if k != "exact"}
    if loose:
        logger.info("label matches beyond exact names: %s", {d: result.matched_names[d] for d in loose})
    return result


def _preview(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(str(n)) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# ---------------------------------------------------------------------------------------------- inference


def _logits_of(output: Any) -> torch.Tensor:
    try:
        return logits_of(output)
    except TypeError as exc:
        raise EvaluationError(str(exc)) from exc


def _as_batch(prepared: Any) -> torch.Tensor:
    if isinstance(prepared, torch.Tensor):
        return prepared
    if isinstance(prepared, Mapping) and isinstance(prepared.get("pixel_values"), torch.Tensor):
        return prepared["pixel_values"]
    raise EvaluationError(
        f"preprocess returned {type(prepared).__name__}: return a tensor (or a dict with pixel_values)"
    )


def _float_dtype(model: Any) -> torch.dtype | None:
    if isinstance(model, nn.Module):
        for param in model.parameters():
            if param.is_floating_point():
                return param.dtype
    return None


@contextmanager
def _eval_mode(models: Sequence[Any]) -> Iterator[None]:
    """nn.Modules in eval mode for the duration, each restored to its previous mode afterwards."""
    modules = [m for m in models if isinstance(m, nn.Module)]
    previous = [m.training for m in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, was_training in zip(modules, previous, strict=True):
            module.train(was_training)


def iter_logits(
    model: Callable[..., Any],
    preprocess: Preprocess,
    images: Sequence[Image.Image],
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "predict",
) -> Iterator[torch.Tensor]:
    """Logits (on CPU, float) of ``images`` in batches of ``batch_size``, under ``torch.inference_mode``.

    The model must already be on ``device``; the preprocessed batches are moved there.
    """
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, not {batch_size}")
    target = torch.device(device)
    dtype = _float_dtype(model)
    with (
        _eval_mode([model]),
        torch.inference_mode(),
        tqdm(total=len(images), desc=desc, unit="img", disable=not progress, leave=False) as bar,
    ):
        for start in range(0, len(images), batch_size):
            chunk = list(images[start : start + batch_size])
            batch = _as_batch(preprocess(chunk)).to(target)
            if dtype is not None and batch.is_floating_point() and batch.dtype != dtype:
                batch = batch.to(dtype)
            logits = _logits_of(model(batch))
            if logits.ndim != 2 or logits.shape[0] != len(chunk):
                raise EvaluationError(
                    f"model returned logits of shape {tuple(logits.shape)} for a batch of {len(chunk)}: "
                    "expected (batch, classes)"
                )
            bar.update(len(chunk))
            yield logits.detach().float().cpu()


def predict_logits(
    model: Callable[..., Any],
    preprocess: Preprocess,
    images: Sequence[Image.Image] | EvalDataset,
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = False,
    desc: str = "predict",
) -> torch.Tensor:
    """All logits as one (N, classes) CPU float tensor; N = 0 gives an empty (0, 0) tensor."""
    items = images.images if isinstance(images, EvalDataset) else images
    chunks = list(
        iter_logits(model, preprocess, items, batch_size=batch_size, device=device, progress=progress, desc=desc)
    )
    return torch.cat(chunks) if chunks else torch.empty(0, 0)


def accuracy_from_predictions(
    predictions: Sequence[int] | torch.Tensor, labels: Sequence[int], match: LabelMatch
) -> tuple[float | None, int]:
    """(fraction correct, samples counted) over samples whose dataset class is matched; (None, 0) if none."""
    preds = predictions.tolist() if isinstance(predictions, torch.Tensor) else list(predictions)
    if len(preds) != len(labels):
        raise EvaluationError(f"{len(preds)} predictions for {len(labels)} labels: they must align")
    counted = correct = 0
    for pred, label in zip(preds, labels, strict=True):
        target = match.mapping.get(int(label))
        if target is None:
            continue
        counted += 1
        correct += int(int(pred) == target)
    return (correct / counted if counted else None), counted


def prediction_agreement(logits_a: torch.Tensor, logits_b: torch.Tensor) -> float:
    """Fraction of samples with the same top-1 class under both logits (fidelity of a compressed model)."""
    if logits_a.shape[0] != logits_b.shape[0]:
        raise EvaluationError(f"logits of {logits_a.shape[0]} vs {logits_b.shape[0]} samples: must align")
    if logits_a.shape[0] == 0:
        return 1.0
    return float((logits_a.argmax(-1) == logits_b.argmax(-1)).float().mean())


def evaluate_accuracy(
    model: Callable[..., Any],
    preprocess: Preprocess,
    dataset: EvalDataset,
    match: LabelMatch,
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "evaluate",
) -> tuple[float | None, int]:
    """Top-1 accuracy over the samples of matched classes: (fraction, samples counted), or (None, 0).

    The prediction is the argmax over all model classes; samples of unmatched classes are not run.
    """
    keep = [i for i, label in enumerate(dataset.labels) if label in match.mapping]
    if len(keep) < len(dataset.labels):
        logger.info(
            "%d of %d samples belong to unmatched classes and are left out",
            len(dataset.labels) - len(keep),
            len(dataset.labels),
        )
    images = [dataset.images[i] for i in keep]
    labels = [dataset.labels[i] for i in keep]
    predictions: list[int] = []
    for logits in iter_logits(
        model, preprocess, images, batch_size=batch_size, device=device, progress=progress, desc=desc
    ):
        predictions.extend(int(p) for p in logits.argmax(dim=-1))
    accuracy, counted = accuracy_from_predictions(predictions, labels, match)
    shown = "n/a" if accuracy is None else f"{accuracy:.4f}"
    logger.info("%s: accuracy %s on %d samples", desc, shown, counted)
    return accuracy, counted


# ---------------------------------------------------------------------------------------------- timing


def _invoke(model: Callable[..., Any], example: Any) -> Any:
    if isinstance(example, Mapping):
        return model(**example)
    return model(example)


def _needs_cuda_sync(example: Any) -> bool:
    values = example.values() if isinstance(example, Mapping) else [example]
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def _batch_size_of(example: Any) -> int:
    values = list(example.values()) if isinstance(example, Mapping) else [example]
    for value in values:
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
        if hasattr(value, "shape") and len(value.shape) > 0:
            return int(value.shape[0])
    raise EvaluationError("cannot tell the batch size: pass a tensor (or dict of tensors) with a batch dim")


def _check_counts(warmup: int, repeats: int) -> None:
    if warmup < 0:
        raise EvaluationError(f"warmup must be >= 0, not {warmup}")
    if repeats < 1:
        raise EvaluationError(f"repeats must be >= 1, not {repeats}")


def compare_latencies(
    models: Mapping[str, Callable[..., Any]],
    example_input: Any,
    *,
    warmup: int = 3,
    repeats: int = 10,
) -> dict[str, float]:
    """Median seconds per call of each model on ``example_input``, measured interleaved.

    Each repetition runs every model once, in a fresh seeded random order, so that drifting machine load
    affects all models alike and no model always runs after the same neighbour (which measurably biases
    the one that follows, e.g. an ONNX Runtime session after a PyTorch model); the ratios then hold.
    Works for nn.Modules (run in eval mode under ``torch.inference_mode``) and any callable (e.g. an
    ONNX Runtime wrapper).
    A dict input is passed as keyword arguments.
    """
    _check_counts(warmup, repeats)
    if not models:
        raise EvaluationError("no models to time: pass a mapping name -> model")
    names = list(models)
    sync = _needs_cuda_sync(example_input) and torch.cuda.is_available()
    times: dict[str, list[float]] = {name: [] for name in names}
    with _eval_mode(list(models.values())), torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                _invoke(models[name], example_input)
        if sync:
            torch.cuda.synchronize()
        order = random.Random(0)
        for _ in range(repeats):
            for name in order.sample(names, len(names)):
                start = time.perf_counter()
                _invoke(models[name], example_input)
                if sync:
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
    return {name: float(statistics.median(values)) for name, values in times.items()}


def measure_latency(model: Callable[..., Any], example_input: Any, *, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds per call at the batch of ``example_input`` (give a batch of 1 for per-image latency)."""
    return compare_latencies({"model": model}, example_input, warmup=warmup, repeats=repeats)["model"]


def measure_throughput(model: Callable[..., Any], example_batch: Any, *, warmup: int = 1, repeats: int = 3) -> float:
    """Images per second at the batch size of ``example_batch`` (batch / median seconds per call)."""
    batch = _batch_size_of(example_batch)
    seconds = measure_latency(model, example_batch, warmup=warmup, repeats=repeats)
    return batch / seconds if seconds > 0 else float("inf")


# ---------------------------------------------------------------------------------------------- size


def file_size_mb(*paths: Path | str) -> float:
    """Total size in MB (10^6 bytes) of files and directories (directories: every file below, recursively)."""
    total = 0
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            for dirpath, _dirnames, filenames in os.walk(path):
                for name in filenames:
                    file = Path(dirpath, name)
                    if file.is_file():
                        total += file.stat().st_size
        else:
            raise FileNotFoundError(f"{path} does not exist: cannot measure its size")
    return total / 1e6
