"""ONNX Runtime static int8 in mixed precision: per-block int8 sensitivity, and accuracy control that uses it.

* :class:`StaticInt8Build` -- one float model exported, preprocessed and calibrated once (ONNX Runtime's calibration
  cache), and any number of static int8 variants of it that keep chosen layers in float (``nodes_to_exclude``);
* :func:`measure_int8_sensitivity` -- the damage int8 does when only one block (:func:`layer_group`) is quantized,
  in ONNX Runtime on this CPU with the int8 settings of its kind, on a few calibration batches: the profile's int8
  sensitivity and the ranking of accuracy control;
* :class:`OnnxRuntimeMixedBackend` (``onnxruntime-static-mixed``) -- static int8 that keeps the most damaging blocks
  in float, one more at a time, until the run's accuracy budget holds on the validation images.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tools.deploy.accuracy import AccuracyControl, predict_classes
from tools.deploy.base import BackendNotApplicable, Build, QuantizationError, QuantReport
from tools.deploy.cpu import Int8Settings, int8_settings
from tools.deploy.onnxruntime import graph as graphs
from tools.deploy.onnxruntime.backend import OnnxRuntimeBackend
from tools.deploy.onnxruntime.export import export_onnx, preprocess_onnx
from tools.deploy.onnxruntime.outliers import without_outlier_images
from tools.deploy.onnxruntime.quantize import static_quantize_onnx
from tools.deploy.onnxruntime.session import OrtModel
from tools.profiling.static import weight_layer_macs
from tools.schemas import Int8GroupDamage, Int8Sensitivity

logger = logging.getLogger(__name__)

__all__ = [
    "OnnxRuntimeMixedBackend",
    "StaticInt8Build",
    "int8_samples",
    "layer_group",
    "layer_groups",
    "measure_int8_sensitivity",
]

_NUMBERED = re.compile(r"^(.*\.\d+)(?:\.|$)")
#: At most this many blocks are measured: deeper names are cut back one numbered level until they fit.
MAX_GROUPS = 40
#: How many of the most damaging blocks accuracy control keeps in float at each step it tries.
_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def layer_group(module: str, level: int = 0) -> str:
    """The block a layer belongs to: its name up to the last numbered part (``vit.layers.3.mlp.fc1`` ->
    ``vit.layers.3``, ``layer1.2.conv1`` -> ``layer1.2``); ``level`` more numbered parts cut back (coarser blocks:
    ``stages.0.layers.1.layer.0`` -> ``stages.0.layers.1`` at level 1; torchvision's ``features.1.0.block.0``, a
    layer numbered itself, -> ``features.1.0``). A layer outside numbered blocks (a stem, a classifier) is a group of
    its own."""
    name = module
    for step in range(level + 1):
        match = _NUMBERED.match(name if step == 0 else name[: name.rfind(".")])
        if match is None:
            return name
        name = match.group(1)
    return name


def _parent(module: str, depth: int) -> str:
    """The first ``depth`` parts of a layer's name (the layer itself where it has no more)."""
    return ".".join(module.split(".")[:depth])


def layer_groups(layers: list[str], limit: int = MAX_GROUPS) -> dict[str, list[str]]:
    """``layers`` (in graph order) by block, at the finest level that gives at most ``limit`` blocks: numbered
    blocks (:func:`layer_group`), then, for names without numbers (torchvision's DenseNet:
    ``features.denseblock1.denselayer3.conv1``), the modules holding them, ever fewer parts deep."""
    keys: list[Callable[[str], str]] = [functools.partial(layer_group, level=level) for level in range(8)]
    depth = max((name.count(".") for name in layers), default=0)
    keys += [functools.partial(_parent, depth=d) for d in range(depth, 0, -1)]
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups = {}
        for name in layers:
            groups.setdefault(key(name), []).append(name)
        if len(groups) <= limit:
            break
    return groups


class StaticInt8Build:
    """``float_model`` exported and calibrated once in ``work``; :meth:`build` writes static int8 variants of it.

    ``groups`` maps each block (:func:`layer_group`) to its layers that have Conv/MatMul/Gemm nodes, in graph
    order. ``settings``: the int8 settings of the target CPU kind (:func:`tools.deploy.cpu.int8_settings`).
    """

    def __init__(
        self,
        float_model: nn.Module,
        example_input: torch.Tensor,
        calibration: torch.Tensor,
        work: Path,
        settings: Int8Settings | None = None,
    ) -> None:
        self.work = Path(work)
        # images whose activations would set the min-max ranges on their own are left out, and said (notes)
        self.calibration, self.notes = without_outlier_images(float_model, calibration)
        self.settings = settings or int8_settings()
        fp32 = export_onnx(float_model, example_input[:1], self.work / "float.onnx")
        self.graph = preprocess_onnx(fp32, self.work / "preprocessed.onnx")
        self.nodes = {name: found for name, found in graphs.module_nodes(self.graph, float_model).items() if found}
        order = {node: i for i, node in enumerate(graphs.constant_weight_nodes(self.graph))}
        layers = sorted(self.nodes, key=lambda name: min(order.get(n, len(order)) for n in self.nodes[name]))
        self.groups = layer_groups(layers)
        self._count = 0

    def build(self, keep_float: Iterable[str] = (), out: Path | None = None) -> Path:
        """A static int8 variant with the layers ``keep_float`` names in float (at ``out``, else in ``work``)."""
        float_layers = sorted(set(keep_float) & set(self.nodes))
        self._count += 1
        target = out or self.work / f"variant-{self._count}.onnx"
        return static_quantize_onnx(
            self.graph,
            target,
            self.calibration,
            preprocess=False,
            per_channel=self.settings.per_channel,
            reduce_range=self.settings.reduce_range,
            nodes_to_exclude=[node for name in float_layers for node in self.nodes[name]],
        )  # the activation ranges are calibrated once per graph and images (static_quantize_onnx)

    def logits(self, path: Path, images: torch.Tensor, batch: int = 64) -> np.ndarray:
        """The logits of the ONNX model at ``path`` on ``images``, one fixed batch size at a time."""
        model = OrtModel(path, threads=torch.get_num_threads(), fixed_batch=True)
        return np.concatenate([model(images[i : i + batch]).numpy() for i in range(0, len(images), batch)])

    def layers_of(self, groups: Iterable[str]) -> list[str]:
        return [name for group in groups for name in self.groups.get(group, [])]


def _damage(reference: np.ndarray, logits: np.ndarray) -> tuple[float, float]:
    """Mean KL divergence (nats) of the softmax of ``logits`` from that of ``reference``, and top-1 flips (%)."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        shifted = x - x.max(axis=1, keepdims=True)
        return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))

    p_log, q_log = log_softmax(reference.astype(np.float64)), log_softmax(logits.astype(np.float64))
    kl = float(np.mean(np.sum(np.exp(p_log) * (p_log - q_log), axis=1)))
    flips = float(np.mean(reference.argmax(1) != logits.argmax(1)) * 100.0)
    return max(kl, 0.0), flips


#: The images the int8 sensitivity profile measures on, at most; fewer where the model is large (see below).
INT8_SENSITIVITY_SAMPLES = 128
#: What the int8 sensitivity profile aims its passes at (one per block and two more) and the ONNX Runtime speed
#: it assumes for that (one thread, building each variant included): measured on a 224-px MobileNetV2 with 21
#: blocks, 128 images took 90 s (about 1e10 MAC/s); at these figures it gets 43 images, CIFAR models keep 128.
INT8_SENSITIVITY_SECONDS = 30.0
INT8_MACS_PER_SECOND = 1e10


def int8_samples(macs: int, blocks: int, available: int) -> int:
    """Images for the int8 sensitivity profile of a model of ``macs`` per image with ``blocks`` blocks: what
    :data:`INT8_SENSITIVITY_SECONDS` allows at :data:`INT8_MACS_PER_SECOND`, between 32 and
    :data:`INT8_SENSITIVITY_SAMPLES` (never more than ``available``). From MACs, never a timing: runs repeat."""
    if macs <= 0:
        return min(available, INT8_SENSITIVITY_SAMPLES)
    fitting = int(INT8_SENSITIVITY_SECONDS * INT8_MACS_PER_SECOND / (macs * (blocks + 2)))
    return min(available, max(32, min(INT8_SENSITIVITY_SAMPLES, fitting)))


def measure_int8_sensitivity(build: StaticInt8Build, images: torch.Tensor) -> Int8Sensitivity:
    """Per block: the damage of quantizing that block alone (every other one in float), against the float model, on
    ``images``; and the damage of quantizing every block. ONNX Runtime on this CPU, with ``build.settings``."""
    start = time.perf_counter()
    reference = build.logits(build.graph, images)
    full_kl, full_flips = _damage(reference, build.logits(build.build(), images))
    groups = []
    for group, layers in build.groups.items():
        others = [name for name in build.nodes if name not in set(layers)]
        kl, flips = _damage(reference, build.logits(build.build(others), images))
        groups.append(Int8GroupDamage(group=group, layers=layers, kl=round(kl, 6), flips_pct=round(flips, 3)))
    groups.sort(key=lambda g: (-g.kl, -g.flips_pct, g.group))
    return Int8Sensitivity(
        backend="onnxruntime-static",
        int8=build.settings.model_dump(),
        images=len(images),
        full_kl=round(full_kl, 6),
        full_flips_pct=round(full_flips, 3),
        groups=groups,
        seconds=round(time.perf_counter() - start, 3),
    )


def _ranking_for(
    build: StaticInt8Build, given: Int8Sensitivity | None, settings: Int8Settings
) -> Int8Sensitivity | None:
    """``given`` (the original's per-block int8 damage) where it ranks this build's blocks: measured in ONNX Runtime
    with the same int8 settings, on blocks of the same names (a pruned round of the original keeps them; a removed
    block is no longer a group and drops out); None where it does not, and the blocks are measured on this model."""
    if given is None or given.backend != "onnxruntime-static" or given.int8 != settings.model_dump():
        return None
    groups = [g for g in given.groups if g.group in build.groups]
    if not groups or set(build.groups) - {g.group for g in groups}:
        return None
    return given.model_copy(update={"groups": groups})


class OnnxRuntimeMixedBackend(OnnxRuntimeBackend):
    """``onnxruntime-static`` with accuracy control: while the int8 model is over the accuracy budget on the
    validation images (:class:`AccuracyControl`), the blocks whose int8 costs the most (measured here:
    :func:`measure_int8_sensitivity` on the calibration images) are kept in float, 1, 2, 3, 4, 6, 8... of them,
    until the budget holds or ``max_float_share`` of the layers would be float. Needs a labelled dataset."""

    def __init__(self) -> None:
        super().__init__(static=True)
        self.name = "onnxruntime-static-mixed"
        self.precision = "int8 static, mixed (accuracy control)"
        self.mixed_of = "onnxruntime-static"

    def save(self, build: Build) -> QuantReport:
        if build.accuracy_control is None:
            raise BackendNotApplicable(f"{self.name} needs labelled validation images (a dataset) to control accuracy")
        if build.qmodel is not None or build.calibration is None or len(build.calibration) == 0:
            raise QuantizationError(f"the {self.name} backend needs calibration images and no qmodel")
        example = build.example_input if build.example_input is not None else build.calibration
        settings = build.report.int8 or int8_settings()
        target = Path(build.out_dir) / self.deployed_file
        with tempfile.TemporaryDirectory(prefix=".onnx-mixed-", dir=build.out_dir) as work:
            int8 = StaticInt8Build(build.float_model, example, build.calibration, Path(work), settings)
            planned = [name for name in int8.nodes if name not in build.report.layers]  # the plan's float32 layers
            ranking = _ranking_for(int8, build.accuracy_control.int8_ranking, settings)
            ranked_on = "the original's (the int8 profile's)" if ranking is not None else "this model's"
            if ranking is None:
                macs = sum(weight_layer_macs(build.float_model, example[:1]).values())
                count = int8_samples(macs, len(int8.groups), len(build.calibration))
                ranking = measure_int8_sensitivity(int8, build.calibration[:count])
            kept, trail = self._control(
                int8, build.accuracy_control, planned, [g.group for g in ranking.groups], target
            )
        why = dict.fromkeys(planned, "the plan keeps it in float")
        damage = {layer: g for g in ranking.groups for layer in g.layers}
        for name in kept:
            if name not in why:
                g = damage[name]
                why[name] = (
                    f"accuracy control: block {g.group} (int8 alone: KL {g.kl:.4f}, {g.flips_pct:.1f} % top-1 flips "
                    f"on {ranking.images} calibration images)"
                )
        extra = [
            *int8.notes,
            f"{self.name}: accuracy control ({len(build.accuracy_control.images)} validation images, budget "
            f"{build.accuracy_control.max_drop_points:g} points with one standard error), blocks ranked by "
            f"{ranked_on} int8 damage: " + "; ".join(trail),
        ]
        return self._carried_out(build.report, target, int8.nodes, why, settings, len(int8.calibration), extra)

    def _control(
        self, build: StaticInt8Build, control: AccuracyControl, planned: list[str], ranked: list[str], target: Path
    ) -> tuple[list[str], list[str]]:
        """Keep ``planned`` and then the top blocks of ``ranked`` in float until ``control`` holds; the layers kept
        in float, and one line per step tried."""
        limit = max(1, math.floor(control.max_float_share * len(build.nodes)))
        trail: list[str] = []
        steps = [0, *(k for k in _STEPS if k <= len(ranked))]
        kept: list[str] = list(planned)
        for k in steps:
            candidate = sorted(set(planned) | set(build.layers_of(ranked[:k])))
            if k and len(candidate) > limit:
                trail.append(f"stopped before {k} block(s): more than {control.max_float_share:.0%} of layers float")
                break
            build.build(candidate, out=target)
            session = OrtModel(target, threads=torch.get_num_threads(), fixed_batch=True)
            predictions = predict_classes(session, control.images)
            used = control.used_points(predictions)
            trail.append(f"{len(candidate)} layer(s) float: {used:.2f} points used")
            kept = candidate
            if control.holds(predictions):
                break
        logger.info("%s: %s", self.name, "; ".join(trail))
        return kept, trail
