"""Path-in, path-out operations: the tool calls the agents make.

Each operation loads what it needs from artifacts on disk, does one job with the torch tools, writes
its result atomically, and returns a pydantic record. They are idempotent: an operation whose output
artifact is already complete returns the existing result instead of recomputing it. The same
functions are exposed as LangChain tools in :mod:`tools.lc_tools`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from tools.compression.recipes import PruningConfig, QuantizationConfig
from tools.models.base import (
    LoadedModel,
    ModelLoadError,
    build_preprocess,
    example_input,
    logits_of,
    resolve_device,
)
from tools.models.sources import acquire_model
from tools.schemas import InputShape, Metrics, ModelProfile, OptimizationPlan, QuantizationRecommendation
from tools.store.artifacts import (
    deployed_file,
    is_complete,
    load_compressed,
    load_module,
    load_original,
    save_compressed,
    save_original,
    save_quantized,
)
from tools.store.files import atomic_write_json, read_json

logger = logging.getLogger(__name__)


class EvalSpec(BaseModel):
    """What every evaluation of a run shares: the data, its subset, and how to batch it."""

    dataset: str | None
    split: str | None = None
    label_match: dict[str, Any] | None = None
    samples: int = 500
    seed: int = 0
    batch_size: int = 32
    device: str = "cpu"
    progress: bool = True


class ModelInfo(BaseModel):
    spec: str
    source: str
    family: str
    model_class: str
    untrained: bool
    num_labels: int
    params: int
    artifact: str


def set_threads(threads: int) -> None:
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# --- acquisition and input shape --------------------------------------------------------------------


def acquire(spec: str, out_dir: Path, device: str = "cpu", factory_options: dict[str, Any] | None = None) -> ModelInfo:
    """Load a model from any source and save it as the run's original artifact."""
    if not is_complete(out_dir):
        loaded = acquire_model(spec, device="cpu", factory_options=factory_options)
        save_original(loaded, out_dir)
    loaded = load_original(out_dir)
    meta = read_json(out_dir / "artifact.json")
    return ModelInfo(
        spec=spec,
        source=meta["source"],
        family=loaded.family,
        model_class=type(loaded.model).__name__,
        untrained=loaded.untrained,
        num_labels=loaded.num_labels,
        params=sum(p.numel() for p in loaded.model.parameters()),
        artifact=str(out_dir),
    )


def _shape_candidates(loaded: LoadedModel) -> list[InputShape]:
    config = getattr(loaded.model, "config", None)
    channels = int(getattr(config, "num_channels", 3) or 3)
    candidates: list[InputShape] = []
    if loaded.preprocessing:
        pre = loaded.preprocessing
        height, width = pre["image_size"]
        candidates.append(
            InputShape(channels=int(pre["channels"]), height=int(height), width=int(width), source="--image-size")
        )
    processor = loaded.processor
    for attr in ("crop_size", "size"):
        size = getattr(processor, attr, None) if processor is not None else None
        if size is None:
            continue
        get = size.get if isinstance(size, dict) else lambda k, s=size: getattr(s, k, None)
        height, width = get("height"), get("width")
        if height is None and get("shortest_edge") is not None:
            height = width = get("shortest_edge")
        if height and width:
            candidates.append(
                InputShape(channels=channels, height=int(height), width=int(width), source=f"processor.{attr}")
            )
    image_size = getattr(config, "image_size", None)
    if image_size:
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)[:2]
        candidates.append(InputShape(channels=channels, height=int(h), width=int(w), source="config.image_size"))
    candidates.append(InputShape(channels=channels, height=224, width=224, source="default 224x224"))
    return candidates


def dry_run(model: nn.Module, shape: InputShape, device: str = "cpu") -> int:
    """Forward one input of ``shape``; return the number of logits."""
    with torch.inference_mode():
        return int(logits_of(model(example_input(shape, device=device))).shape[-1])


def shape_problem(original_dir: Path, shape: InputShape, device: str = "cpu") -> str | None:
    """Why ``shape`` does not run the model (None: it runs and gives the model's number of logits)."""
    loaded = load_original(original_dir)
    try:
        logits = dry_run(loaded.model.to(resolve_device(device)), shape, device)
    except Exception as exc:  # a wrong shape raises anything from RuntimeError to ValueError
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if loaded.num_labels and logits != loaded.num_labels:
        return f"the model gave {logits} logits instead of {loaded.num_labels}"
    return None


def resolve_input_shape(original_dir: Path, device: str = "cpu") -> InputShape:
    """(channels, height, width) from the processor, then the config, proven by a dry forward pass."""
    errors = []
    for candidate in _shape_candidates(load_original(original_dir)):
        problem = shape_problem(original_dir, candidate, device)
        if problem is None:
            return candidate
        errors.append(f"{candidate.source} {candidate.as_tuple()}: {problem}")
    raise ModelLoadError("no input shape runs the model: " + "; ".join(errors))


# --- profiling --------------------------------------------------------------------------------------


def profile(
    original_dir: Path, shape: InputShape, out_dir: Path, device: str = "cpu", progress: bool = False
) -> ModelProfile:
    """Static (ptflops) and dynamic (torch.profiler, hooks) profile; ``profile.json`` and a Chrome trace."""
    from tools.profiling.profile import profile_model

    target = out_dir / "profile.json"
    if target.is_file():
        return ModelProfile.model_validate(read_json(target))
    loaded = load_original(original_dir)
    model = loaded.model.to(resolve_device(device))
    result = profile_model(
        model,
        example_input(shape, device=device),
        family=loaded.family,
        trace_path=out_dir / "trace.json",
        progress=progress,
    )
    atomic_write_json(target, result.model_dump())
    return result


def prunable(original_dir: Path, shape: InputShape, out_dir: Path) -> dict[str, Any]:
    """What the pruner can act on (cached as ``prunable.json``): structured layers and attention heads."""
    from tools.compression.pruning import prunable_layers

    target = out_dir / "prunable.json"
    if target.is_file():
        data: dict[str, Any] = read_json(target)
        return data
    model = load_original(original_dir).model
    result = prunable_layers(model, example_input(shape)).model_dump()
    atomic_write_json(target, result)
    return result


# --- pruning and quantization -----------------------------------------------------------------------


def prune(
    original_dir: Path,
    plan: OptimizationPlan,
    shape: InputShape,
    out_dir: Path,
    config: PruningConfig | None = None,
) -> dict[str, Any]:
    """Apply a plan's pruning recommendations to an intact copy of the original; save the result.

    ``config`` (default ``PruningConfig()``): importance, round_to and seed, written into the recipe.
    """
    from tools.compression.pruning import apply_pruning

    if is_complete(out_dir):
        return dict(read_json(out_dir / "artifact.json")["recipe"]["report"])
    config = config or PruningConfig()
    model = load_original(original_dir).model.eval()
    torch.manual_seed(config.seed)
    report = apply_pruning(model, plan.pruning_recommendations, example_input(shape), config)
    # max_ratio bounds what a planner may ask; it is not part of how the plan was applied
    recipe = {
        "plan": plan.model_dump(),
        **config.model_dump(exclude={"max_ratio"}),
        "report": report.model_dump(),
    }
    save_compressed(model, out_dir, base_dir=original_dir, kind="pruned", recipe=recipe)
    return report.model_dump()


def quantize(
    source_dir: Path,
    original_dir: Path,
    recommendations: list[QuantizationRecommendation],
    out_dir: Path,
    config: QuantizationConfig | None = None,
    *,
    shape: InputShape | None = None,
) -> dict[str, Any]:
    """Dynamically quantize the model at ``source_dir`` (original or pruned); save it as deployed.

    ``config.backend`` (default ``QuantizationConfig()``): a name of
    :data:`tools.compression.quantization.QUANTIZATION_BACKENDS`, or ``auto`` (ONNX Runtime where it is
    installed; should it fail on this model, ``torch-ao-dynamic``, with a note). ``shape``
    is the input the model is exported with by backends that export it (default: resolved from the
    original). Returns the quantization report as saved.
    """
    from tools.compression.quantization import (
        AUTO,
        DEFAULT_BACKEND,
        ModuleBackend,
        QuantizationError,
        get_backend,
        plan_quantization,
    )
    from tools.deploy.onnxruntime import OnnxRuntimeError

    backend = (config or QuantizationConfig()).backend
    if not is_complete(out_dir):
        float_model = load_module(source_dir)
        recipe = {"source": str(source_dir), "recommendations": [r.model_dump() for r in recommendations]}
        report = plan_quantization(float_model, recommendations, backend=backend)
        exports = not isinstance(get_backend(report.backend), ModuleBackend)  # an in-memory backend needs no input
        example = example_input(shape or resolve_input_shape(original_dir)) if shape or exports else None
        try:
            save_quantized(
                float_model, out_dir, base_dir=original_dir, recipe=recipe, report=report, example_input=example
            )
        except (OnnxRuntimeError, QuantizationError) as exc:
            if backend != AUTO or report.backend == DEFAULT_BACKEND:
                raise
            why, failed = (str(exc).splitlines() or [type(exc).__name__])[0], report.backend
            logger.warning("%s quantization failed (%s); falling back to %s", failed, why, DEFAULT_BACKEND)
            report = plan_quantization(float_model, recommendations, backend=DEFAULT_BACKEND)
            report.notes.append(f"--quant-backend auto: {failed} failed ({why}); used {DEFAULT_BACKEND}")
            save_quantized(
                float_model, out_dir, base_dir=original_dir, recipe=recipe, report=report, example_input=example
            )
        logger.info("quantized %s into %s with %s", source_dir, out_dir, report.backend)
    return dict(read_json(out_dir / "artifact.json")["quantization"])


# --- evaluation -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _dataset(spec: str, split: str | None, samples: int, seed: int) -> Any:
    from tools.evaluation.datasets import load_eval_dataset

    return load_eval_dataset(spec, split=split, samples=samples, seed=seed)


def match_dataset_labels(
    original_dir: Path, dataset: str, split: str | None, samples: int, seed: int
) -> dict[str, Any]:
    from tools.evaluation.labels import match_labels

    loaded = load_original(original_dir)
    data = _dataset(dataset, split, samples, seed)
    return match_labels(loaded.id2label, data.label_names).model_dump()


class _MemoPreprocess:
    """Preprocess each image once per process: every candidate of a run sees the same evaluation images."""

    def __init__(self, preprocess: Callable[[list[Any]], torch.Tensor]) -> None:
        self.preprocess = preprocess
        self.done: dict[int, tuple[Any, torch.Tensor]] = {}

    def __call__(self, images: list[Any]) -> torch.Tensor:
        missing = [img for img in images if id(img) not in self.done]
        if missing:
            for img, tensor in zip(missing, self.preprocess(missing), strict=True):
                self.done[id(img)] = (img, tensor)  # the image is kept, so its id stays unique
        return torch.stack([self.done[id(img)][1] for img in images])


_PREPROCESS: dict[tuple[str, tuple[int, int, int]], _MemoPreprocess] = {}


def preprocess_of(original_dir: Path, shape: InputShape) -> Callable[[list[Any]], torch.Tensor]:
    """Images -> batch, as the original model expects them (HF processor, or the factory's options)."""
    key = (str(original_dir.resolve()), shape.as_tuple())
    if key not in _PREPROCESS:
        from tools.models.specs import preprocess_for

        loaded = load_original(original_dir)
        _PREPROCESS.clear()  # one model's images at a time
        _PREPROCESS[key] = _MemoPreprocess(
            preprocess_for(loaded.preprocessing)
            if loaded.preprocessing
            else build_preprocess(loaded.processor, shape.as_tuple())
        )
    return _PREPROCESS[key]


def accuracy_of(
    model: Callable[[torch.Tensor], Any], original_dir: Path, shape: InputShape, spec: EvalSpec, desc: str = "evaluate"
) -> tuple[float | None, int]:
    """Top-1 accuracy of any model callable (torch module, ONNX Runtime session) on the seeded subset.

    None (and 0 samples) without a dataset, or for an untrained model.
    """
    from tools.evaluation.accuracy import evaluate_accuracy
    from tools.evaluation.labels import LabelMatch

    if spec.dataset is None or spec.label_match is None or load_original(original_dir).untrained:
        return None, 0
    return evaluate_accuracy(
        model,
        preprocess_of(original_dir, shape),
        _dataset(spec.dataset, spec.split, spec.samples, spec.seed),
        LabelMatch.model_validate(spec.label_match),
        batch_size=spec.batch_size,
        device=str(resolve_device(spec.device)),
        progress=spec.progress,
        desc=desc,
    )


def evaluate(
    artifact_dir: Path, original_dir: Path, shape: InputShape, spec: EvalSpec, desc: str = "evaluate"
) -> Metrics:
    """Accuracy on the seeded subset, latency at batch 1, throughput, memory as saved, params, MACs."""
    from tools.evaluation.cost import file_size_mb, measure_latency, measure_throughput

    meta = read_json(artifact_dir / "artifact.json")
    quantized = meta["kind"] == "quantized"
    run_device = "cpu" if quantized else spec.device  # quantized kernels are CPU kernels (ONNX Runtime's too)
    model = load_compressed(artifact_dir, device=str(resolve_device(run_device)))
    accuracy, counted = accuracy_of(model, original_dir, shape, spec.model_copy(update={"device": run_device}), desc)
    single = example_input(shape, device=run_device, seed=spec.seed)
    latency = measure_latency(model, single, warmup=3, repeats=10)
    # one timed call at the evaluation batch size: the batch-1 runs above already warmed the model up
    batch = example_input(shape, batch=min(spec.batch_size, spec.samples), device=run_device, seed=spec.seed)
    throughput = measure_throughput(model, batch, warmup=0, repeats=1)
    # a quantized model counts the parameters and MACs of the float model it came from (it may not be torch)
    float_model = load_module(Path(meta["recipe"]["source"])) if quantized else model
    if not isinstance(float_model, nn.Module):
        raise TypeError(f"{artifact_dir} ({meta['kind']}) did not load as a torch module")
    return Metrics(
        accuracy=accuracy,
        params=sum(p.numel() for p in float_model.parameters()),
        macs=_macs(float_model.cpu(), shape),
        latency_s=latency,
        throughput_ips=throughput,
        memory_mb=round(file_size_mb(deployed_file(artifact_dir)), 4),
        artifact=str(artifact_dir),
        samples=counted,
    )


def _macs(model: nn.Module, shape: InputShape) -> int | None:
    """MACs of a float model by ptflops (a quantized model counts as the float model it came from)."""
    from tools.profiling.static import static_profile

    try:
        macs, _, _ = static_profile(model, shape.as_tuple())
        return int(macs)
    except Exception as exc:  # MACs are informative; never fail an evaluation over them
        logger.warning("MAC count failed: %s", exc)
        return None


def compare_latency(
    artifacts: dict[str, Path], shape: InputShape, *, repeats: int = 20, device: str = "cpu", seed: int = 0
) -> dict[str, float]:
    """Batch-1 latency of several artifacts measured interleaved in one process, medians in seconds."""
    from tools.evaluation.cost import compare_latencies

    models: dict[str, Callable[[torch.Tensor], Any]] = {}
    for name, path in artifacts.items():
        models[name] = load_compressed(path)  # an nn.Module, or an OrtModel for onnxruntime artifacts
    return compare_latencies(models, example_input(shape, seed=seed), warmup=3, repeats=repeats)
