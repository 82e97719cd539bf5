"""The OpenVINO backends: the float model converted to OpenVINO IR, FP32 or NNCF int8, and run by OpenVINO."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tools.deploy.base import QuantizationError, QuantizedModel, QuantReport, Runtime
from tools.deploy.openvino.convert import BIN_FILENAME, XML_FILENAME
from tools.deploy.openvino.model import OpenVinoModel
from tools.deploy.openvino.quantize import deploy_openvino
from tools.schemas import QuantDType

#: The FP32 backend of OpenVINO: the reference its int8 backend is compared with.
FP32 = "openvino"


class OpenVinoBackend:
    """OpenVINO deploys the model: as FP32 IR (``openvino``), or int8 by NNCF post-training quantization
    calibrated on the calibration images (``openvino-int8``; transformer preset for attention models).

    The artifact is ``model.xml`` (``deployed_file``) plus its weights, ``model.bin`` (``weights_file``); it loads
    back as an :class:`OpenVinoModel` (CPU, ``torch.get_num_threads()`` threads). NNCF picks the layers itself:
    every Conv/MatMul its patterns select becomes int8, whatever the plan selects; the saved report lists the
    layers whose weights are int8 in the IR.
    """

    runtime: Runtime = "openvino"
    float_reference = FP32
    deployed_file = XML_FILENAME
    weights_file = BIN_FILENAME

    def __init__(self, *, int8: bool) -> None:
        self.int8 = int8
        self.name = "openvino-int8" if int8 else FP32
        self.precision = "int8 static (NNCF)" if int8 else "fp32"
        self.requires: tuple[str, ...] = ("openvino", "nncf") if int8 else ("openvino",)

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
        return OpenVinoModel(Path(out_dir) / self.deployed_file, threads=torch.get_num_threads())


__all__ = ["FP32", "OpenVinoBackend"]
