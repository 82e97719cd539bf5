"""Path-in, path-out operations: the tool calls the agents make.

Each operation loads what it needs from artifacts on disk, does one job with the torch tools, writes
its result atomically, and returns a pydantic record. They are idempotent: an operation whose output
artifact is already complete returns the existing result instead of recomputing it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import JsonValue
from torch import nn

from tools.artifacts.hashes import prune_recipe_hash, quantize_recipe_hash, stale_reason, stored_recipe_hash
from tools.artifacts.io import (
    copy_artifact,
    is_complete,
    load_module,
    load_original,
    save_compressed,
    save_original,
    save_quantized,
)
from tools.clock import counts_as
from tools.compression.recipes import PruningConfig, RecoveryConfig
from tools.deploy.config import QuantizationConfig, build_quantized
from tools.deploy.cpu import resolve_target
from tools.deploy.registry import BACKENDS, FLOAT
from tools.models.base import example_input, logits_of, resolve_device
from tools.models.input_shape import ImageHints, resolve_loaded_shape
from tools.models.sources import acquire_model
from tools.schemas import (
    InputShape,
    Int8Sensitivity,
    ModelInfo,
    ModelProfile,
    OptimizationPlan,
    QuantizationRecommendation,
    SensitivityProfile,
)
from tools.stages.judging import (
    accuracy_of,
    compare_latency,
    evaluate,
    evaluate_accuracy_on,
    latency_device,
    predictions_on,
)
from tools.stages.run_data import (
    Calibration,
    DataCheck,
    EvalSpec,
    auto_eval_samples,
    calibration_batch,
    check_data,
    check_extra_images,
    extra_batch,
    extra_images_used,
    finetune_batch,
    match_dataset_labels,
    part_sizes,
    preprocess_of,
)
from tools.store.files import atomic_write_json, read_json

if TYPE_CHECKING:
    from tools.compression.distill import DistillConfig
    from tools.compression.recovery import RecoveryReport
    from tools.compression.reference import ReferencePasses
    from tools.compression.reports import PruneReport
    from tools.deploy.accuracy import AccuracyControl

logger = logging.getLogger(__name__)

# the run's data operations (tools.stages.run_data) and evaluations (tools.stages.judging) are re-exported for the nodes
__all__ = [
    "ROUND_TIMING_SECONDS",
    "SYNTHETIC_SAMPLES",
    "Calibration",
    "DataCheck",
    "EvalSpec",
    "ModelInfo",
    "accuracy_of",
    "acquire",
    "auto_eval_samples",
    "calibration_batch",
    "calibration_images",
    "check_data",
    "check_extra_images",
    "compare_latency",
    "evaluate",
    "evaluate_accuracy_on",
    "extra_batch",
    "extra_images_used",
    "finetune_batch",
    "int8_sensitivity",
    "latency_device",
    "latency_in_build",
    "match_dataset_labels",
    "part_sizes",
    "predictions_on",
    "preprocess_of",
    "profile",
    "prunable",
    "prune",
    "quantize",
    "record_int8_not_measured",
    "resolve_input_shape",
    "sensitivity",
    "set_threads",
    "shape_problem",
]


def set_threads(threads: int) -> None:
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# --- acquisition and input shape --------------------------------------------------------------------


def acquire(
    spec: str, out_dir: Path, device: str = "cpu", factory_options: Mapping[str, JsonValue] | None = None
) -> ModelInfo:
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


def dry_run(model: nn.Module, shape: InputShape, device: str = "cpu") -> int:
    """Forward one input of ``shape``; return the number of logits."""
    with torch.no_grad():
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


def resolve_input_shape(original_dir: Path, device: str = "cpu", hints: ImageHints | None = None) -> InputShape:
    """(channels, height, width) from the flags, processor, config and layers (and the dataset's images,
    ``hints``), proven by a dry forward pass (see :mod:`tools.models.input_shape`)."""
    return resolve_loaded_shape(load_original(original_dir), hints, device=resolve_device(device))


# --- profiling --------------------------------------------------------------------------------------


@counts_as("profile")
def profile(
    original_dir: Path, shape: InputShape, out_dir: Path, device: str = "cpu", progress: bool = False
) -> ModelProfile:
    """Static (ptflops) and dynamic (torch.profiler, hooks) profile; ``profile.json`` and a Chrome trace."""
    from tools.compression.heads import has_attention
    from tools.profiling.profile import profile_model

    target = out_dir / "profile.json"
    if target.is_file():
        return ModelProfile.model_validate(read_json(target))
    loaded = load_original(original_dir)
    model = _as_pruned(loaded.model).to(resolve_device(device))  # layer names as pruning and its probes see them
    result = profile_model(
        model,
        example_input(shape, device=device),
        family=loaded.family,
        attention=has_attention(model),
        trace_path=out_dir / "trace.json",
        progress=progress,
    )
    atomic_write_json(target, result.model_dump())
    return result


@counts_as("profile")
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


@counts_as("profile")
def sensitivity(
    original_dir: Path,
    shape: InputShape,
    out_dir: Path,
    spec: EvalSpec,
    config: PruningConfig | None = None,
    recovery: RecoveryConfig | None = None,
    device: str = "cpu",
    samples: int = 0,
    latency_runtime: str | None = None,
) -> SensitivityProfile | None:
    """Per-unit sensitivity on the calibration images (``sensitivity.json``, also put into ``profile.json``).

    ``samples``: calibration images to probe with (0: automatic, about two minutes in all, from the model's
    MACs, not its timed latency; see ``tools.compression.sensitivity.auto_samples``). None without
    calibration images (no dataset, or ``calibration_samples`` 0). ``latency_runtime`` (``--objective latency``): each
    probe's latency saving is measured in that timing build (:mod:`tools.evaluation.runtime_latency`), batch 1.
    """
    from tools.compression.sensitivity import DEFAULT_RATIOS, affordable_units, auto_samples, measure_sensitivity
    from tools.compression.units import prunable_units
    from tools.evaluation.runtime_latency import latency_saving

    target = out_dir / "sensitivity.json"
    if target.is_file():
        return SensitivityProfile.model_validate(read_json(target))
    calibration = calibration_batch(original_dir, shape, spec)
    if calibration is None:
        return None
    profile_file = out_dir / "profile.json"
    model_profile = ModelProfile.model_validate(read_json(profile_file))
    units = prunable_units(prunable(original_dir, shape, out_dir), model_profile.layers)
    units = [u for u in units if config is None or config.allows(u.pruning_type)]  # --unit-kinds
    target_device = resolve_device(device)
    available = int(calibration.images.shape[0])
    count = samples or auto_samples(model_profile.total_macs, len(units) * len(DEFAULT_RATIOS), available)
    count = min(count, available)
    unaffordable: dict[str, str] = {}
    if not samples:  # at the floor of images a large model cannot probe every unit in the profile's time
        units, unaffordable = affordable_units(
            units, model_profile.layers, count, DEFAULT_RATIOS, latency=latency_runtime is not None
        )
    original = _as_pruned(load_original(original_dir).model).to(target_device)
    result = measure_sensitivity(
        original,
        channels_last(calibration.images[:count].to(target_device)),
        units,
        targets=None if calibration.targets is None else calibration.targets[:count],
        layers=model_profile.layers,
        pruning=config,
        recovery=recovery,
        batch_size=spec.batch_size,
        latency_saving=latency_saving(latency_runtime, original, example_input(shape)) if latency_runtime else None,
    )
    result.skipped.update(unaffordable)
    result.latency_runtime = latency_runtime
    atomic_write_json(target, result.model_dump())
    atomic_write_json(profile_file, model_profile.model_copy(update={"sensitivity": result}).model_dump())
    return result


@counts_as("profile")
def int8_sensitivity(
    original_dir: Path, shape: InputShape, out_dir: Path, spec: EvalSpec, int8_cpu: str = "auto", samples: int = 0
) -> Int8Sensitivity | None:
    """Per-block int8 sensitivity of the original (``int8_sensitivity.json``, also put into ``profile.json``): ONNX
    Runtime static int8 of one block at a time, on this CPU with the int8 settings of ``int8_cpu``'s kind, against
    the float model on ``samples`` calibration images (0: :func:`int8_samples`;
    :func:`tools.deploy.onnxruntime.mixed.measure_int8_sensitivity`).
    None without calibration images or without ONNX Runtime."""
    import tempfile

    from tools.deploy.cpu import int8_settings
    from tools.deploy.onnxruntime.mixed import StaticInt8Build, int8_samples, measure_int8_sensitivity
    from tools.deploy.registry import INT8_PROFILED_IN, available

    target = out_dir / "int8_sensitivity.json"
    if target.is_file():
        return Int8Sensitivity.model_validate(read_json(target))
    calibration = calibration_batch(original_dir, shape, spec)
    if calibration is None or not available(INT8_PROFILED_IN):
        return None
    model = load_original(original_dir).model.eval()
    with tempfile.TemporaryDirectory(prefix=".int8-sensitivity-", dir=out_dir) as work:
        build = StaticInt8Build(model, example_input(shape), calibration.images, Path(work), int8_settings(int8_cpu))
        profile_file = out_dir / "profile.json"
        macs = ModelProfile.model_validate(read_json(profile_file)).total_macs if profile_file.is_file() else 0
        count = samples or int8_samples(macs, len(build.groups), int(calibration.images.shape[0]))
        result = measure_int8_sensitivity(build, calibration.images[:count])
    atomic_write_json(target, result.model_dump())
    _update_profile(out_dir, int8_sensitivity=result)
    return result


def record_int8_not_measured(out_dir: Path, why: str) -> None:
    """Say in ``profile.json`` why the run measured no per-block int8 sensitivity (``int8_not_measured``), for the
    planners and the report."""
    _update_profile(out_dir, int8_not_measured=why)


def _update_profile(out_dir: Path, **fields: object) -> None:
    """``out_dir / profile.json`` with ``fields`` set (nothing where the run wrote no profile)."""
    profile_file = out_dir / "profile.json"
    if profile_file.is_file():
        profile = ModelProfile.model_validate(read_json(profile_file))
        atomic_write_json(profile_file, profile.model_copy(update=fields).model_dump())


# --- pruning and quantization -----------------------------------------------------------------------


def channels_last(images: torch.Tensor) -> torch.Tensor:
    """A batch of images laid out channels-last, which PyTorch's CPU convolutions (and every layer after them) run
    faster on: EfficientNet-Lite2's recovery pass over 125 images at 260 px went from 5.1 to 7.7 images a second at
    one thread. The same numbers (1e-6)."""
    return images.contiguous(memory_format=torch.channels_last) if images.ndim == 4 else images


def _as_pruned(model: nn.Module) -> nn.Module:
    """The original as pruning sees it: every ``nn.MultiheadAttention`` split into q/k/v/o layers, exactly
    (:func:`tools.compression.mha.with_split_attention`), so that its heads are units whose output projection
    recovery can refit, in the profile, the sensitivity probes and each round's reference alike."""
    from tools.compression.mha import with_split_attention

    return with_split_attention(model)


def _artifact_key(original_dir: Path) -> str:
    """The saved original, as a key that changes when it is saved again."""
    meta = original_dir / "artifact.json"
    return f"{original_dir.resolve()}@{meta.stat().st_mtime_ns if meta.is_file() else 0}"


@counts_as("prune")
def _reference(
    original_dir: Path, images: torch.Tensor | None, targets: torch.Tensor | None, recovery: RecoveryConfig
) -> ReferencePasses | None:
    """The original's passes over the calibration images (``tools.compression.reference``), shared by every round of
    the run, the last ones held out to judge each round's recovery on images it was not fit on; None without
    images."""
    from tools.compression.reference import reference_passes
    from tools.compression.repair import held_out_count

    if images is None:
        return None
    return reference_passes(
        _artifact_key(original_dir),
        lambda: _as_pruned(load_original(original_dir).model),
        images,
        targets,
        holdout=held_out_count(images.shape[0], recovery.holdout) if recovery.method != "none" else 0,
    )


def _distilled(
    model: nn.Module, original: nn.Module, images: torch.Tensor | None, config: DistillConfig | None
) -> dict[str, Any] | None:
    """What distilling ``model`` from ``original`` on ``images`` did (``DistillReport``), or why it was skipped; None
    when ``config`` asks for no steps."""
    from tools.compression.distill import distill_

    if config is None or config.steps <= 0:
        return None
    if images is None:
        return {"steps": 0, "skipped": "no images to distil on (no dataset)"}
    return distill_(model, original, images, config).model_dump()


def prune(
    original_dir: Path,
    plan: OptimizationPlan,
    shape: InputShape,
    out_dir: Path,
    config: PruningConfig | None = None,
    *,
    recovery: RecoveryConfig | None = None,
    calibration: Calibration | None = None,
    finetune: DistillConfig | None = None,
    finetune_images: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Apply a plan's pruning recommendations to an intact copy of the original, repair it, save it.

    ``config`` (default ``PruningConfig()``): importance, round_to and seed. ``calibration`` feeds the
    data-aware importance and ``recovery`` (default ``RecoveryConfig(method="none")``: none without it);
    ``finetune`` (steps > 0) distils the repaired model against the original on ``finetune_images``
    (default: the calibration images). The recipe written with the model records all of it; the returned
    report adds ``recovery`` and ``finetune`` (what each did, with its seconds).

    A complete artifact in ``out_dir`` is reused only if it was built from the same recipe
    (``tools.artifacts.hashes.prune_recipe_hash``); otherwise it is rebuilt, and the report's ``rebuilt``
    says why (None when nothing stale was replaced).
    """
    config = config or PruningConfig()
    recovery = recovery or RecoveryConfig(method="none")
    key = prune_recipe_hash(
        original_dir,
        plan,
        shape,
        config,
        recovery,
        calibration=(calibration.images, calibration.targets) if calibration is not None else None,
        finetune=finetune,
        finetune_images=finetune_images,
    )
    stale = stale_reason(out_dir, key)
    if is_complete(out_dir) and stale is None:
        recipe_done = read_json(out_dir / "artifact.json")["recipe"]
        done = {k: recipe_done[k] for k in ("recovery", "finetune") if k in recipe_done}
        return {**recipe_done["report"], **done, "rebuilt": None}
    if stale is not None:
        logger.warning("rebuilding the pruned model: %s", stale)
    images = channels_last(calibration.images) if calibration is not None else None
    model = load_original(original_dir).model.eval()
    reference = _reference(original_dir, images, calibration.targets if calibration is not None else None, recovery)
    original = reference.original if reference is not None else _as_pruned(load_original(original_dir).model).eval()
    report, repaired = _pruned_and_repaired(model, original, reference, plan, shape, config, recovery)
    fit = finetune_images if finetune_images is not None else images
    tuned = _distilled(model, original, fit, finetune) if report.applied else None
    # max_ratio bounds what a planner may ask; it is not part of how the plan was applied
    recipe = {
        "plan": plan.model_dump(),
        **config.model_dump(exclude={"max_ratio"}),
        "report": report.model_dump(),
        "recovery": repaired.model_dump(),
        "finetune": tuned,
    }
    save_compressed(model, out_dir, base_dir=original_dir, kind="pruned", recipe=recipe, recipe_key=key)
    return {**report.model_dump(), "recovery": repaired.model_dump(), "finetune": tuned, "rebuilt": stale}


def _pruned_and_repaired(
    model: nn.Module,
    original: nn.Module,
    reference: ReferencePasses | None,
    plan: OptimizationPlan,
    shape: InputShape,
    config: PruningConfig,
    recovery: RecoveryConfig,
) -> tuple[PruneReport, RecoveryReport]:
    """``plan``'s pruning applied to ``model`` IN PLACE (seeded; data-aware with ``reference``'s passes, None without
    images), then the model repaired against ``reference``, or recovered against ``original`` without it: the pruning
    report and the repair's."""
    from tools.compression.pruning import apply_pruning
    from tools.compression.recovery import recover_
    from tools.compression.repair import repair_

    torch.manual_seed(config.seed)
    report = apply_pruning(
        model,
        plan.pruning_recommendations,
        example_input(shape),
        config,
        calibration=reference.images if reference is not None else None,
        calibration_targets=reference.targets if reference is not None else None,
        channel_scores=reference.channel_scores(config.importance) if reference is not None else None,
    )
    consumers = report.consumers()
    if reference is not None:
        return report, repair_(model, reference, consumers, recovery, report.kept_outputs())
    return report, recover_(model, original, None, consumers, recovery)


@counts_as("build")
def quantize(
    source_dir: Path,
    original_dir: Path,
    recommendations: list[QuantizationRecommendation],
    out_dir: Path,
    config: QuantizationConfig | None = None,
    *,
    shape: InputShape | None = None,
    calibration: torch.Tensor | None = None,
    accuracy_control: AccuracyControl | None = None,
    reuse: Sequence[Path] = (),
) -> dict[str, Any]:
    """Quantize the model at ``source_dir`` (original or pruned) with one backend; save it as deployed.

    ``config.backend`` (default ``QuantizationConfig()``): a name of :data:`tools.deploy.registry.BACKENDS`, or
    ``auto`` (one backend, :func:`~tools.deploy.registry.default_quantize_backend`: ONNX Runtime where it is
    installed; should it fail on this model, ``torch-ao-dynamic``, with a note). ``shape`` is the input the model
    is exported with by backends that export it (default: resolved from the original). ``calibration``:
    preprocessed images, for the backends that quantize activations statically. ``config.int8_cpu``: the CPU kind
    int8 is built for (:mod:`tools.deploy.cpu`). ``accuracy_control``: for the mixed-precision backends.
    ``reuse``: other places a complete artifact of the same recipe may already be (a deployment candidate): the first
    one found is copied instead of built again.
    Returns the quantization report as saved, plus ``rebuilt``: why a complete artifact in ``out_dir`` built from
    another recipe (``tools.artifacts.hashes.quantize_recipe_hash``) was replaced (None when nothing stale was), and
    ``copied_from``: the place of ``reuse`` it was copied from this call (None when built, or complete already).
    """
    config = config or QuantizationConfig()
    target = resolve_target(config.int8_cpu)
    control = accuracy_control.digest() if accuracy_control is not None else None
    key = quantize_recipe_hash(
        source_dir, recommendations, config.backend, shape, calibration, int8_target=target, accuracy_control=control
    )
    stale = stale_reason(out_dir, key)
    if stale is not None:
        logger.warning("rebuilding the quantized model: %s", stale)
    built = next((Path(p) for p in reuse if stored_recipe_hash(Path(p)) == key), None)
    copied_from: str | None = None
    if (not is_complete(out_dir) or stale is not None) and built is not None:
        copy_artifact(built, out_dir)
        copied_from = str(built)
        logger.info("copied the quantized model %s (same recipe) to %s", built, out_dir)
    elif not is_complete(out_dir) or stale is not None:
        float_model = load_module(source_dir)
        save = partial(
            save_quantized,
            float_model,
            out_dir,
            base_dir=original_dir,
            recipe={"source": str(source_dir), "recommendations": [r.model_dump() for r in recommendations]},
            calibration=calibration,
            recipe_key=key,
            accuracy_control=accuracy_control,
        )
        resolve = partial(resolve_input_shape, original_dir)
        report = build_quantized(float_model, recommendations, config.backend, target, shape, resolve, save)
        logger.info("quantized %s into %s with %s", source_dir, out_dir, report.backend)
    return {**read_json(out_dir / "artifact.json")["quantization"], "rebuilt": stale, "copied_from": copied_from}


# --- evaluation -------------------------------------------------------------------------------------


#: Synthetic inputs static int8 is calibrated on when the run has no data.
SYNTHETIC_SAMPLES = 32


def calibration_images(original_dir: Path, shape: InputShape, spec: EvalSpec) -> tuple[torch.Tensor, str]:
    """What static int8 is calibrated on, and a description: the run's calibration images, or, with no data
    (an untrained built-in), seeded synthetic N(0, 1) inputs, which give static int8's latency and memory but
    say nothing of its accuracy."""
    calibration = calibration_batch(original_dir, shape, spec)
    if calibration is not None:
        return calibration.images, f"{calibration.images.shape[0]} calibration images"
    generator = torch.Generator().manual_seed(spec.seed)
    images = torch.randn((SYNTHETIC_SAMPLES, *shape.as_tuple()), generator=generator)
    return images, f"{SYNTHETIC_SAMPLES} synthetic N(0, 1) inputs (no dataset: static int8 accuracy is unknown)"


#: Seconds of calls at least behind a round's latency in the build the original deploys in (``latency_in_build``):
#: the rounds of ``--objective latency`` differ by a few per cent (CIFAR ResNet-20's 2.9 %-MACs round timed 1.078x
#: under load, 0.985x in 400 repetitions idle). Under load it is when they are timed that misleads, not how long.
ROUND_TIMING_SECONDS = 1.0


def latency_in_build(
    source_dir: Path,
    original_dir: Path,
    backend: str,
    reference: Path,
    shape: InputShape,
    spec: EvalSpec,
    *,
    int8_cpu: str = "auto",
    repeats: int = 20,
    earlier: Mapping[str, Path] | None = None,
) -> dict[str, float]:
    """Batch-1 seconds of ``source_dir`` built in ``backend`` as ``<dir>-<backend>`` (int8 as the deployment
    calibrates; a mixed backend's full int8), ``"model"``; of ``reference``, the original's build; of ``earlier``
    source dirs built so before, by name: one interleaved timing, ``--objective latency``'s measure of the rounds."""
    name = BACKENDS[backend].mixed_of or backend if backend in BACKENDS else backend

    def build_of(source: Path) -> Path:
        return source if name == FLOAT else source.with_name(f"{source.name}-{backend}")

    if name != FLOAT:
        images, _ = calibration_images(original_dir, shape, spec)
        config = QuantizationConfig(backend=name, int8_cpu=int8_cpu)
        recs = [QuantizationRecommendation(layer="all", dtype="qint8", justification="every layer, for its latency")]
        quantize(source_dir, original_dir, recs, build_of(source_dir), config, shape=shape, calibration=images)
    models = {key: build_of(source) for key, source in (earlier or {}).items() if build_of(source).exists()}
    return compare_latency(
        {**models, "model": build_of(source_dir), "reference": reference},
        shape,
        repeats=repeats,
        seed=spec.seed,
        min_seconds=ROUND_TIMING_SECONDS,
    )
