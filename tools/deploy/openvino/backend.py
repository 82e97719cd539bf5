"""The OpenVINO backends: the float model converted to OpenVINO IR, run by OpenVINO in FP32, in bf16 (where the CPU
computes it natively), or as NNCF int8."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from tools.deploy.accuracy import AccuracyControl
from tools.deploy.base import (
    PRECISION_BF16,
    PRECISION_FP32,
    WEIGHTED_MODULES,
    BackendNotApplicable,
    Build,
    QuantizationError,
    QuantizedModel,
    QuantReport,
    Runtime,
)
from tools.deploy.cpu import CpuFeatures, detect_cpu, int8_settings
from tools.deploy.openvino.convert import BIN_FILENAME, XML_FILENAME
from tools.deploy.openvino.model import OpenVinoModel
from tools.deploy.openvino.quantize import (
    NNCF_CONTROL_SECONDS,
    NNCF_RANKING_IMAGES,
    NNCF_VARIANT_SECONDS,
    OPENVINO_INT8_MACS_PER_SECOND,
    deploy_openvino,
    nncf_control_plan,
)
from tools.profiling.static import weight_layer_macs
from tools.schemas import QuantDType
from tools.text import listing

logger = logging.getLogger(__name__)

#: The FP32 backend of OpenVINO: the reference its int8 backend is compared with.
FP32 = "openvino"
#: The OpenVINO property that sets the precision of the float operations (f32, bf16).
PRECISION_HINT = "INFERENCE_PRECISION_HINT"
#: The bf16 artifacts loaded on a CPU without bf16 that were already named (once per process).
_WARNED: set[str] = set()


class OpenVinoBackend:
    """OpenVINO deploys the model: as FP32 IR (``openvino``), or int8 by NNCF post-training quantization
    calibrated on the calibration images (``openvino-int8``; transformer preset for attention models).

    The artifact is ``model.xml`` (``deployed_file``) plus its weights, ``model.bin`` (``weights_file``); it loads
    back as an :class:`OpenVinoModel` (CPU, ``torch.get_num_threads()`` threads). int8 quantizes every Conv/MatMul
    NNCF's patterns select among the layers the plan quantizes (``all``: every one); the plan's ``float32`` layers
    stay in float. NNCF's overflow fix follows the report's ``int8`` settings (:mod:`tools.deploy.cpu`). The saved
    report lists the layers whose weights are int8 in the IR.
    """

    runtime: Runtime = "openvino"
    float_reference = FP32
    deployed_file = XML_FILENAME
    weights_file = BIN_FILENAME
    layer_kinds = WEIGHTED_MODULES
    #: Keep the most damaging layers in float until the accuracy budget holds (NNCF's accuracy control).
    controlled = False
    #: The precision OpenVINO computes the float operations in (the int8 ones stay int8).
    inference_precision = "f32"

    def __init__(self, *, int8: bool) -> None:
        self.int8 = int8
        self.name = "openvino-int8" if int8 else FP32
        self.precision = "int8 static (NNCF)" if int8 else PRECISION_FP32
        self.requires: tuple[str, ...] = ("openvino", "nncf") if int8 else ("openvino",)
        self.cpu_dependent_int8 = int8
        self.mixed_of: str | None = None
        self.timed_as = self.name

    def timing_build(
        self, model: nn.Module, example: torch.Tensor, directory: Path, calibration: torch.Tensor
    ) -> QuantizedModel:
        """This backend's kernels for timing (``tools.deploy.base.TimingBuild``): the FP32 IR run in
        :attr:`inference_precision`, or NNCF int8 without bias correction (its answers are not what is timed)."""
        from tools.compression.heads import has_attention
        from tools.deploy.openvino.convert import convert_openvino, export_openvino, save_openvino
        from tools.deploy.openvino.quantize import quantize_openvino

        if not self.int8:
            path = export_openvino(model.eval(), example, directory / XML_FILENAME)
            return OpenVinoModel(path, precision=self.inference_precision)
        converted = convert_openvino(model.eval(), example[:1])
        quantized = quantize_openvino(converted, calibration, transformer=has_attention(model), bias_correction=False)
        return OpenVinoModel(save_openvino(quantized, directory / XML_FILENAME))

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        if not self.int8:
            return {}, ["the openvino backend deploys FP32 IR: no layer is quantized"] if targets else []
        half = sorted(name for name, dtype in targets.items() if dtype == "float16")
        notes = [f"{self.name}: {len(half)} layer(s) asked for float16 become int8 (no float16 here)"] * bool(half)
        return {name: "qint8" for name, dtype in targets.items() if dtype != "float32"}, notes

    def save(self, build: Build) -> QuantReport:
        accuracy_control = build.accuracy_control
        if build.qmodel is not None:
            raise QuantizationError(f"the {self.name} backend converts the float model itself: pass no qmodel")
        if self.int8 and build.calibration is None:
            raise QuantizationError(f"the {self.name} backend needs calibration images (calibration=, N x C x H x W)")
        if self.controlled and accuracy_control is None:
            raise BackendNotApplicable(f"{self.name} needs labelled validation images (a dataset) to control accuracy")
        cpu = detect_cpu()
        if self.inference_precision == "bf16" and not cpu.bf16:
            raise BackendNotApplicable(
                f"{cpu.model_name} computes no bf16 natively (no AMX-BF16 or AVX512-BF16): OpenVINO would run FP32"
            )
        example = build.example_input if build.example_input is not None else build.calibration
        if example is None:
            raise QuantizationError(f"the {self.name} backend needs an example input to convert the model")
        xml = Path(build.out_dir) / self.deployed_file
        if not self.int8:
            return self._save_float(build, xml, example[:1], cpu)
        settings = build.report.int8 or int8_settings()
        weighted = [name for name, m in build.float_model.named_modules() if isinstance(m, self.layer_kinds) and name]
        if self.controlled and accuracy_control is not None:
            accuracy_control = self._planned(build.float_model, example[:1], accuracy_control, len(weighted))
        keep_float = [name for name in weighted if name not in build.report.layers]
        int8, unnamed = deploy_openvino(
            build.float_model,
            xml,
            example_input=example[:1],
            calibration=build.calibration,
            int8=True,
            settings=settings,
            keep_float=keep_float,
            accuracy_control=accuracy_control if self.controlled else None,
        )
        other = "NNCF's accuracy control or its patterns" if self.controlled else "NNCF's patterns left it in float"
        kept = {
            name: "the plan keeps it in float" if name in keep_float else other for name in weighted if name not in int8
        }
        notes = list(build.report.notes)
        if kept:
            notes.append(f"{self.name}: {len(kept)} of {len(weighted)} layer(s) in float: {listing(list(kept))}")
        notes += [f"{self.name}: {unnamed} more int8 node(s) the conversion left unnamed"] * bool(unnamed)
        layers: dict[str, QuantDType] = {name: "qint8" for name in int8}
        return build.report.model_copy(
            update={
                "layers": layers,
                "notes": notes,
                "int8": settings,
                "float_layers": kept,
                "runtime_properties": self.runtime_properties,
            }
        )

    def _save_float(self, build: Build, xml: Path, example: torch.Tensor, cpu: CpuFeatures) -> QuantReport:
        """The float model saved as IR at ``xml`` (run in :attr:`inference_precision`), and its report."""
        deploy_openvino(build.float_model, xml, example_input=example, int8=False)
        validated = [f"{self.precision} built and validated on {cpu.describe()}"] * (self.inference_precision != "f32")
        update = {
            "layers": {},
            "notes": [*build.report.notes, *validated],
            "runtime_properties": self.runtime_properties,
        }
        return build.report.model_copy(update=update)

    def _planned(
        self, float_model: nn.Module, example: torch.Tensor, control: AccuracyControl, layers: int
    ) -> AccuracyControl:
        """``control`` with the model's MACs per image, which NNCF's accuracy control is planned with
        (:func:`~tools.deploy.openvino.quantize.nncf_control_plan`); not applicable where it would take too long."""
        macs = int(sum(weight_layer_macs(float_model, example).values()))
        if nncf_control_plan(macs, layers, len(control.images), control.max_float_share) is None:
            low = NNCF_RANKING_IMAGES[0]
            seconds = layers * (NNCF_VARIANT_SECONDS + low * macs / OPENVINO_INT8_MACS_PER_SECOND)
            raise BackendNotApplicable(
                f"NNCF's accuracy control would rank {layers} layers on at least {low} images each, about "
                f"{seconds:.0f} s at {OPENVINO_INT8_MACS_PER_SECOND:.0e} MAC/s (over {2 * NNCF_CONTROL_SECONDS[0]:.0f}"
                " s): not built; onnxruntime-static-mixed ranks from the int8 profile"
            )
        return replace(control, macs_per_image=macs)

    @property
    def runtime_properties(self) -> dict[str, str]:
        """What OpenVINO must compile the IR with (saved in the report): this backend's inference precision. Without
        it OpenVINO picks bf16 on CPUs with AMX, which cost ``cifar10-swin-tiny``'s int8 IR 13 points there."""
        return {PRECISION_HINT: self.inference_precision}

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        precision = report.runtime_properties.get(PRECISION_HINT, self.inference_precision)
        return OpenVinoModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads(), precision=precision)


class OpenVinoFastBiasBackend(OpenVinoBackend):
    """``openvino-int8`` with NNCF's fast bias correction (NNCF's default) for a model without attention, beside the
    full one ``openvino-int8`` takes there: which loses less is the model's, so both are built and the budget test
    that counts every try judges them. Measured with ``benchmarks/nncf_variants.py`` on the halves of CIFAR-10's test
    split (AMD EPYC, VNNI): CIFAR ResNet-56 full -0.36 / -0.40 points, fast -0.06 / -0.16 (its int8 reserve 0.43
    points of a 1-point budget with full); CIFAR ResNet-20 full -0.10 / +0.06, fast -0.48 / +0.00; the HF
    ResNet-tiny full -0.14 / +0.16, fast -0.44 / -0.20. Attention models take the fast one in ``openvino-int8``
    already: not built for them."""

    def __init__(self) -> None:
        super().__init__(int8=True)
        self.name = "openvino-int8-fast-bias"
        self.timed_as = "openvino-int8"  # the same int8 kernels
        self.precision = "int8 static (NNCF, fast bias correction)"

    def save(self, build: Build) -> QuantReport:
        from tools.compression.heads import has_attention

        if has_attention(build.float_model):
            raise BackendNotApplicable(
                "an attention model's openvino-int8 takes NNCF's fast bias correction already: the same build"
            )
        settings = (build.report.int8 or int8_settings()).model_copy(update={"fast_bias_correction_cnn": True})
        return super().save(replace(build, report=build.report.model_copy(update={"int8": settings})))


class OpenVinoBf16Backend(OpenVinoBackend):
    """The FP32 IR run by OpenVINO in bf16 (``INFERENCE_PRECISION_HINT`` bf16: weights and activations of the
    float operations in bf16, accumulated in FP32), on CPUs that compute bf16 natively (AMX-BF16, AVX512-BF16;
    :attr:`tools.deploy.cpu.CpuFeatures.bf16`). That is what OpenVINO picks by itself on such a CPU when no
    precision is set, so it is also what a user gets from OpenVINO by default there. Elsewhere OpenVINO runs the
    hint in FP32 without a word: the backend does not apply there (nothing to gain), and an artifact built on a bf16
    CPU and loaded on another runs in FP32 (as accurate, slower), which :meth:`load` says in one line.

    Measured (``cifar10-*`` originals, 2,000 CIFAR-10 test images, Intel Xeon with AMX, 1 thread, batch 1):
    top-1 agreement with FP32 99.65-99.95 %; ViT-tiny 0.86 -> 0.59 ms, Swin-tiny 1.52 -> 1.22 ms, ResNet-tiny
    0.26 -> 0.20 ms (OpenVINO int8: 0.83, 1.58, 0.18 ms)."""

    def __init__(self) -> None:
        super().__init__(int8=False)
        self.name = "openvino-bf16"
        self.timed_as = self.name
        self.precision = PRECISION_BF16
        self.inference_precision = "bf16"

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        return {}, ["the openvino-bf16 backend runs every float operation in bf16: no layer is int8"] if targets else []

    def load(self, out_dir: Path, report: QuantReport, rebuild: Callable[[], nn.Module]) -> QuantizedModel:
        cpu = detect_cpu()
        if not cpu.bf16 and str(out_dir) not in _WARNED:
            _WARNED.add(str(out_dir))
            logger.warning(
                "%s: bf16 model loaded on %s, which computes no bf16 natively: OpenVINO runs it in FP32 here (as "
                "accurate, slower); deploy it again on this CPU for its fastest backend",
                out_dir,
                cpu.model_name,
            )
        return super().load(out_dir, report, rebuild)


class OpenVinoMixedBackend(OpenVinoBackend):
    """``openvino-int8`` with NNCF's accuracy control: while the int8 model is over the accuracy budget on the
    validation images (:class:`AccuracyControl`), the quantizers that cost the most accuracy are removed, their
    layers kept in float (:func:`nncf.quantize_with_accuracy_control`). Needs a labelled dataset."""

    controlled = True

    def __init__(self) -> None:
        super().__init__(int8=True)
        self.name = "openvino-int8-mixed"
        self.timed_as = "openvino-int8"  # mostly its int8 kernels
        self.precision = "int8 static, mixed (NNCF accuracy control)"
        self.mixed_of = "openvino-int8"


__all__ = ["FP32", "OpenVinoBackend", "OpenVinoBf16Backend", "OpenVinoMixedBackend"]
