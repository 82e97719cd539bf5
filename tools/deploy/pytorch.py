"""PyTorch as the deployment runtime: the float model as it is, and ``torch.ao`` dynamic int8.

* ``torch`` (:class:`FloatModel`) -- the float model, deployed as it is (``model.safetensors`` of the pruned or
  original artifact): the fallback of the measured choice and the reference every candidate must beat. It
  builds no artifact of its own, so it is described here but is no backend.
* ``torch-ao-dynamic`` (:class:`TorchAODynamicBackend`) -- ``torch.ao.quantization.quantize_dynamic`` of the
  selected ``nn.Linear`` layers; deployed as ``model.safetensors`` (int8 values plus scales, no pickle) and
  loaded back as an ``nn.Module``. Being an in-memory torch backend (:class:`tools.deploy.base.ModuleBackend`),
  it also serves :func:`tools.deploy.registry.quantize`, which returns the quantized module itself.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.deploy.base import PRECISION_FP32, Build, QuantizationError, QuantReport, Runtime
from tools.schemas import QuantDType

#: The float model's name: ``--deploy torch``, and the FP32 reference of the PyTorch backends.
FLOAT = "torch"


class FloatModel:
    """The float PyTorch model as it is (FP32): described like a backend, but it builds nothing."""

    name = FLOAT
    runtime: Runtime = "pytorch"
    precision = PRECISION_FP32
    float_reference = FLOAT
    requires: tuple[str, ...] = ()
    cpu_dependent_int8 = False
    mixed_of: str | None = None
    timed_as = FLOAT

    def timing_build(
        self, model: nn.Module, example: torch.Tensor, directory: Path, calibration: torch.Tensor
    ) -> Callable[[torch.Tensor], Any]:
        """The module itself (``tools.deploy.base.TimingBuild``)."""
        return model.eval()


#: ``self.<child>.weight`` (or ``.bias``) in a ``forward``'s source: a parent that reads a child's parameters itself.
_CHILD_PARAMETER = re.compile(r"\bself\.([A-Za-z_]\w*)\.(?:weight|bias)\b")


@functools.lru_cache(maxsize=256)
def _children_read_by(forward: Callable[..., Any]) -> frozenset[str]:
    """The attribute names whose ``.weight`` or ``.bias`` a module's ``forward`` reads itself (empty where its source
    is not available: a builtin, or code made at run time)."""
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(_CHILD_PARAMETER.findall(source))


def linears_read_by_parent(model: nn.Module) -> dict[str, str]:
    """The ``nn.Linear`` layers whose parent module's ``forward`` reads their weight or bias directly (layer ->
    why): torchvision's Swin computes its attention as ``F.linear(x, self.qkv.weight, ...)``, where a dynamically
    quantized Linear's ``weight`` is a method, so swapping such a layer breaks the model's forward."""
    found: dict[str, str] = {}
    for parent_name, parent in model.named_modules():
        read = _children_read_by(type(parent).forward)
        for child_name, child in parent.named_children():
            if child_name in read and type(child) is nn.Linear:
                name = f"{parent_name}.{child_name}" if parent_name else child_name
                found[name] = (
                    f"{type(parent).__name__}.forward reads self.{child_name}.weight itself (as F.linear does), "
                    "which a dynamically quantized Linear does not hold as a tensor"
                )
    return found


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
    runtime: Runtime = "pytorch"
    precision = "int8 dynamic (Linear)"
    float_reference = FLOAT
    timed_as = FLOAT
    requires: tuple[str, ...] = ()
    cpu_dependent_int8 = False
    mixed_of: str | None = None
    deployed_file = "model.safetensors"
    layer_kinds: tuple[type[nn.Module], ...] = (nn.Linear,)
    _suffixes = ("weight_int8", "weight_scale", "weight_zero_point", "weight_fp16", "bias")

    def supported(self, targets: dict[str, QuantDType]) -> tuple[dict[str, QuantDType], list[str]]:
        return {name: dtype for name, dtype in targets.items() if dtype != "float32"}, []

    def kept_float(self, model: nn.Module, targets: dict[str, QuantDType]) -> dict[str, str]:
        """The targets whose parent reads their weight itself (:func:`linears_read_by_parent`): swapped for a
        dynamically quantized Linear, the parent's forward would fail."""
        return {name: why for name, why in linears_read_by_parent(model).items() if name in targets}

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

    def save(self, build: Build) -> QuantReport:
        """The state dict as deployed: packed weights exported as int8 + scales (or float16), the rest as is."""
        qmodel = build.qmodel
        from safetensors.torch import save_file

        if qmodel is None:
            qmodel = self.quantize(build.float_model, build.report.layers)
        tensors = {
            k: v.detach().cpu().contiguous()
            for k, v in qmodel.state_dict().items()
            if isinstance(v, torch.Tensor) and not self.owns(k)
        }
        tensors.update(self.export_tensors(qmodel))
        save_file(tensors, str(Path(build.out_dir) / self.deployed_file), metadata={"format": "pt"})
        return build.report

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


__all__ = ["FLOAT", "FloatModel", "TorchAODynamicBackend", "linears_read_by_parent"]
