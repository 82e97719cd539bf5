"""The ONNX Runtime backends: the float model exported to ONNX, quantized or not, and run by ONNX Runtime.

* ``onnxruntime`` (:class:`OnnxRuntimeDynamicBackend`) -- ONNX Runtime's ``quantize_dynamic`` of the export (int8
  MatMul/Gemm weights); ``onnxruntime-fused`` (:class:`OnnxRuntimeFusedBackend`) the same with each ViT-style
  attention exported as one fused node;
* ``onnxruntime-fp32`` and ``onnxruntime-static`` (:class:`OnnxRuntimeBackend`) -- the export optimized offline,
  as FP32 or as static int8 (QDQ) calibrated on images.

Each deploys ``model.onnx`` (protobuf, loads without unpickling) and loads back as an :class:`OrtModel`, a
callable that is not an ``nn.Module``: ONNX Runtime is then the deployment runtime.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tools.compression.mha import split_layer_names
from tools.deploy.base import (
    PRECISION_FP32,
    WEIGHTED_MODULES,
    BackendNotApplicable,
    Build,
    QuantizationError,
    QuantizedModel,
    QuantReport,
    Runtime,
)
from tools.deploy.cpu import Int8Settings, int8_settings
from tools.deploy.onnxruntime import graph as graphs
from tools.deploy.onnxruntime.export import export_fp32_onnx, export_onnx, preprocess_onnx
from tools.deploy.onnxruntime.fusion import AttentionFusionError, NothingToFuse, fuse_attention
from tools.deploy.onnxruntime.outliers import without_outlier_images
from tools.deploy.onnxruntime.quantize import quantize_onnx, static_quantize_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.schemas import QuantDType
from tools.text import listing

#: The FP32 backend of ONNX Runtime: the reference its int8 backends are compared with.
FP32 = "onnxruntime-fp32"
#: The Python modules every ONNX Runtime backend needs.
REQUIRES: tuple[str, ...] = ("onnx", "onnxruntime")


def _int8_only(backend: str, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
    """The qint8 targets; float32 ones stay float as asked, float16 ones too (with a note: no float16 here)."""
    half = sorted(name for name, dtype in targets.items() if dtype == "float16")
    notes = []
    if half:
        shown = listing(half, 3)
        notes.append(
            f"the {backend} backend quantizes to int8 only: {len(half)} layer(s) asked for float16 "
            f"stay float32 ({shown}); use --deploy torch-ao-dynamic for float16"
        )
    return {name: dtype for name, dtype in targets.items() if dtype == "qint8"}, notes


class OnnxRuntimeDynamicBackend:
    """ONNX Runtime's dynamic int8 quantization of the exported float model; ONNX Runtime runs it.

    The float model is exported with :func:`~tools.deploy.onnxruntime.export.export_onnx` (TorchScript exporter),
    preprocessed, and quantized by ``quantize_dynamic`` (int8 symmetric per-channel weights, uint8
    activations quantized per call). Layers are selected by value: every selected ``nn.Linear`` is
    matched to the MatMul/Gemm nodes that apply its weight. When the selection is every Linear at
    qint8 (``layer: all``), every MatMul/Gemm with a constant weight is quantized, as ONNX Runtime's
    own baseline does. float16 is not offered: such layers stay float32 (noted in the report).
    """

    name = "onnxruntime"
    runtime: Runtime = "onnxruntime"
    precision = "int8 dynamic (MatMul/Gemm)"
    float_reference = FP32
    #: Timed as ONNX Runtime's FP32: the latency objective measures what channels and blocks save, where a dynamic
    #: build's int8 MatMuls follow the float graph's shapes.
    timed_as = FP32
    requires = REQUIRES
    cpu_dependent_int8 = True
    mixed_of: str | None = None
    deployed_file = "model.onnx"
    layer_kinds: tuple[type[nn.Module], ...] = (nn.Linear,)
    #: Export ViT-style attention as ONNX Runtime's fused Attention operator (:mod:`tools.deploy.onnxruntime.fusion`).
    fuse = False

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        return _int8_only(self.name, targets)

    def save(self, build: Build) -> QuantReport:
        out_dir = build.out_dir
        if build.example_input is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to export the model to ONNX")
        if build.qmodel is not None:
            raise QuantizationError(f"the {self.name} backend quantizes the float model itself: pass no qmodel")
        out_dir = Path(out_dir)
        target = out_dir / self.deployed_file
        settings = build.report.int8 or int8_settings()
        exported, op_types, notes = build.float_model, graphs.QUANTIZED_OP_TYPES, list(build.report.notes)
        wanted = dict(build.report.layers)
        if self.fuse:
            try:
                exported, count = fuse_attention(build.float_model, build.example_input[:1])
            except NothingToFuse as exc:
                raise BackendNotApplicable(str(exc)) from exc
            except AttentionFusionError as exc:
                raise QuantizationError(str(exc)) from exc
            op_types = (*op_types, *graphs.CONTRIB_OP_TYPES)
            notes.append(f"{self.name}: {count} attention module(s) exported as one fused Attention node each")
            wanted = split_layer_names(
                build.report.layers, build.float_model
            )  # the fused copy's nn.MultiheadAttention is split
        with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=out_dir) as work:
            fp32 = export_onnx(exported, build.example_input[:1], Path(work) / "float.onnx")
            graph = preprocess_onnx(fp32, Path(work) / "preprocessed.onnx")
            packed = graphs.packed_attention_nodes(graph, exported) if self.fuse else {}
            nodes = graphs.linear_nodes(graph, exported) | packed
            selected = {name: nodes.get(name, []) for name in wanted}
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
                every = set(wanted) == set(nodes) and not unmapped
                quantize_onnx(
                    graph,
                    target,
                    preprocess=False,
                    op_types=op_types,
                    nodes_to_quantize=None if every else chosen,
                    per_channel=settings.per_channel,
                    reduce_range=settings.reduce_range,
                )
        # a quantized node is renamed (<name>_quant) and re-typed (MatMulInteger, QAttention, ...)
        still_float = set(graphs.weighted_nodes(target)) | set(graphs.attention_nodes(target))
        layers = {name: wanted[name] for name, found in selected.items() if found and not still_float & set(found)}
        missed = sorted(name for name, found in selected.items() if found and name not in layers)
        if missed:
            notes.append(f"onnxruntime did not quantize {', '.join(missed[:3])}: left in float32")
        return build.report.model_copy(update={"layers": layers, "notes": notes, "int8": settings})

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        return OrtModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads(), fixed_batch=True)


class OnnxRuntimeFusedBackend(OnnxRuntimeDynamicBackend):
    """:class:`OnnxRuntimeDynamicBackend` with every ViT-style attention exported as one fused ``Attention`` node
    (Q/K/V packed; int8 ``QAttention`` after quantization): far fewer nodes per layer, which is where small
    transformers spend their time in ONNX Runtime. Models without such attention cannot use it (a clear error)."""

    name = "onnxruntime-fused"
    precision = "int8 dynamic, fused attention (QAttention)"
    fuse = True


class OnnxRuntimeBackend:
    """ONNX Runtime deploys the model as ``model.onnx``, loaded back as an :class:`OrtModel`: FP32
    (``onnxruntime-fp32``: the export, optimized offline by ONNX Runtime), or static int8 (``onnxruntime-static``:
    QDQ, activations calibrated on the calibration images, :func:`static_quantize_onnx`).

    Static int8 quantizes the Conv/MatMul/Gemm operators with a constant weight of the layers the plan selects (``all``:
    every one; in convolutional graphs Add and pooling too) and leaves the others in float (``float32`` in the plan:
    mixed precision); the saved report lists the layers whose weights are int8 in the graph. The int8 settings
    (7-bit weights where the CPU kind needs them) are the report's ``int8`` (:mod:`tools.deploy.cpu`).
    """

    runtime: Runtime = "onnxruntime"
    float_reference = FP32
    requires = REQUIRES
    deployed_file = "model.onnx"

    def __init__(self, *, static: bool) -> None:
        self.static = static
        self.name = "onnxruntime-static" if static else FP32
        self.precision = "int8 static (QDQ)" if static else PRECISION_FP32
        self.cpu_dependent_int8 = static
        self.layer_kinds = WEIGHTED_MODULES
        self.mixed_of: str | None = None
        self.timed_as = self.name

    def timing_build(
        self, model: nn.Module, example: torch.Tensor, directory: Path, calibration: torch.Tensor
    ) -> QuantizedModel:
        """This backend's kernels for timing (``tools.deploy.base.TimingBuild``): the exported FP32 graph, or its
        static int8 QDQ build calibrated on ``calibration`` (ranges kept with the build: no other shares its graph)."""
        path = export_onnx(model.eval(), example[:1], directory / "m.onnx")
        if self.static:
            path = static_quantize_onnx(
                path, directory / "m-int8.onnx", calibration, calibration_cache=directory / "r.json"
            )
        return OrtModel(path, threads=torch.get_num_threads())

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        if not self.static:
            return {}, ["the onnxruntime-fp32 backend deploys the float model: nothing is quantized"] * bool(targets)
        return _int8_only(self.name, targets)

    def save(self, build: Build) -> QuantReport:
        if build.qmodel is not None:
            raise QuantizationError(f"the {self.name} backend exports the float model itself: pass no qmodel")
        if self.static and (build.calibration is None or len(build.calibration) == 0):
            raise QuantizationError("the onnxruntime-static backend needs calibration images (calibration=, NCHW)")
        example = build.example_input if build.example_input is not None else build.calibration
        if example is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to export the model to ONNX")
        target = Path(build.out_dir) / self.deployed_file
        if build.calibration is None or not self.static:
            notes = list(build.report.notes)
            export_fp32_onnx(build.float_model, example[:1], target, notes=notes)
            return build.report.model_copy(update={"layers": {}, "notes": notes})
        settings = build.report.int8 or int8_settings()
        calibration, outlier_notes = without_outlier_images(build.float_model, build.calibration)
        with tempfile.TemporaryDirectory(prefix=".onnx-export-", dir=build.out_dir) as work:
            fp32 = export_onnx(build.float_model, example[:1], Path(work) / "float.onnx")
            graph = preprocess_onnx(fp32, Path(work) / "preprocessed.onnx")
            nodes = graphs.module_nodes(graph, build.float_model)
            keep_float = [name for name, found in nodes.items() if found and name not in build.report.layers]
            static_quantize_onnx(
                graph,
                target,
                calibration,
                preprocess=False,
                per_channel=settings.per_channel,
                reduce_range=settings.reduce_range,
                nodes_to_exclude=[node for name in keep_float for node in nodes[name]],
            )
        planned = dict.fromkeys(keep_float, "the plan keeps it in float")
        return self._carried_out(build.report, target, nodes, planned, settings, len(calibration), outlier_notes)

    def _carried_out(
        self,
        report: QuantReport,
        target: Path,
        nodes: dict[str, list[str]],
        float_layers: dict[str, str],
        settings: Int8Settings,
        images: int,
        extra: list[str] | None = None,
    ) -> QuantReport:
        """The report as built: the layers whose every node takes an int8 weight, the counts, the layers kept in
        float (``float_layers``: layer -> why) and any other that stayed float."""
        int8 = graphs.int8_weight_nodes(target)
        layers: dict[str, QuantDType] = {n: "qint8" for n, found in nodes.items() if found and set(found) <= int8}
        counts = ", ".join(f"{n} {op}" for op, n in sorted(graphs.quantized_op_counts(target).items())) or "no node"
        notes = [*report.notes, f"{self.name}: int8 {counts}; calibrated on {images} images", *(extra or [])]
        kept = dict(float_layers)
        for name, found in nodes.items():
            if found and name not in layers and name not in kept:
                kept[name] = "ONNX Runtime did not quantize it"
        if kept:
            notes.append(f"{self.name}: {len(kept)} layer(s) kept in float: {listing(list(kept))}")
        return report.model_copy(update={"layers": layers, "notes": notes, "int8": settings, "float_layers": kept})

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        return OrtModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads(), fixed_batch=True)


__all__ = ["FP32", "REQUIRES", "OnnxRuntimeBackend", "OnnxRuntimeDynamicBackend", "OnnxRuntimeFusedBackend"]
