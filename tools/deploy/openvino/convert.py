"""OpenVINO conversion: a torch classifier as an ``openvino.Model``, saved as IR (``model.xml`` + ``model.bin``).

* :func:`convert_openvino` -- a torch classifier (HF models included: only the logits are kept) as an
  ``openvino.Model`` with a dynamic batch axis and the example's fixed channels/height/width;
* :func:`save_openvino` -- an ``openvino.Model`` written as IR (``.xml`` + ``.bin``, files replaced whole);
* :func:`export_openvino` -- the two together, float32 weights.

``openvino`` is imported inside the functions that need it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tools.deploy.export_form import export_form
from tools.models.base import LogitsOnly
from tools.text import first_line

logger = logging.getLogger(__name__)

XML_FILENAME = "model.xml"
BIN_FILENAME = "model.bin"


class OpenVinoError(RuntimeError):
    """An export, quantization or compilation that cannot be carried out (one line, actionable)."""


@contextmanager
def _conversion_quiet() -> Iterator[None]:
    """Tracing warns about every Python-level shape check in HF models; they are expected here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


#: The variable OpenVINO's converter and NNCF read to decline their usage telemetry (both initialise it with
#: ``disable_in_ci``): see :func:`telemetry_declined`.
TELEMETRY_OFF_VARIABLE = "CI"


@contextmanager
def telemetry_declined() -> Iterator[None]:
    """OpenVINO's converter and NNCF send usage telemetry unless declined, each event from a process forked off a
    sender thread and waited for up to a second: measured 0.4-0.9 s of each 0.5-1.0 s conversion of a small CNN
    (no network), and a fork from a thread that hung the QEMU-emulated int8 tests. This tool declines it the way
    both do on CI machines: their (shared, process-wide) telemetry object is set up while ``CI=true``, and keeps
    that answer for the process. Nothing else reads the variable while it is set."""
    before = os.environ.get(TELEMETRY_OFF_VARIABLE)
    os.environ[TELEMETRY_OFF_VARIABLE] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TELEMETRY_OFF_VARIABLE, None)
        else:
            os.environ[TELEMETRY_OFF_VARIABLE] = before


def openvino_module() -> Any:
    """The ``openvino`` package, imported with its telemetry declined (importing it sends an event)."""
    with telemetry_declined():
        import openvino

    return openvino


def _cause(exc: BaseException) -> str:
    """What an OpenVINO conversion error says: its last line where the first is only where a check failed
    ("Check 'false' failed at src/frontends/...": the reason comes last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if len(lines) > 1 and lines[0].startswith("Check '") else first_line(exc)


def convert_openvino(model: nn.Module, example_input: torch.Tensor) -> Any:
    """``model`` (FP32, eval mode, on the CPU) as an ``openvino.Model``: input ``[?, C, H, W]``, output logits.

    The batch axis is dynamic (:class:`OpenVinoModel` compiles a static shape per batch size it sees);
    channels, height and width are those of ``example_input``. The model is left in the mode and on the
    device it was in.
    """
    ov = openvino_module()

    if example_input.ndim != 4:
        raise OpenVinoError(f"expected an example input N x C x H x W, got shape {tuple(example_input.shape)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    wrapper = LogitsOnly(model).cpu().eval()
    example = example_input[:1].detach().cpu().float()
    _, channels, height, width = (int(d) for d in example.shape)
    try:
        with _conversion_quiet(), telemetry_declined(), torch.no_grad():
            # one call first: a model that fills a cache on its first call in eval mode (LeViT's attention biases)
            # traces differently on the next, and the tracer's check that two invocations agree would fail
            wrapper(example)
            exported = export_form(wrapper, example)
            converted = ov.convert_model(
                exported, example_input=(example,), input=[ov.PartialShape([-1, channels, height, width])]
            )
    except Exception as exc:
        raise OpenVinoError(f"OpenVINO conversion of {type(model).__name__} failed: {_cause(exc)}") from exc
    finally:
        model.to(device)
        model.train(was_training)
    if len(converted.inputs) != 1:
        raise OpenVinoError(f"the converted {type(model).__name__} has {len(converted.inputs)} inputs: expected one")
    return converted


def save_openvino(ov_model: Any, xml_path: Path) -> Path:
    """Write ``ov_model`` as IR at ``xml_path`` (+ the ``.bin`` beside it), float weights kept in float32.

    Both files are written in a temporary directory beside the target and moved into place, the
    ``.bin`` first: an ``.xml`` that exists has its weights.
    """
    ov = openvino_module()

    xml_path = Path(xml_path)
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    bin_path = xml_path.with_suffix(".bin")
    with tempfile.TemporaryDirectory(prefix=".ov-save-", dir=xml_path.parent) as work:
        tmp_xml = Path(work) / xml_path.name
        try:
            ov.save_model(ov_model, str(tmp_xml), compress_to_fp16=False)
        except Exception as exc:
            raise OpenVinoError(f"saving the OpenVINO model to {xml_path} failed: {first_line(exc)}") from exc
        os.replace(tmp_xml.with_suffix(".bin"), bin_path)
        os.replace(tmp_xml, xml_path)
    logger.info(
        "saved OpenVINO IR %s (%.2f MB with its .bin)",
        xml_path,
        (xml_path.stat().st_size + bin_path.stat().st_size) / 1e6,
    )
    return xml_path


def export_openvino(float_model: nn.Module, example_input: torch.Tensor, out_path: Path) -> Path:
    """Convert ``float_model`` (:func:`convert_openvino`) and save it as FP32 IR at ``out_path`` (``.xml``)."""
    return save_openvino(convert_openvino(float_model, example_input), Path(out_path))


__all__: list[str] = [
    "BIN_FILENAME",
    "XML_FILENAME",
    "OpenVinoError",
    "convert_openvino",
    "export_openvino",
    "save_openvino",
]
