"""The registry of deployment backends: every runtime and precision a model can be deployed in, by name.

Each backend lives in the module of its runtime and declares what it is (:class:`tools.deploy.base.Deployment`:
name, runtime, precision, float reference, required modules) and how it builds and loads its artifact
(:class:`~tools.deploy.base.QuantizationBackend`). :data:`BACKENDS` lists them once; the command-line choices,
the availability of each backend, the runtime and precision of reports and the float reference of each runtime
are all derived from there. Adding a runtime is one module and one line of :data:`BACKENDS`.

``auto`` has two meanings, both defined here:

* :data:`AUTO` as a run's ``--deploy`` (:class:`tools.deploy.config.QuantizationConfig`): build, evaluate and
  time every available backend and deploy the fastest within the accuracy budget (:mod:`tools.stages.deployment`);
* ``auto`` given to one quantize call (``tools.stages.ops.quantize``, :func:`get_backend`): the single backend
  :func:`default_quantize_backend` names -- ``onnxruntime`` where ``onnx`` and ``onnxruntime`` import, else
  :data:`DEFAULT_BACKEND`.

It also plans and carries out quantization in memory: :func:`resolve_targets` (the ``nn.Linear`` layers a plan
selects), :func:`plan_quantization` (what a backend will quantize), :func:`quantize` (in-memory torch backends).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from torch import nn

from tools.deploy.base import (
    Deployment,
    ModuleBackend,
    QuantizationBackend,
    QuantizationError,
    QuantReport,
    TimingBuild,
    importable,
)
from tools.deploy.cpu import int8_settings
from tools.deploy.onnxruntime.backend import OnnxRuntimeBackend, OnnxRuntimeDynamicBackend, OnnxRuntimeFusedBackend
from tools.deploy.onnxruntime.mixed import OnnxRuntimeMixedBackend
from tools.deploy.openvino.backend import (
    OpenVinoBackend,
    OpenVinoBf16Backend,
    OpenVinoFastBiasBackend,
    OpenVinoMixedBackend,
)
from tools.deploy.pytorch import FLOAT, FloatModel, TorchAODynamicBackend
from tools.schemas import QuantDType, QuantizationRecommendation

logger = logging.getLogger(__name__)

#: Every backend that builds a deployed artifact, by name, in the order candidates are listed.
BACKENDS: dict[str, QuantizationBackend] = {
    backend.name: backend
    for backend in (
        TorchAODynamicBackend(),
        OnnxRuntimeDynamicBackend(),
        OnnxRuntimeFusedBackend(),
        OnnxRuntimeBackend(static=False),
        OnnxRuntimeBackend(static=True),
        OnnxRuntimeMixedBackend(),
        OpenVinoBackend(int8=False),
        OpenVinoBf16Backend(),
        OpenVinoBackend(int8=True),
        OpenVinoFastBiasBackend(),
        OpenVinoMixedBackend(),
    )
}

#: Every name a model can be deployed as, described: the float model as it is (``torch``), then every backend.
DEPLOYMENTS: dict[str, Deployment] = {FLOAT: FloatModel(), **BACKENDS}

#: What a user gets from a runtime in one command, without this tool: the original in these builds takes part in the
#: deployment's last timing, and the deployed model must beat the fastest of them within the budget.
ONE_COMMAND_BUILDS = ("openvino", "openvino-int8", "onnxruntime-fp32", "onnxruntime")

#: The bench's baselines of the original (``graph.bench``), bench method -> the deployment it runs as. ONNX Runtime's
#: own export and ``quantize_dynamic`` (the paper's baseline: ``tools.deploy.onnxruntime.session.onnx_baseline``):
BENCH_EXPORTED_BASELINES: dict[str, str] = {"onnxruntime-fp32": "onnxruntime-fp32", "onnxruntime-quant": "onnxruntime"}
#: The builds of these backends, calibrated on the run's images, in the order the bench builds them:
BENCH_BUILT_BASELINES: dict[str, str] = {
    "openvino-fp32": "openvino",
    "openvino-int8-quant": "openvino-int8",
    "onnxruntime-static-quant": "onnxruntime-static",
}
#: Every baseline of the bench, in its order. A runtime's FP32 row is the one whose deployment is its own float
#: reference (the original for PyTorch): it separates the runtime's speed-up from the precision's.
BENCH_BASELINES: dict[str, str] = {**BENCH_EXPORTED_BASELINES, **BENCH_BUILT_BASELINES}

#: The float deployment that evaluates a float model faster than PyTorch on a CPU: the twin of a slow float
#: evaluation (``tools.evaluation.twin``), whose answers match PyTorch's (checked there).
FLOAT_TWIN = "openvino"
#: The build whose per-block int8 cost the int8 profile measures (``tools.deploy.onnxruntime.mixed``).
INT8_PROFILED_IN = "onnxruntime-static"

#: A run's ``--deploy auto``: measure every available backend and deploy the fastest within budget. To one
#: quantize call, ``auto`` is the backend :func:`default_quantize_backend` names.
AUTO = "auto"
#: The default backend of a quantize call, and the one ``auto`` falls back to when its backend fails there.
DEFAULT_BACKEND = "torch-ao-dynamic"
#: What one quantize call takes (:func:`get_backend`): a backend, or ``auto``.
BACKEND_CHOICES = (*BACKENDS, AUTO)
#: What ``--deploy`` takes: ``auto`` (the measured choice), ``torch`` (the float model as it is), or one backend.
DEPLOY_CHOICES = (AUTO, FLOAT, *BACKENDS)


def available(name: str) -> bool:
    """Whether the Python modules ``name`` requires import here (a name the registry does not know needs none)."""
    described = DEPLOYMENTS.get(name)
    return described is None or importable(described.requires)


def default_quantize_backend() -> str:
    """What ``auto`` means to one quantize call: ``onnxruntime`` where it is available, else :data:`DEFAULT_BACKEND`."""
    return "onnxruntime" if available("onnxruntime") else DEFAULT_BACKEND


def resolve_backend_name(name: str) -> str:
    """``auto`` -> :func:`default_quantize_backend`; other names as given."""
    return default_quantize_backend() if name == AUTO else name


def runtime_and_precision(name: str, unknown: tuple[str, str] = ("pytorch", "?")) -> tuple[str, str]:
    """The runtime and precision ``name`` deploys in (the float model included); ``unknown`` for another name."""
    described = DEPLOYMENTS.get(name)
    return (described.runtime, described.precision) if described is not None else unknown


def float_reference_of(name: str) -> str:
    """The FP32 backend of ``name``'s runtime (``torch`` for the PyTorch backends and for unknown names)."""
    described = DEPLOYMENTS.get(name)
    return described.float_reference if described is not None else FLOAT


#: The deployments a model can be built in for timing alone (``tools.deploy.base.TimingBuild``): what the latency
#: objective's probes are timed in (:func:`timed_in`).
TIMED: tuple[str, ...] = tuple(n for n, d in DEPLOYMENTS.items() if isinstance(d, TimingBuild) and d.timed_as == n)


def timed_in(name: str) -> str:
    """The deployment whose timing build stands for ``name`` (``Deployment.timed_as``): the float model for a name
    the registry does not know (none chosen yet)."""
    described = DEPLOYMENTS.get(name)
    return described.timed_as if described is not None else FLOAT


def timing_build(name: str) -> TimingBuild:
    """The timing build of ``name`` (one of :data:`TIMED`); ``ValueError`` for another name."""
    described = DEPLOYMENTS.get(name)
    if not isinstance(described, TimingBuild) or described.timed_as != name:
        raise ValueError(f"no timing build {name!r}: choose one of {', '.join(TIMED)}")
    return described


def get_backend(name: str = DEFAULT_BACKEND) -> QuantizationBackend:
    try:
        return BACKENDS[resolve_backend_name(name)]
    except KeyError:
        raise QuantizationError(
            f"unknown quantization backend {name!r}: choose one of {', '.join(BACKEND_CHOICES)}"
        ) from None


def resolve_targets(
    model: nn.Module,
    recommendations: Iterable[QuantizationRecommendation],
    kinds: tuple[type[nn.Module], ...] = (nn.Linear,),
    *,
    subclasses: bool = False,
) -> tuple[dict[str, QuantDType], list[str]]:
    """Module name -> dtype for every layer of ``kinds`` selected (``all``: every one; else a regex over module
    names); later recommendations override earlier ones, so ``all`` at qint8 then one block at float32 keeps that
    block in float. The patterns that selected nothing come second. ``subclasses``: a subclass of a kind counts
    (backends that quantize the exported graph's nodes, whatever Python class made them); else the exact types
    only (torch-ao swaps modules by exact type: ``nn.MultiheadAttention``'s ``NonDynamicallyQuantizableLinear``
    stays float)."""
    linears = [name for name, m in model.named_modules() if (isinstance(m, kinds) if subclasses else type(m) in kinds)]
    targets: dict[str, QuantDType] = {}
    unmatched: list[str] = []
    for rec in recommendations:
        if rec.layer == "all":
            chosen = linears
        else:
            try:
                pattern = re.compile(rec.layer)
            except re.error as exc:
                raise QuantizationError(f"invalid layer regex {rec.layer!r}: {exc}") from exc
            chosen = [name for name in linears if pattern.search(name)]
        if not chosen:
            unmatched.append(rec.layer)
        for name in chosen:
            targets[name] = rec.dtype
    return targets, unmatched


def plan_quantization(
    model: nn.Module,
    recommendations: Iterable[QuantizationRecommendation],
    *,
    backend: str = DEFAULT_BACKEND,
    int8_cpu: str = "auto",
) -> QuantReport:
    """What ``backend`` will quantize in ``model``: the selected nn.Linear layers it supports, and why not others;
    for a backend whose int8 depends on the CPU kind, the settings for ``int8_cpu`` (:func:`tools.deploy.cpu.
    int8_settings`: ``auto`` is this machine's kind)."""
    impl = get_backend(backend)
    # graph backends select subclasses too: EfficientNet's depthwise convolution is an nn.Conv2d subclass, and an
    # exact-type match left its 16 depthwise layers in float in ONNX Runtime static int8 as if the plan had said so
    targets, unmatched = resolve_targets(
        model, recommendations, impl.layer_kinds, subclasses=not isinstance(impl, ModuleBackend)
    )
    layers, notes = impl.supported(targets)
    kept = impl.kept_float(model, layers) if isinstance(impl, ModuleBackend) else {}
    if kept:
        layers = {name: dtype for name, dtype in layers.items() if name not in kept}
        logger.warning(
            "%s keeps %d layer(s) in float: %s", impl.name, len(kept), "; ".join(f"{n}: {w}" for n, w in kept.items())
        )
        notes = [*notes, f"{len(kept)} layer(s) kept in float: their parent reads their weight itself"]
    if not targets:
        logger.warning("no nn.Linear selected for quantization; the model is left in float32")
        notes = [*notes, "no nn.Linear layer was selected for int8: this backend's model keeps float32 weights"]
    settings = int8_settings(int8_cpu) if impl.cpu_dependent_int8 else None
    return QuantReport(
        backend=impl.name, layers=layers, unmatched=unmatched, notes=notes, int8=settings, float_layers=kept
    )


def quantize(
    model: nn.Module, recommendations: Iterable[QuantizationRecommendation], *, backend: str = DEFAULT_BACKEND
) -> tuple[nn.Module, QuantReport]:
    """Return a dynamically quantized copy of ``model`` (on the CPU) and what was quantized.

    In memory, so for torch backends only; ``onnxruntime`` quantizes while saving
    (:func:`tools.stages.ops.quantize`, or :func:`tools.artifacts.io.save_quantized`).
    """
    impl = get_backend(backend)
    if not isinstance(impl, ModuleBackend):
        raise QuantizationError(
            f"the {impl.name} backend quantizes into an artifact, not in memory: use tools.stages.ops.quantize"
        )
    report = plan_quantization(model, recommendations, backend=impl.name)
    qmodel = impl.quantize(model, report.layers)
    logger.info("quantized %d layers with %s", len(report.layers), impl.name)
    return qmodel, report


__all__ = [
    "AUTO",
    "BACKENDS",
    "BACKEND_CHOICES",
    "DEFAULT_BACKEND",
    "DEPLOYMENTS",
    "DEPLOY_CHOICES",
    "FLOAT",
    "TIMED",
    "available",
    "default_quantize_backend",
    "float_reference_of",
    "get_backend",
    "plan_quantization",
    "quantize",
    "resolve_backend_name",
    "resolve_targets",
    "runtime_and_precision",
    "timed_in",
    "timing_build",
]
