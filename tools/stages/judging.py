"""Evaluations of saved artifacts on the run's data: per-image predictions paired with the original's, accuracy,
latency, throughput, size and MACs (re-exported by :mod:`tools.stages.ops` for the nodes).

A float model whose PyTorch evaluation would be long is evaluated by its OpenVINO FP32 twin
(``EvalSpec.float_runtime``, :mod:`tools.evaluation.twin`); on an unlabelled dataset each image's target is the
original's answer, read from the original's predictions on the same part. :func:`judge_together` judges a
deployment's candidates by the budget test on the choose images, each alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.artifacts.io import deployed_files, load_compressed, load_module, load_original
from tools.deploy.choice import DeployCandidate, luck_removed
from tools.deploy.registry import FLOAT_TWIN
from tools.evaluation.cross_fitted import cross_fitted
from tools.evaluation.paired import predictions_path
from tools.models.base import example_input, resolve_device
from tools.schemas import InputShape, Metrics, PairedAccuracy, PartAccuracy
from tools.stages.run_data import EvalSpec, preprocess_of
from tools.stats import CHOOSE_Z
from tools.store.files import read_json

if TYPE_CHECKING:
    from tools.evaluation.paired import ImagePredictions, StopRule

logger = logging.getLogger(__name__)

__all__ = [
    "THROUGHPUT_SECONDS",
    "Judging",
    "accuracy_of",
    "compare_latency",
    "evaluate",
    "evaluate_accuracy_on",
    "judge_together",
    "latency_device",
    "predictions_on",
    "twin_sources",
]


class Judging(BaseModel):
    """How the candidates built from one model are judged: the evaluation they get (a model distilled on some
    evaluation images is judged on the others only) and the points taken off their paired result (the lead a
    distilled student had on that half over its round's estimate on every image: :func:`luck_removed`)."""

    spec: EvalSpec
    luck_points: float = 0.0
    twin: Path | None = Field(
        default=None,
        description="The other student of the distilled round this model is a student of: each build of the two is "
        "judged with the other's in the same backend, on every evaluation image (``DeployCandidate.cross_fitted``).",
    )


def twin_sources(
    source_dir: Path, alternatives: Sequence[Path], judged_by: Callable[[Path], Judging]
) -> dict[str | None, str | None]:
    """The candidates' sources (``DeployCandidate.source``: None for ``source_dir``, else the alternative as given)
    whose models are a distilled round's two students (``Judging.twin``), each to its twin."""
    keys: dict[Path, str | None] = {Path(a).resolve(): str(a) for a in alternatives}
    keys[Path(source_dir).resolve()] = None
    twins: dict[str | None, str | None] = {}
    for model, key in keys.items():
        twin = judged_by(model).twin
        if twin is not None and Path(twin).resolve() in keys:
            twins[key] = keys[Path(twin).resolve()]
    return twins


def accuracy_of(
    model: Callable[[torch.Tensor], Any], original_dir: Path, shape: InputShape, spec: EvalSpec, desc: str = "evaluate"
) -> tuple[float | None, int]:
    """Top-1 accuracy of any model callable (torch module, ONNX Runtime session) on the evaluation part, and the
    samples counted; (None, 0) without a dataset, or for an untrained model."""
    from tools.evaluation.accuracy import evaluate_accuracy
    from tools.evaluation.labels import LabelMatch

    if spec.dataset is None or spec.label_match is None or load_original(original_dir).untrained:
        return None, 0
    data, match = spec.part("evaluation"), LabelMatch.model_validate(spec.label_match)
    device, preprocess = str(resolve_device(spec.device)), preprocess_of(original_dir, shape)
    return evaluate_accuracy(
        model, preprocess, data, match, batch_size=spec.batch_size, device=device, progress=spec.progress, desc=desc
    )


def predictions_on(
    artifact_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    part: str = "evaluation",
    desc: str = "evaluate",
    model: Callable[[torch.Tensor], Any] | None = None,
    stop: StopRule | None = None,
) -> ImagePredictions | None:
    """Per-image top-1 predictions of an artifact on a part of the data, kept beside it (``paired.predictions_for``);
    None without a dataset, or for an untrained model. ``model``: the artifact already loaded on its device; ``stop``:
    sequential evaluation's rule (``paired.stop_when_over``)."""
    from tools.evaluation.paired import predictions_for

    if spec.dataset is None or spec.label_match is None or load_original(original_dir).untrained:
        return None
    quantized = read_json(artifact_dir / "artifact.json")["kind"] == "quantized"
    device = str(resolve_device("cpu" if quantized else spec.device))
    load = (lambda: model) if model is not None else (lambda: load_compressed(artifact_dir, device=device))
    if spec.float_runtime == FLOAT_TWIN and not quantized and device == "cpu":
        load = _twin_of(load, shape, spec.seed)
    data, preprocess = spec.part(part), preprocess_of(original_dir, shape)
    label = spec.part_label(part)  # one half of the evaluation part keeps its own predictions file
    answers = None  # an unlabelled dataset: the original's answers are the targets
    if spec.label_match.get("unlabelled") and artifact_dir.resolve() != original_dir.resolve():
        reference = predictions_on(original_dir, original_dir, shape, spec, part, "original")
        answers = reference.predictions if reference is not None else None
    return predictions_for(
        artifact_dir,
        label,
        data,
        spec.model_dump(),
        preprocess,
        load,
        device=device,
        desc=desc,
        stop=stop,
        answers=answers,
    )


def _twin_of(load: Callable[[], Any], shape: InputShape, seed: int) -> Callable[[], Any]:
    """``load`` of a float torch model, as its OpenVINO FP32 twin where one checks out (``EvalSpec.float_runtime``)."""
    from tools.evaluation.twin import openvino_twin

    def twin() -> Any:
        loaded = load()
        example = example_input(shape, batch=2, seed=seed)
        return (openvino_twin(loaded, example) if isinstance(loaded, nn.Module) else None) or loaded

    return twin


def evaluate_accuracy_on(
    artifact_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    part: str = "holdout",
    desc: str | None = None,
    model: Callable[[torch.Tensor], Any] | None = None,
) -> PartAccuracy | None:
    """An artifact's accuracy on a part of the data, paired with the original's on the same images (not for the
    original itself); None without a dataset or for an untrained model. An empty part raises ``DatasetError``.
    On the evaluation part, with ``spec.stop_beyond_points``, a candidate clearly over it sees the first images only."""
    from tools.evaluation.paired import pair, part_accuracy, stop_when_over

    itself = artifact_dir.resolve() == original_dir.resolve()
    reference = None if itself else predictions_on(original_dir, original_dir, shape, spec, part, "original")
    stop = stop_when_over(reference, spec.stop_beyond_points if part == "evaluation" else None)
    candidate = predictions_on(artifact_dir, original_dir, shape, spec, part, desc or part, model, stop)
    reference = candidate if itself else reference
    if candidate is None or reference is None:
        return None
    return part_accuracy(part, candidate, reference, None if itself else pair(reference, candidate))


def evaluate(
    artifact_dir: Path,
    original_dir: Path,
    shape: InputShape,
    spec: EvalSpec,
    desc: str = "evaluate",
    *,
    throughput: bool = True,
) -> Metrics:
    """Accuracy on the seeded subset (paired with the original's), latency at batch 1, throughput, memory, MACs.

    ``throughput=False`` leaves the batch throughput out (None): the deployment table shows it, nothing shows a
    round's, and at 260 px its batch costs EfficientNet-Lite2 about two seconds a round in PyTorch."""
    from tools.evaluation.cost import file_size_mb, measure_latency

    meta = read_json(artifact_dir / "artifact.json")
    quantized = meta["kind"] == "quantized"
    run_device = "cpu" if quantized else spec.device  # quantized kernels are CPU kernels (ONNX Runtime's too)
    model = load_compressed(artifact_dir, device=str(resolve_device(run_device)))
    measured = evaluate_accuracy_on(artifact_dir, original_dir, shape, spec, "evaluation", desc, model)
    # a quantized model counts the parameters and MACs of the float model it came from (it may not be torch)
    float_model = load_module(Path(meta["recipe"]["source"])) if quantized else model
    if not isinstance(float_model, nn.Module):
        raise TypeError(f"{artifact_dir} ({meta['kind']}) did not load as a torch module")
    macs = _macs(float_model, shape)
    single = example_input(shape, device=run_device, seed=spec.seed)
    latency = measure_latency(model, single, warmup=3, repeats=10)
    images_per_s = _throughput(model, macs, shape, spec, run_device) if throughput else None
    return Metrics(
        accuracy=measured.accuracy if measured else None,
        params=sum(p.numel() for p in float_model.parameters()),
        macs=macs,
        latency_s=latency,
        throughput_ips=images_per_s,
        memory_mb=round(sum(file_size_mb(f) for f in deployed_files(artifact_dir)), 4),
        artifact=str(artifact_dir),
        samples=measured.samples if measured else 0,
        paired=measured.paired if measured else None,
    )


def _throughput(model: Any, macs: int | None, shape: InputShape, spec: EvalSpec, device: str) -> float:
    """Images a second at the evaluation batch size, one timed call after the batch-1 ones warmed ``model`` up."""
    from tools.compression.sensitivity import SENSITIVITY_MACS_PER_SECOND
    from tools.evaluation.cost import measure_throughput

    # one timed call at the evaluation batch size (a large model's: what takes about a second at the assumed rate);
    # the batch-1 runs above already warmed the model up
    fits = max(1, int(THROUGHPUT_SECONDS * SENSITIVITY_MACS_PER_SECOND / (macs or 1)))
    size = min(spec.batch_size, spec.samples, fits)
    batch = example_input(shape, batch=size, device=device, seed=spec.seed)
    return measure_throughput(model, batch, warmup=1, repeats=1)  # a first call may compile (OpenVINO)


#: The seconds a throughput measurement's batch takes at most, at the one-thread rate the sensitivity profile assumes.
THROUGHPUT_SECONDS = 0.5


def _macs(model: nn.Module, shape: InputShape) -> int | None:
    """MACs of a float model by ptflops (a quantized model counts as the float model it came from), counted on the
    CPU; the model goes back to its device (a GPU's model left on the CPU met its GPU input when timed next)."""
    from tools.profiling.static import static_profile

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        macs, _, _ = static_profile(model.cpu(), shape.as_tuple())
        return int(macs)
    except Exception as exc:  # MACs are informative; never fail an evaluation over them
        logger.warning("MAC count failed: %s", exc)
        return None
    finally:
        model.to(device)


def latency_device(artifact_dir: Path, device: str = "cpu") -> str:
    """Where an artifact runs: quantized kernels (ONNX Runtime's, OpenVINO's too) are CPU kernels."""
    quantized = read_json(Path(artifact_dir) / "artifact.json")["kind"] == "quantized"
    return "cpu" if quantized else str(resolve_device(device))


def compare_latency(
    artifacts: dict[str, Path],
    shape: InputShape,
    *,
    repeats: int = 20,
    device: str = "cpu",
    seed: int = 0,
    max_seconds: float | None = None,
    min_seconds: float | None = None,
) -> dict[str, float]:
    """Batch-1 latency of several artifacts measured interleaved in one process, medians in seconds.

    Float models run on ``device`` (CUDA calls synchronised), quantized ones on the CPU; each device's artifacts
    interleaved, ``repeats`` times :data:`~tools.evaluation.cost.SERVING_BLOCK` calls in a row (warm, as one serves);
    a model slower than ``max_seconds`` over them takes part in fewer repetitions, and the repetitions grow until the
    fastest's calls add up to ``min_seconds`` (``compare_latencies``).
    """
    from tools.evaluation.cost import SERVING_BLOCK, compare_latencies

    by_device: dict[str, dict[str, Path]] = {}
    for name, path in artifacts.items():
        by_device.setdefault(latency_device(path, device), {})[name] = path
    times: dict[str, float] = {}
    for where, group in by_device.items():
        models = {n: load_compressed(p, device=where) for n, p in group.items()}  # modules, ORT or OpenVINO models
        example = example_input(shape, device=where, seed=seed)
        times |= compare_latencies(
            models, example, repeats=repeats, block=SERVING_BLOCK, max_seconds=max_seconds, min_seconds=min_seconds
        )
    return times


def judge_together(
    candidates: list[DeployCandidate],
    within_budget: Callable[[float | None, PairedAccuracy | None, float], bool],
    original_dir: Path,
    twins: Mapping[str | None, str | None] | None = None,
) -> int:
    """Judge every candidate that ran by the budget test on the choose images, each alone (drop plus
    :data:`~tools.stats.CHOOSE_Z` standard errors: what ships is judged again on the confirm images, which nothing
    chose on, ``tools.evaluation.confirm``). Returns the count of tries judged.

    ``twins`` pairs the sources (``DeployCandidate.source``, None for the best model) that are a distilled round's
    two students. A build of one and the same build of the other are one try, judged together on every choose image,
    each student's build on the half its student did not see (``DeployCandidate.cross_fitted``): the round was kept
    on that cross-fitted estimate, and one build judged on its half alone has 1.4 times its standard error. A build
    without its twin is judged on its half, less its student's luck there (:func:`luck_removed`).
    """
    tried = [c for c in candidates if c.ran and c.artifact is not None]
    original = predictions_path(original_dir, "evaluation")
    groups = _twinned([c for c in tried if c.paired is not None], twins or {}, original)
    for group in groups:
        c = group[0]
        if c.cross_fitted is not None:
            verdict = within_budget(-c.cross_fitted.delta_points, c.cross_fitted, CHOOSE_Z)
        else:
            verdict = within_budget(c.accuracy_drop_points, luck_removed(c.paired, c.half_luck_points or 0.0), CHOOSE_Z)
        for member in group:
            member.within_budget, member.budget_z = verdict, CHOOSE_Z
    for c in (c for c in tried if c.paired is None):
        c.within_budget = within_budget(c.accuracy_drop_points, None, CHOOSE_Z)
    return len(groups) + sum(1 for c in tried if c.paired is None)


def _twinned(
    judged: list[DeployCandidate], twins: Mapping[str | None, str | None], original: Path
) -> list[list[DeployCandidate]]:
    """``judged`` as tries: a build of one of a distilled round's students with the same build of the other (its
    ``cross_fitted`` result set on both) where the two cover every evaluation image between them, any other alone."""
    pairs = {**{b: a for a, b in twins.items()}, **twins}
    groups: list[list[DeployCandidate]] = []
    taken: set[int] = set()
    for c in judged:
        if id(c) in taken:
            continue
        taken.add(id(c))
        twin = next(
            (
                d
                for d in judged
                if id(d) not in taken and c.source in pairs and d.source == pairs[c.source] and d.backend == c.backend
            ),
            None,
        )
        joint = None
        if twin is not None and c.predictions and twin.predictions:
            joint = cross_fitted(original, [c.predictions, twin.predictions])
        if twin is None or joint is None:
            c.cross_fitted = None
            groups.append([c])
            continue
        taken.add(id(twin))
        c.cross_fitted = twin.cross_fitted = joint
        groups.append([c, twin])
    return groups
