"""An OpenVINO IR compiled for the CPU and used like a classifier (:class:`OpenVinoModel`).

``openvino`` is imported when a model is opened.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from tools.deploy.openvino.convert import OpenVinoError, openvino_module
from tools.text import first_line

logger = logging.getLogger(__name__)

_CORE: Any = None


def core() -> Any:
    """The process's one ``openvino.Core`` (created on first use)."""
    global _CORE
    if _CORE is None:
        ov = openvino_module()

        _CORE = ov.Core()
    return _CORE


class OpenVinoModel:
    """An OpenVINO IR compiled for the CPU, used like a classifier: ``model(pixel_values) -> logits`` (torch).

    ``threads`` (``INFERENCE_NUM_THREADS``) defaults to ``torch.get_num_threads()`` so OpenVINO and torch
    compete on equal terms; ``PERFORMANCE_HINT`` LATENCY (one stream). ``precision`` is the
    ``INFERENCE_PRECISION_HINT`` (default ``f32``: float parts run in float32 even on CPUs where
    OpenVINO would pick bf16 by itself; None leaves the CPU plugin's choice). Threads are not pinned
    to cores (``ENABLE_CPU_PINNING`` off): on a shared machine a pinned thread cannot move away from a
    busy core.

    The IR has a dynamic batch axis; a static-shape copy is compiled for each batch size seen (static
    shapes run faster: Swin-tiny on CIFAR 2.4 ms vs 3.7 ms at batch 1), and the ``max_compiled``
    most recent ones are kept with their infer request, reused call after call. Batch 1 is compiled
    on construction. Not an ``nn.Module``: the input is converted to a float32 CPU array here.
    """

    max_compiled = 4

    def __init__(self, path: Path | str, *, threads: int | None = None, precision: str | None = "f32") -> None:
        ov = openvino_module()

        self.path = Path(path)
        if not self.path.is_file() or not self.path.with_suffix(".bin").is_file():
            raise OpenVinoError(f"{self.path} (and its .bin) does not exist: export the model first")
        self.threads = int(threads) if threads and threads > 0 else torch.get_num_threads()
        self.precision = precision
        try:
            self.model = core().read_model(str(self.path))
        except Exception as exc:
            raise OpenVinoError(f"cannot read {self.path} with OpenVINO: {first_line(exc)}") from exc
        if len(self.model.inputs) != 1:
            raise OpenVinoError(f"{self.path} has {len(self.model.inputs)} inputs: expected one (pixel_values)")
        self._requests: OrderedDict[int, Any] = OrderedDict()
        self._dynamic: Any = None
        self._tensor = ov.Tensor
        self._request(1)

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "INFERENCE_NUM_THREADS": self.threads,
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,
        }
        if self.precision:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        return config

    def _compile(self, model: Any) -> Any:
        try:
            return core().compile_model(model, "CPU", self.config).create_infer_request()
        except Exception as exc:
            raise OpenVinoError(f"OpenVINO cannot compile {self.path} for the CPU: {first_line(exc)}") from exc

    def _request(self, batch: int) -> Any:
        """The infer request of a static-shape copy for ``batch`` (the dynamic model where reshaping fails)."""
        request = self._requests.get(batch)
        if request is not None:
            self._requests.move_to_end(batch)
            return request
        static = self.model.clone()
        shape = list(self.model.inputs[0].get_partial_shape())
        try:
            static.reshape({0: [batch, *(int(d.get_length()) for d in shape[1:])]})
        except Exception as exc:
            logger.warning(
                "%s does not reshape to batch %d (%s): running it with a dynamic batch", self.path, batch, exc
            )
            if self._dynamic is None:
                self._dynamic = self._compile(self.model)
            return self._dynamic
        request = self._compile(static)
        self._requests[batch] = request
        while len(self._requests) > self.max_compiled:
            self._requests.popitem(last=False)
        return request

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # The input is shared with OpenVINO, not copied (on a tiny model the copies and the dict ``infer``
        # builds cost a third of the call); the output buffer is the request's, reused: copied out.
        array = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        request = self._request(int(array.shape[0]))
        request.set_input_tensor(self._tensor(array, shared_memory=True))
        request.infer()
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    def __repr__(self) -> str:
        return f"OpenVinoModel({str(self.path)!r}, threads={self.threads})"


__all__: list[str] = ["OpenVinoModel", "core"]
