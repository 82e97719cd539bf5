"""Post-training dynamic quantization behind a registry of backends.

A backend turns a float model and the layers a plan selects into a deployed artifact, and loads it
back ready to run (:class:`QuantizationBackend`: ``save`` / ``load``, used by
:func:`tools.store.artifacts.save_compressed` and :func:`~tools.store.artifacts.load_compressed`):

* ``torch-ao-dynamic`` (default) — ``torch.ao.quantization.quantize_dynamic`` of the selected
  ``nn.Linear`` layers; deployed as ``model.safetensors`` (int8 values plus scales, no pickle) and
  loaded back as an ``nn.Module``. Being an in-memory torch backend (:class:`ModuleBackend`), it also
  serves :func:`quantize`, which returns the quantized module itself.
* ``onnxruntime`` — the float model exported to ONNX and quantized by ONNX Runtime's
  ``quantize_dynamic`` (int8 MatMul/Gemm weights); deployed as ``model.onnx`` (protobuf, loads without
  unpickling) and loaded back as an :class:`tools.deploy.onnxruntime.OrtModel`, a callable that is not an
  ``nn.Module``: ONNX Runtime is then the deployment runtime.
* ``auto`` (a name, not a backend) — ``onnxruntime`` where ``onnx`` and ``onnxruntime`` import, else
  ``torch-ao-dynamic``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.schemas import QuantDType, QuantizationRecommendation

logger = logging.getLogger(__name__)


class QuantizationError(ValueError):
    """A quantization request that cannot be carried out."""


class BackendNotApplicable(QuantizationError):
    """The backend does not apply to this kind of model (fused attention for a CNN): not a failure."""


class QuantReport(BaseModel):
    backend: str
    layers: dict[str, QuantDType] = Field(default_factory=dict, description="module name -> dtype")
    unmatched: list[str] = Field(default_factory=list, description="patterns that selected no nn.Linear")
    notes: list[str] = Field(default_factory=list, description="what the backend could not do as asked")


def resolve_targets(
    model: nn.Module, recommendations: Iterable[QuantizationRecommendation]
) -> tuple[dict[str, QuantDType], list[str]]:
    """Module name -> dtype for every nn.Linear selected; later recommendations override earlier ones."""
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
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


QuantizedModel = Callable[[torch.Tensor], Any]
"""What a backend loads: an ``nn.Module`` (torch backends) or another callable ``pixel_values -> logits``."""


class QuantizationBackend(Protocol):
    """A quantization method and the artifact it deploys (one file, ``deployed_file``, in the artifact dir)."""

    name: str
    deployed_file: str

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        """The targets this backend quantizes as asked, and notes on those it leaves in float."""
        ...

    def save(
        self,
        float_model: nn.Module,
        report: QuantReport,
        out_dir: Path,
        *,
        example_input: torch.Tensor | None = None,
        qmodel: nn.Module | None = None,
        calibration: torch.Tensor | None = None,
    ) -> QuantReport:
        """Quantize ``float_model`` as ``report`` says (or take ``qmodel``, already quantized by this backend)
        and write ``out_dir / deployed_file``; return the report as carried out. ``calibration`` (preprocessed
        images) is for backends that quantize activations statically; dynamic ones ignore it."""
        ...

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        """The deployed model of ``out_dir``, ready to run on the CPU; ``rebuild()`` gives the float model
        (structure and placeholder weights) for backends that need one."""
        ...


@runtime_checkable
class ModuleBackend(QuantizationBackend, Protocol):
    """A backend that quantizes in memory into an ``nn.Module`` (what :func:`quantize` needs)."""

    def quantize(self, model: nn.Module, targets: dict[str, QuantDType]) -> nn.Module: ...


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """torch.ao.quantization warns about its deprecation on every call; the backend interface is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


class TorchAODynamicBackend:
    """``torch.ao.quantization.quantize_dynamic``: int8 per-channel weights (fbgemm) or float16."""

    name = "torch-ao-dynamic"
    deployed_file = "model.safetensors"
    _suffixes = ("weight_int8", "weight_scale", "weight_zero_point", "weight_fp16", "bias")

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        return dict(targets), []

    def quantize(self, model: nn.Module, targets: dict[str, QuantDType]) -> nn.Module:
        from torch.ao.quantization import (
            float16_dynamic_qconfig,
            per_channel_dynamic_qconfig,
            quantize_dynamic,
        )

        qconfigs = {"qint8": per_channel_dynamic_qconfig, "float16": float16_dynamic_qconfig}
        spec = {name: qconfigs[dtype] for name, dtype in targets.items()}
        with _quietly():
            return quantize_dynamic(model.cpu().eval(), qconfig_spec=spec, inplace=False)

    @staticmethod
    def _dynamic_linears(qmodel: nn.Module) -> Iterable[tuple[str, Any]]:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        return ((name, m) for name, m in qmodel.named_modules() if isinstance(m, DynamicLinear))

    def export_tensors(self, qmodel: nn.Module) -> dict[str, torch.Tensor]:
        """Deployed weights: int8 values with per-channel scales, or float16 values, plus float biases."""
        tensors: dict[str, torch.Tensor] = {}
        for name, module in self._dynamic_linears(qmodel):
            weight, bias = module._packed_params._weight_bias()
            if weight.is_quantized:
                tensors[f"{name}.weight_int8"] = weight.int_repr().contiguous()
                if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                    scales = weight.q_per_channel_scales()
                    zero_points = weight.q_per_channel_zero_points()
                else:
                    scales = torch.tensor([weight.q_scale()])
                    zero_points = torch.tensor([weight.q_zero_point()])
                tensors[f"{name}.weight_scale"] = scales.to(torch.float32).contiguous()
                tensors[f"{name}.weight_zero_point"] = zero_points.to(torch.int8).contiguous()
            else:
                tensors[f"{name}.weight_fp16"] = weight.to(torch.float16).contiguous()
            if bias is not None:
                tensors[f"{name}.bias"] = bias.detach().contiguous()
        return tensors

    def import_tensors(self, qmodel: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        for name, module in self._dynamic_linears(qmodel):
            bias = tensors.get(f"{name}.bias")
            if f"{name}.weight_int8" in tensors:
                values = tensors[f"{name}.weight_int8"]
                scales = tensors[f"{name}.weight_scale"].to(torch.float64)
                zero_points = tensors[f"{name}.weight_zero_point"].to(torch.int64)
                if scales.numel() == 1:
                    weight = torch._make_per_tensor_quantized_tensor(values, float(scales), int(zero_points))
                else:
                    weight = torch._make_per_channel_quantized_tensor(values, scales, zero_points, 0)
            elif f"{name}.weight_fp16" in tensors:
                weight = tensors[f"{name}.weight_fp16"].to(torch.float32)
            else:
                raise QuantizationError(f"saved model lacks the quantized weights of {name!r}")
            module.set_weight_bias(weight, bias)

    def owns(self, key: str) -> bool:
        """Whether a state-dict key belongs to the packed weights this backend exports itself."""
        return "._packed_params." in key or key.endswith(("._packed_params", ".scale", ".zero_point"))

    def save(
        self,
        float_model: nn.Module,
        report: QuantReport,
        out_dir: Path,
        *,
        example_input: torch.Tensor | None = None,
        qmodel: nn.Module | None = None,
        calibration: torch.Tensor | None = None,
    ) -> QuantReport:
        """The state dict as deployed: packed weights exported as int8 + scales (or float16), the rest as is."""
        from safetensors.torch import save_file

        if qmodel is None:
            qmodel = self.quantize(float_model, report.layers)
        tensors = {
            k: v.detach().cpu().contiguous()
            for k, v in qmodel.state_dict().items()
            if isinstance(v, torch.Tensor) and not self.owns(k)
        }
        tensors.update(self.export_tensors(qmodel))
        save_file(tensors, str(Path(out_dir) / self.deployed_file), metadata={"format": "pt"})
        return report

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> nn.Module:
        """Rebuild the float structure, quantize it the same way, and load the deployed tensors into it."""
        from safetensors.torch import load_file

        model = self.quantize(rebuild(), report.layers)
        tensors = load_file(str(Path(out_dir) / self.deployed_file))
        state = model.state_dict()
        missing = [k for k in state if k not in tensors and not self.owns(k)]
        if missing:
            raise ValueError(f"artifact {out_dir} lacks tensors for {missing[:5]}")
        state.update({k: v for k, v in tensors.items() if k in state})  # keeps the versions metadata
        model.load_state_dict(state)
        self.import_tensors(model, tensors)
        return model.eval()


class OnnxRuntimeDynamicBackend:
    """ONNX Runtime's dynamic int8 quantization of the exported float model; ONNX Runtime runs it.

    The float model is exported with :func:`tools.deploy.onnxruntime.export_onnx` (TorchScript exporter),
    preprocessed, and quantized by ``quantize_dynamic`` (int8 symmetric per-channel weights, uint8
    activations quantized per call). Layers are selected by value: every selected ``nn.Linear`` is
    matched to the MatMul/Gemm nodes that apply its weight. When the selection is every Linear at
    qint8 (``layer: all``), every MatMul/Gemm with a constant weight is quantized, as ONNX Runtime's
    own baseline does. float16 is not offered: such layers stay float32 (noted in the report).
    """

    name = "onnxruntime"
    deployed_file = "model.onnx"
    #: Export ViT-style attention as ONNX Runtime's fused Attention operator (:mod:`tools.deploy.fusion`).
    fuse = False

    @staticmethod
    def available() -> bool:
        return all(importlib.util.find_spec(mod) is not None for mod in ("onnx", "onnxruntime"))

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        half = sorted(name for name, dtype in targets.items() if dtype == "float16")
        notes = []
        if half:
            shown = ", ".join(half[:3]) + (f" and {len(half) - 3} more" if len(half) > 3 else "")
            notes.append(
                f"the onnxruntime backend quantizes to int8 only: {len(half)} layer(s) asked for float16 "
                f"stay float32 ({shown}); use --quant-backend torch-ao-dynamic for float16"
            )
        return {name: dtype for name, dtype in targets.items() if dtype == "qint8"}, notes

    def save(
        self,
        float_model: nn.Module,
        report: QuantReport,
        out_dir: Path,
        *,
        example_input: torch.Tensor | None = None,
        qmodel: nn.Module | None = None,
        calibration: torch.Tensor | None = None,
    ) -> QuantReport:
        import shutil

        from tools.deploy import onnx_graph as graphs
        from tools.deploy.onnxruntime import export_onnx, preprocess_onnx, quantize_onnx

        if example_input is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to export the model to ONNX")
        if qmodel is not None:
            raise QuantizationError(f"the {self.name} backend quantizes the float model itself: pass no qmodel")
        out_dir = Path(out_dir)
        target = out_dir / self.deployed_file
        exported, op_types, notes = float_model, graphs.QUANTIZED_OP_TYPES, list(report.notes)
        if self.fuse:
            from tools.deploy.fusion import AttentionFusionError, NothingToFuse, fuse_attention

            try:
                exported, count = fuse_attention(float_model, example_input[:1])
            except NothingToFuse as exc:
                raise BackendNotApplicable(str(exc)) from exc
            except AttentionFusionError as exc:
                raise QuantizationError(str(exc)) from exc
            op_types = (*op_types, *graphs.CONTRIB_OP_TYPES)
            notes.append(f"{self.name}: {count} attention module(s) exported as one fused Attention node each")
        with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=out_dir) as work:
            fp32 = export_onnx(exported, example_input[:1], Path(work) / "float.onnx")
            graph = preprocess_onnx(fp32, Path(work) / "preprocessed.onnx")
            packed = graphs.packed_attention_nodes(graph, exported) if self.fuse else {}
            nodes = graphs.linear_nodes(graph, exported) | packed
            selected = {name: nodes.get(name, []) for name in report.layers}
            if graph == fp32:
                notes.append("onnxruntime: quant_pre_process failed on this graph: the raw export was quantized")
            unmapped = sorted(name for name, found in selected.items() if not found)
            if unmapped:
                notes.append(f"onnxruntime: no MatMul/Gemm node applies {', '.join(unmapped[:3])}: left in float32")
            chosen = sorted({node for found in selected.values() for node in found})
            if not chosen:
                shutil.copyfile(graph, target)  # nothing to quantize: the float graph is deployed
                notes.append("onnxruntime: no MatMul/Gemm node to quantize: the FP32 graph is deployed")
            else:
                every = set(report.layers) == set(nodes) and not unmapped
                quantize_onnx(
                    graph, target, preprocess=False, op_types=op_types, nodes_to_quantize=None if every else chosen
                )
        # a quantized node is renamed (<name>_quant) and re-typed (MatMulInteger, QAttention, ...)
        still_float = set(graphs.weighted_nodes(target)) | set(graphs.attention_nodes(target))
        layers = {
            name: report.layers[name] for name, found in selected.items() if found and not still_float & set(found)
        }
        missed = sorted(name for name, found in selected.items() if found and name not in layers)
        if missed:
            notes.append(f"onnxruntime did not quantize {', '.join(missed[:3])}: left in float32")
        return report.model_copy(update={"layers": layers, "notes": notes})

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        from tools.deploy.onnxruntime import OrtModel

        return OrtModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads(), fixed_batch=True)


class OnnxRuntimeFusedBackend(OnnxRuntimeDynamicBackend):
    """:class:`OnnxRuntimeDynamicBackend` with every ViT-style attention exported as one fused ``Attention`` node
    (Q/K/V packed; int8 ``QAttention`` after quantization): far fewer nodes per layer, which is where small
    transformers spend their time in ONNX Runtime. Models without such attention cannot use it (a clear error)."""

    name = "onnxruntime-fused"
    fuse = True


class OpenVinoBackend:
    """OpenVINO deploys the model: as FP32 IR (``openvino``), or int8 by NNCF post-training quantization
    calibrated on the calibration images (``openvino-int8``; transformer preset for attention models).

    The artifact is ``model.xml`` (``deployed_file``) plus its weights, ``model.bin``; it loads back as a
    :class:`tools.deploy.openvino.OpenVinoModel` (CPU, ``torch.get_num_threads()`` threads). NNCF picks
    the layers itself: every Conv/MatMul its patterns select becomes int8, whatever the plan selects;
    the saved report lists the layers whose weights are int8 in the IR.
    """

    deployed_file = "model.xml"
    weights_file = "model.bin"

    def __init__(self, *, int8: bool) -> None:
        self.int8 = int8
        self.name = "openvino-int8" if int8 else "openvino"

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("openvino", "nncf")[: 2 if self.int8 else 1])

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        if not self.int8:
            return {}, ["the openvino backend deploys FP32 IR: no layer is quantized"] if targets else []
        notes = [
            "openvino-int8 quantizes every Conv2d/MatMul NNCF selects, not only the plan's Linear layers "
            "(int8 weights and activations); the layers of float16 requests become int8 too where NNCF selects them"
        ]
        return {name: dtype for name, dtype in targets.items() if dtype == "qint8"}, notes

    def save(
        self,
        float_model: nn.Module,
        report: QuantReport,
        out_dir: Path,
        *,
        example_input: torch.Tensor | None = None,
        qmodel: nn.Module | None = None,
        calibration: torch.Tensor | None = None,
    ) -> QuantReport:
        from tools.deploy.openvino import deploy_openvino

        if qmodel is not None:
            raise QuantizationError(f"the {self.name} backend converts the float model itself: pass no qmodel")
        if self.int8 and calibration is None:
            raise QuantizationError("the openvino-int8 backend needs calibration images (calibration=, N x C x H x W)")
        example = example_input if example_input is not None else calibration
        if example is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to convert the model")
        xml, images = Path(out_dir) / self.deployed_file, calibration
        int8, unnamed = deploy_openvino(float_model, xml, example_input=example[:1], calibration=images, int8=self.int8)
        if not self.int8:
            return report.model_copy(update={"layers": {}})
        left = sorted(set(report.layers) - set(int8))
        notes = list(report.notes) + [f"openvino-int8: NNCF left {', '.join(left[:3])} in float"] * bool(left)
        notes += [f"openvino-int8: {unnamed} more int8 node(s) the conversion left unnamed"] * bool(unnamed)
        layers: dict[str, QuantDType] = {name: "qint8" for name in int8}
        return report.model_copy(update={"layers": layers, "notes": notes})

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        from tools.deploy.openvino import OpenVinoModel

        return OpenVinoModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads())


class OnnxRuntimeBackend:
    """ONNX Runtime deploys the model as ``model.onnx``, loaded back as an :class:`tools.deploy.onnxruntime.OrtModel`:
    FP32 (``onnxruntime-fp32``: the export, optimized offline by ONNX Runtime), or static int8 (``onnxruntime-static``:
    QDQ, activations calibrated on the calibration images, :func:`tools.deploy.onnxruntime.static_quantize_onnx`).

    Static int8 quantizes the operators ONNX Runtime selects (every Conv/MatMul/Gemm with a constant weight; in
    convolutional graphs Add and pooling too), whatever the plan selects; the saved report lists the Linear layers
    whose weights are int8 in the graph.
    """

    deployed_file = "model.onnx"
    available = staticmethod(OnnxRuntimeDynamicBackend.available)

    def __init__(self, *, static: bool) -> None:
        self.static = static
        self.name = "onnxruntime-static" if static else "onnxruntime-fp32"

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        if not self.static:
            return {}, ["the onnxruntime-fp32 backend deploys the float model: nothing is quantized"] * bool(targets)
        notes = [
            "onnxruntime-static quantizes the operators ONNX Runtime selects (every Conv/MatMul/Gemm with a constant "
            "weight; Add and pooling too in convolutional graphs), not only the plan's Linear layers"
        ]
        return {name: dtype for name, dtype in targets.items() if dtype == "qint8"}, notes

    def save(
        self,
        float_model: nn.Module,
        report: QuantReport,
        out_dir: Path,
        *,
        example_input: torch.Tensor | None = None,
        qmodel: nn.Module | None = None,
        calibration: torch.Tensor | None = None,
    ) -> QuantReport:
        from tools.deploy import onnx_graph as graphs
        from tools.deploy import onnxruntime as ortd

        if qmodel is not None:
            raise QuantizationError(f"the {self.name} backend exports the float model itself: pass no qmodel")
        if self.static and (calibration is None or len(calibration) == 0):
            raise QuantizationError("the onnxruntime-static backend needs calibration images (calibration=, NCHW)")
        example = example_input if example_input is not None else calibration
        if example is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to export the model to ONNX")
        target = Path(out_dir) / self.deployed_file
        if calibration is None or not self.static:
            notes = list(report.notes)
            ortd.export_fp32_onnx(float_model, example[:1], target, notes=notes)
            return report.model_copy(update={"layers": {}, "notes": notes})
        with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=out_dir) as work:
            fp32 = ortd.export_onnx(float_model, example[:1], Path(work) / "float.onnx")
            applied = {name for name, found in graphs.linear_nodes(fp32, float_model).items() if found}
            ortd.static_quantize_onnx(fp32, target, calibration)
        still_float = {name for name, found in graphs.linear_nodes(target, float_model).items() if found}
        layers: dict[str, QuantDType] = {name: "qint8" for name in sorted(applied - still_float)}
        counts = ", ".join(f"{n} {op}" for op, n in sorted(graphs.quantized_op_counts(target).items())) or "no node"
        left = sorted(set(report.layers) - set(layers))
        notes = [*report.notes, f"onnxruntime-static: int8 {counts}; calibrated on {len(calibration)} images"]
        notes += [f"onnxruntime-static left {', '.join(left[:3])} in float32"] * bool(left)
        return report.model_copy(update={"layers": layers, "notes": notes})

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        from tools.deploy.onnxruntime import OrtModel

        return OrtModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads(), fixed_batch=True)


QUANTIZATION_BACKENDS: dict[str, QuantizationBackend] = {
    "torch-ao-dynamic": TorchAODynamicBackend(),
    "onnxruntime": OnnxRuntimeDynamicBackend(),
    "onnxruntime-fused": OnnxRuntimeFusedBackend(),
    "onnxruntime-fp32": OnnxRuntimeBackend(static=False),
    "onnxruntime-static": OnnxRuntimeBackend(static=True),
    "openvino": OpenVinoBackend(int8=False),
    "openvino-int8": OpenVinoBackend(int8=True),
}
DEFAULT_BACKEND = "torch-ao-dynamic"
AUTO = "auto"
BACKEND_CHOICES = (*QUANTIZATION_BACKENDS, AUTO)
#: What ``--deploy`` takes: ``auto`` (the measured choice), ``torch`` (the float model as it is), or one backend.
DEPLOY_FLOAT = "torch"
DEPLOY_CHOICES = (AUTO, DEPLOY_FLOAT, *QUANTIZATION_BACKENDS)


def resolve_backend_name(name: str) -> str:
    """``auto`` -> ``onnxruntime`` where onnx and onnxruntime import, else the default; other names as given."""
    if name != AUTO:
        return name
    return "onnxruntime" if OnnxRuntimeDynamicBackend.available() else DEFAULT_BACKEND


def get_backend(name: str = DEFAULT_BACKEND) -> QuantizationBackend:
    try:
        return QUANTIZATION_BACKENDS[resolve_backend_name(name)]
    except KeyError:
        raise QuantizationError(
            f"unknown quantization backend {name!r}: choose one of {', '.join(BACKEND_CHOICES)}"
        ) from None


def plan_quantization(
    model: nn.Module, recommendations: Iterable[QuantizationRecommendation], *, backend: str = DEFAULT_BACKEND
) -> QuantReport:
    """What ``backend`` will quantize in ``model``: the selected nn.Linear layers it supports, and why not others."""
    impl = get_backend(backend)
    targets, unmatched = resolve_targets(model, recommendations)
    layers, notes = impl.supported(targets)
    if not targets:
        logger.warning("no nn.Linear selected for quantization; the model is left in float32")
        notes = [*notes, "no nn.Linear layer was selected for int8: this backend's model keeps float32 weights"]
    return QuantReport(backend=impl.name, layers=layers, unmatched=unmatched, notes=notes)


def quantize(
    model: nn.Module, recommendations: Iterable[QuantizationRecommendation], *, backend: str = DEFAULT_BACKEND
) -> tuple[nn.Module, QuantReport]:
    """Return a dynamically quantized copy of ``model`` (on the CPU) and what was quantized.

    In memory, so for torch backends only; ``onnxruntime`` quantizes while saving
    (:func:`tools.ops.quantize`, or :func:`tools.store.artifacts.save_quantized`).
    """
    impl = get_backend(backend)
    if not isinstance(impl, ModuleBackend):
        raise QuantizationError(
            f"the {impl.name} backend quantizes into an artifact, not in memory: use tools.ops.quantize"
        )
    report = plan_quantization(model, recommendations, backend=impl.name)
    qmodel = impl.quantize(model, report.layers)
    logger.info("quantized %d layers with %s", len(report.layers), impl.name)
    return qmodel, report
