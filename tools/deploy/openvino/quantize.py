"""OpenVINO int8: NNCF post-training quantization of a converted model, and which layers it made int8.

* :func:`quantize_openvino` -- NNCF's post-training int8 quantization of an ``openvino.Model``, calibrated on
  preprocessed images (every Conv/MatMul NNCF selects gets int8 weights and activations);
* :func:`int8_weight_layers` -- the modules whose weights are int8 in such a model;
* :func:`deploy_openvino` -- convert, quantize when asked, save as IR: what the ``openvino`` backends deploy.

``nncf`` is imported inside the functions that need it.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tools.deploy.accuracy import AccuracyControl
from tools.deploy.cpu import Int8Settings, NncfPreset, OverflowFix, int8_settings
from tools.deploy.openvino.convert import OpenVinoError, convert_openvino, save_openvino, telemetry_declined
from tools.deploy.openvino.model import core
from tools.text import first_line

logger = logging.getLogger(__name__)

MAX_SUBSET = 300
"""NNCF's default number of calibration samples; fewer when the calibration set is smaller."""


def calibration_items(calibration: torch.Tensor) -> list[np.ndarray]:
    """One ``1 x C x H x W`` float32 array per calibration image (NNCF collects statistics per item)."""
    if calibration.ndim != 4 or calibration.shape[0] == 0:
        raise OpenVinoError(
            f"calibration must be a non-empty batch N x C x H x W, got shape {tuple(calibration.shape)}"
        )
    array = calibration.detach().to("cpu", torch.float32).contiguous().numpy()
    return [np.ascontiguousarray(array[i : i + 1]) for i in range(array.shape[0])]


@contextmanager
def _nncf_quiet() -> Iterator[None]:
    """NNCF logs each algorithm's progress at INFO and draws progress bars (rich, on stdout) that no option
    turns off: keep its warnings and errors, drop the bars."""
    nncf_logger = logging.getLogger("nncf")  # nncf.common.logging.logger.NNCF_LOGGER_NAME
    level = nncf_logger.level
    nncf_logger.setLevel(logging.WARNING)
    try:
        with redirect_stdout(io.StringIO()):
            yield
    finally:
        nncf_logger.setLevel(level)


def _nncf_parameters(overflow_fix: OverflowFix, bias_correction: bool = True) -> Any:
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.advanced_parameters import OverflowFix as NncfOverflowFix

    return AdvancedQuantizationParameters(
        overflow_fix=NncfOverflowFix(overflow_fix), disable_bias_correction=not bias_correction
    )


def quantize_openvino(
    ov_model: Any,
    calibration: torch.Tensor,
    *,
    transformer: bool,
    subset_size: int | None = None,
    overflow_fix: OverflowFix | None = None,
    preset: NncfPreset | None = None,
    ignored: Sequence[str] = (),
    accuracy_control: AccuracyControl | None = None,
    bias_correction: bool = True,
    fast_bias_correction: bool | None = None,
) -> Any:
    """NNCF post-training int8 quantization of ``ov_model`` calibrated on ``calibration`` (N x C x H x W).

    Attention models use NNCF's transformer model type (SmoothQuant, attention-aware patterns); others none.
    ``preset``: symmetric weights and activations (``performance``) or asymmetric activations (``mixed``); default:
    what this CPU's kind takes for this kind of model (:meth:`tools.deploy.cpu.Int8Settings.nncf_preset`).
    ``subset_size``: calibration images used, at most :data:`MAX_SUBSET` (default: all, up to it).
    ``overflow_fix``: NNCF's 7-bit weights on every layer (``enable``, what holds on CPUs without VNNI), the first
    one (NNCF's default) or none; default: what this CPU's kind needs (``Int8Settings.overflow_fix``).
    Bias correction: ``fast_bias_correction``, default NNCF's full one for models without attention, its fast one
    for attention models (:meth:`tools.deploy.cpu.Int8Settings.nncf_fast_bias_correction`); none without
    ``bias_correction`` (a build only timed: the kernels are the same, and full bias correction is most of NNCF's
    time on a CNN).
    ``ignored``: op names left in float. Every other Conv/MatMul NNCF's patterns select is quantized; with
    ``accuracy_control``, :func:`nncf.quantize_with_accuracy_control` then keeps the quantizers that cost the most
    in float until the budget holds (:func:`_controlled`).
    """
    with telemetry_declined():
        import nncf

    overflow_fix = overflow_fix or int8_settings().overflow_fix
    chosen_preset = nncf.QuantizationPreset(preset or int8_settings().nncf_preset(transformer))
    items = calibration_items(calibration)
    subset = min(MAX_SUBSET, len(items), subset_size or len(items))
    options: dict[str, Any] = {
        "model_type": nncf.ModelType.TRANSFORMER if transformer else None,
        "preset": chosen_preset,
        "subset_size": subset,
        "fast_bias_correction": (
            int8_settings().nncf_fast_bias_correction(transformer)
            if fast_bias_correction is None
            else fast_bias_correction
        ),
        "ignored_scope": nncf.IgnoredScope(names=list(ignored), validate=False) if ignored else None,
    }
    quantized = _nncf_quantized(ov_model, items, accuracy_control, overflow_fix, bias_correction, options)
    logger.info(
        "NNCF int8 quantization (%s preset, overflow fix %s, %s bias correction%s) calibrated on %d images",
        chosen_preset.value,
        overflow_fix,
        "fast" if options["fast_bias_correction"] else "full",
        ", accuracy-controlled" if accuracy_control is not None else "",
        subset,
    )
    return quantized


def _nncf_quantized(
    ov_model: Any,
    items: list[np.ndarray],
    control: AccuracyControl | None,
    overflow_fix: OverflowFix,
    bias_correction: bool,
    options: dict[str, Any],
) -> Any:
    """``ov_model`` quantized by NNCF on the calibration ``items`` with ``options`` (accuracy-controlled with
    ``control``: :func:`_controlled`), its progress bars and warnings muted; ``OpenVinoError`` should it fail."""
    import nncf

    try:
        with _nncf_quiet(), telemetry_declined(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            if control is not None:
                return _controlled(ov_model, nncf.Dataset(items), control, overflow_fix, options)
            parameters = _nncf_parameters(overflow_fix, bias_correction)
            return nncf.quantize(ov_model, nncf.Dataset(items), advanced_parameters=parameters, **options)
    except Exception as exc:
        raise OpenVinoError(f"NNCF int8 quantization failed: {first_line(exc)}") from exc


#: NNCF's accuracy control ranks every group of quantizers (a variant with the group in float, compiled and run on a
#: subset of the validation images), then restores the worst group by group, validating every image each time and
#: ranking the rest again whenever a restored group made things worse. Its cost is planned from the model's MACs at
#: this OpenVINO int8 speed (one thread: a 224-px MobileNetV2 ran at about 6e10, CIFAR ResNet-56 1e11) and this time
#: to compile each variant (MobileNetV2: 0.2 s) ...
OPENVINO_INT8_MACS_PER_SECOND = 5e10
NNCF_VARIANT_SECONDS = 0.3
#: ... to about these seconds of ranking and of restoring (each step counted with a ranking again, the worst case).
#: With NNCF's defaults (300 ranking images, a step per layer it may restore) a 224-px MobileNetV2 judged on 375
#: images ranked for over 11 minutes on one thread and did not finish; planned, it ranks on 44 images, restores
#: at most 3 times.
NNCF_CONTROL_SECONDS = (30.0, 120.0)
#: The fewest and most images NNCF ranks on (the most: NNCF's default); where ranking on the fewest takes over twice
#: the ranking seconds, the accuracy-controlled candidate is not built (ResNet-101 or ViT-B/16 at 224 px).
NNCF_RANKING_IMAGES = (32, 300)
#: Restoring steps allowed whatever the plan (NNCF stops as soon as the budget holds).
NNCF_MIN_ITERATIONS = 2


def nncf_control_plan(macs: int, groups: int, images: int, float_share: float) -> tuple[int, int] | None:
    """``(ranking images, restoring steps)`` of NNCF's accuracy control for a model of ``macs`` per image (0: unknown,
    NNCF's defaults) with ``groups`` quantizable layers, judged on ``images`` images, keeping at most ``float_share``
    of its layers in float (see :data:`NNCF_CONTROL_SECONDS`); None when ranking on the fewest images takes over
    twice the ranking seconds."""
    (low, high), (ranking_s, restoring_s) = NNCF_RANKING_IMAGES, NNCF_CONTROL_SECONDS
    most_steps = max(1, int(groups * float_share))
    if macs <= 0:
        return min(high, images), most_steps
    per_image = macs / OPENVINO_INT8_MACS_PER_SECOND

    def ranking_pass(count: int) -> float:
        return groups * (NNCF_VARIANT_SECONDS + count * per_image)

    if ranking_pass(low) > 2 * ranking_s:
        return None
    ranking = min(images, max(low, min(high, int((ranking_s / groups - NNCF_VARIANT_SECONDS) / per_image))))
    step = NNCF_VARIANT_SECONDS + images * per_image + ranking_pass(ranking)
    return ranking, min(most_steps, max(NNCF_MIN_ITERATIONS, int(restoring_s / step)))


def _predict(compiled: Any, images: Sequence[np.ndarray], batch: int = 16) -> list[int]:
    """Top-1 class of each image (1 x C x H x W arrays), run ``batch`` at a time (the models' batch is dynamic)."""
    out: list[int] = []
    for start in range(0, len(images), batch):
        logits = np.asarray(compiled(np.concatenate(images[start : start + batch]))[0])
        out.extend(int(c) for c in logits.argmax(axis=-1))
    return out


def _controlled(
    ov_model: Any, calibration: Any, control: AccuracyControl, overflow_fix: OverflowFix, options: dict[str, Any]
) -> Any:
    """:func:`nncf.quantize_with_accuracy_control` judged on ``control``'s images: NNCF's metric is the top-1
    accuracy, and its ``max_drop`` what the budget leaves once the float model's own drop against the original is
    counted (:meth:`AccuracyControl.allowed_int8_drop`). NNCF restores the quantizers that cost the most first. The
    result is checked with the run's own budget test; should it fail, NNCF runs once more with half the allowance."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    images = calibration_items(control.images)
    source = _predict(core().compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}), images)

    def validate(compiled: Any, data: Any) -> tuple[float, list[float]]:
        rows = [int(i) for i in data]
        predictions = _predict(compiled, [images[i] for i in rows])
        correct = [
            float(control.counts_as(p) == int(control.targets[i])) for p, i in zip(predictions, rows, strict=True)
        ]
        return (sum(correct) / len(correct) if correct else 0.0), correct

    quantizable = len(_weighted_ops(ov_model))
    ranking, iterations = nncf_control_plan(
        control.macs_per_image, quantizable, len(images), control.max_float_share
    ) or (NNCF_RANKING_IMAGES[0], 1)
    restorer = AdvancedAccuracyRestorerParameters(max_num_iterations=iterations, ranking_subset_size=ranking)
    logger.info("NNCF accuracy control: ranking on %d images, at most %d restoring iterations", ranking, iterations)
    quantized = None
    for tighten in (1.0, 0.5):
        allowed = control.allowed_int8_drop(source, tighten)
        quantized = nncf.quantize_with_accuracy_control(
            ov_model,
            calibration,
            nncf.Dataset(list(range(len(images)))),
            validate,
            max_drop=allowed,
            drop_type=nncf.DropType.ABSOLUTE,
            advanced_quantization_parameters=_nncf_parameters(overflow_fix),
            advanced_accuracy_restorer_parameters=restorer,
            **options,
        )
        predictions = _predict(core().compile_model(quantized, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}), images)
        if control.holds(predictions) or _accuracy(control, source) - _accuracy(control, predictions) > allowed:
            break  # within the budget, or NNCF did not reach its own target: a tighter one would not help
    return quantized


def _accuracy(control: AccuracyControl, predictions: Sequence[int]) -> float:
    return sum(control.correct(predictions)) / max(1, len(predictions))


def count_fake_quantize(ov_model: Any) -> int:
    """How many FakeQuantize nodes (int8 activation insertion points) an ``openvino.Model`` holds."""
    return sum(1 for op in ov_model.get_ops() if op.get_type_name() == "FakeQuantize")


_WEIGHTED_OPS = frozenset({"MatMul", "Convolution", "GroupConvolution"})
_DECOMPRESSION_OPS = frozenset({"Convert", "Multiply", "Subtract", "Reshape", "Transpose", "FakeQuantize"})
_SCOPE = "__module.model."
"""How the PyTorch frontend names the nodes of ``LogitsOnly(model)``: ``__module.model.<module path>/aten::...``."""


def _constant_type(node: Any, depth: int = 6) -> str | None:
    """The element type (``f32``, ``i8``...) of the constant a weight input is, seen through its
    decompression (Convert, Multiply...); None for a computed input (attention's activation MatMuls)."""
    kind = node.get_type_name()
    if kind == "Constant":
        return str(node.get_output_element_type(0).get_type_name())
    if kind not in _DECOMPRESSION_OPS or depth == 0 or node.get_input_size() == 0:
        return None
    return _constant_type(node.input_value(0).get_node(), depth - 1)


def _weight_shape(op: Any) -> tuple[int, ...] | None:
    """The weight's shape as torch stores it (Linear ``(out, in)``, Conv ``(out, in/groups, kh, kw)``)."""
    shape = op.input_value(1).get_partial_shape()
    if not shape.is_static:
        return None
    dims = [int(d.get_length()) for d in shape]
    if op.get_type_name() == "GroupConvolution" and len(dims) >= 3:
        return (dims[0] * dims[1], *dims[2:])
    if op.get_type_name() == "MatMul" and not op.get_attributes().get("transpose_b", False):
        return tuple(reversed(dims))
    return tuple(dims)


def _torch_weighted_layers(model: nn.Module, example_input: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """(name, weight shape) of the Linear/Conv modules of ``model`` in the order a forward pass runs them."""
    seen: list[tuple[str, tuple[int, ...]]] = []
    names: dict[nn.Module, str] = {
        m: n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d)
    }

    def record(module: nn.Module, *_: Any) -> None:
        weight = module.weight
        if names[module] not in {n for n, _ in seen} and isinstance(weight, torch.Tensor):
            seen.append((names[module], tuple(int(d) for d in weight.shape)))

    handles = [m.register_forward_hook(record) for m in names]
    try:
        with torch.no_grad():
            model(example_input[:1].to(next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _weighted_ops(ov_model: Any) -> list[Any]:
    """The MatMul/Convolution ops of ``ov_model`` whose weight (second input) is a constant, in execution order."""
    return [
        op
        for op in ov_model.get_ordered_ops()
        if op.get_type_name() in _WEIGHTED_OPS and op.get_input_size() > 1
        if _constant_type(op.input_value(1).get_node()) is not None
    ]


def _module_names(
    ops: list[Any], model: nn.Module | None = None, example_input: torch.Tensor | None = None
) -> dict[int, str]:
    """Index in ``ops`` -> the module it applies. A node is named by its scope (``__module.model.<module path>``);
    conversion renames the convolutions BatchNorm is folded into, and those are matched to ``model``'s modules
    (when given, with an ``example_input``) by weight shape, in execution order."""
    named: dict[int, str] = {}
    unnamed: dict[tuple[int, ...] | None, list[int]] = {}
    for i, op in enumerate(ops):
        scope = op.get_friendly_name().split("/", 1)[0]
        if scope.startswith(_SCOPE):
            named[i] = scope[len(_SCOPE) :]
        else:
            unnamed.setdefault(_weight_shape(op), []).append(i)
    if model is not None and example_input is not None and unnamed:
        was_training = model.training
        try:
            layers: dict[tuple[int, ...], list[str]] = {}
            for name, shape in _torch_weighted_layers(model.eval(), example_input):
                if name not in named.values():
                    layers.setdefault(shape, []).append(name)
        finally:
            model.train(was_training)
        for weight_shape, indices in unnamed.items():
            candidates = layers.get(weight_shape, []) if weight_shape is not None else []
            if len(candidates) == len(indices):
                named.update(zip(indices, candidates, strict=True))
    return named


def int8_weight_layers(
    ov_model: Any, model: nn.Module | None = None, example_input: torch.Tensor | None = None
) -> tuple[list[str], int]:
    """Module names of the MatMul/Convolution nodes with int8 weights, and how many such nodes have none
    (:func:`_module_names`: by scope, else by weight shape in execution order when ``model`` and ``example_input``
    are given)."""
    ops = _weighted_ops(ov_model)
    named = _module_names(ops, model, example_input)
    int8 = [i for i, op in enumerate(ops) if _constant_type(op.input_value(1).get_node()) in ("i8", "u8")]
    return sorted({named[i] for i in int8 if i in named}), sum(1 for i in int8 if i not in named)


def module_ops(ov_model: Any, model: nn.Module, example_input: torch.Tensor) -> dict[str, list[str]]:
    """Module name -> the friendly names of the MatMul/Convolution ops of ``ov_model`` that apply its weight: what
    NNCF's ignored scope names to keep those layers in float."""
    ops = _weighted_ops(ov_model)
    found: dict[str, list[str]] = {}
    for i, name in _module_names(ops, model, example_input).items():
        found.setdefault(name, []).append(ops[i].get_friendly_name())
    return found


def deploy_openvino(
    float_model: nn.Module,
    xml_path: Path,
    *,
    example_input: torch.Tensor,
    calibration: torch.Tensor | None = None,
    int8: bool,
    settings: Int8Settings | None = None,
    keep_float: Sequence[str] = (),
    accuracy_control: AccuracyControl | None = None,
) -> tuple[list[str], int]:
    """Convert ``float_model``, quantize it to int8 with NNCF when ``int8`` (calibrated on ``calibration``; the
    transformer model type for attention models; ``settings``' overflow fix, preset and bias correction, default
    :func:`int8_settings`; the layers ``keep_float`` names left in float; with ``accuracy_control``, NNCF's
    accuracy-controlled quantization keeps more in float until its drop is within), and save it as IR at
    ``xml_path``. Returns :func:`int8_weight_layers` of the saved model: the modules whose weights are int8, and
    how many int8 nodes could not be named (none and 0 for FP32)."""
    from tools.compression.heads import has_attention

    converted = convert_openvino(float_model, example_input)
    if int8:
        if calibration is None:
            raise OpenVinoError("NNCF int8 quantization needs calibration images (N x C x H x W)")
        names = module_ops(converted, float_model, example_input) if keep_float else {}
        ignored = [op for name in keep_float for op in names.get(name, [])]
        transformer, chosen = has_attention(float_model), settings or int8_settings()
        converted = quantize_openvino(
            converted,
            calibration,
            transformer=transformer,
            overflow_fix=chosen.overflow_fix,
            preset=chosen.nncf_preset(transformer),
            fast_bias_correction=chosen.nncf_fast_bias_correction(transformer),
            ignored=ignored,
            accuracy_control=accuracy_control,
        )
    save_openvino(converted, xml_path)
    if not int8:
        return [], 0
    return int8_weight_layers(converted, float_model, example_input)


__all__: list[str] = [
    "MAX_SUBSET",
    "calibration_items",
    "count_fake_quantize",
    "deploy_openvino",
    "int8_weight_layers",
    "module_ops",
    "quantize_openvino",
]
