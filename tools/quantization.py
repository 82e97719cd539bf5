"""Post-training dynamic quantization behind one verb: ``quantize(model, recommendations)``.

Backends live in a registry so that torchao (PyTorch's successor to ``torch.ao.quantization``) or
another runtime can take the place of today's default without touching callers. A backend also
knows how to export its quantized weights *as deployed* (int8 values plus scales) to plain tensors
for safetensors, and how to load them back.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch
from pydantic import BaseModel, Field
from torch import nn

from tools.schemas import QuantDType, QuantizationRecommendation

logger = logging.getLogger(__name__)


class QuantizationError(ValueError):
    """A quantization request that cannot be carried out."""


class QuantReport(BaseModel):
    backend: str
    layers: dict[str, QuantDType] = Field(default_factory=dict, description="module name -> dtype")
    unmatched: list[str] = Field(default_factory=list, description="patterns that selected no nn.Linear")


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


class QuantizationBackend(Protocol):
    name: str

    def quantize(self, model: nn.Module, targets: dict[str, QuantDType]) -> nn.Module: ...

    def export_tensors(self, qmodel: nn.Module) -> dict[str, torch.Tensor]: ...

    def import_tensors(self, qmodel: nn.Module, tensors: dict[str, torch.Tensor]) -> None: ...

    def owns(self, key: str) -> bool: ...


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
    _suffixes = ("weight_int8", "weight_scale", "weight_zero_point", "weight_fp16", "bias")

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


QUANTIZATION_BACKENDS: dict[str, QuantizationBackend] = {"torch-ao-dynamic": TorchAODynamicBackend()}
DEFAULT_BACKEND = "torch-ao-dynamic"


def get_backend(name: str = DEFAULT_BACKEND) -> QuantizationBackend:
    try:
        return QUANTIZATION_BACKENDS[name]
    except KeyError:
        raise QuantizationError(
            f"unknown quantization backend {name!r}: choose one of {', '.join(QUANTIZATION_BACKENDS)}"
        ) from None


def quantize(
    model: nn.Module, recommendations: Iterable[QuantizationRecommendation], *, backend: str = DEFAULT_BACKEND
) -> tuple[nn.Module, QuantReport]:
    """Return a dynamically quantized copy of ``model`` (on the CPU) and what was quantized."""
    impl = get_backend(backend)
    targets, unmatched = resolve_targets(model, recommendations)
    if not targets:
        logger.warning("no nn.Linear selected for quantization; the model is left in float32")
    qmodel = impl.quantize(model, targets)
    report = QuantReport(backend=impl.name, layers=targets, unmatched=unmatched)
    logger.info("quantized %d layers with %s", len(targets), impl.name)
    return qmodel, report
