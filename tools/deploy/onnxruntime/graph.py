"""Reading exported ONNX graphs: which node applies which weight, what was quantized.

Nodes are matched to ``nn.Linear`` layers (and to fused attentions, :mod:`tools.deploy.onnxruntime.fusion`) by the value
of their constant weight, not by name: node names follow the exporter's scopes and change in preprocessing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import nn

from tools.deploy.base import WEIGHTED_MODULES

#: The ops whose constant weights dynamic int8 quantizes.
QUANTIZED_OP_TYPES: tuple[str, ...] = ("MatMul", "Gemm")
#: ONNX Runtime contrib operators quantize_dynamic can quantize (a fused attention: Attention -> QAttention).
CONTRIB_OP_TYPES: tuple[str, ...] = ("Attention",)
#: The ops static int8 (QDQ) quantizes.
STATIC_OP_TYPES: tuple[str, ...] = ("Conv", "MatMul", "Gemm")


def _fingerprint(weight: np.ndarray) -> bytes:
    array = np.ascontiguousarray(weight, dtype=np.float32)
    return hashlib.sha1(repr(array.shape).encode() + array.tobytes(), usedforsecurity=False).digest()


def attention_nodes(path: Path) -> dict[str, bytes]:
    """Fused ``Attention`` node name -> fingerprint of its packed Q/K/V weight ``(in, 3 x hidden)`` as stored."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    initializers = {init.name: init for init in graph.initializer}
    return {
        node.name: _fingerprint(numpy_helper.to_array(initializers[node.input[1]]))
        for node in graph.node
        if node.op_type == "Attention" and len(node.input) > 1 and node.input[1] in initializers
    }


def weighted_nodes(path: Path, op_types: Sequence[str] = QUANTIZED_OP_TYPES) -> dict[str, bytes]:
    """Node name -> fingerprint of its constant 2-D weight, oriented (out, in) like ``nn.Linear.weight``."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    initializers = {init.name: init for init in graph.initializer}
    nodes: dict[str, bytes] = {}
    for node in graph.node:
        if node.op_type not in op_types or len(node.input) < 2 or node.input[1] not in initializers:
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if weight.ndim != 2:
            continue
        trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        nodes[node.name] = _fingerprint(weight if trans_b else weight.T)
    return nodes


def linear_nodes(path: Path, model: nn.Module, op_types: Sequence[str] = QUANTIZED_OP_TYPES) -> dict[str, list[str]]:
    """For every ``nn.Linear`` of ``model``: the ``op_types`` nodes of the ONNX file that apply its weight.

    Matched by value (the weight, transposed as the exporter stored it), not by name: node names
    follow the exporter's scopes and change in preprocessing. A Linear with no node (not used in
    ``forward``, or its weight transformed on export) maps to an empty list.
    """
    by_weight: dict[bytes, list[str]] = {}
    for node, print_ in weighted_nodes(path, op_types).items():
        by_weight.setdefault(print_, []).append(node)
    return {
        name: list(by_weight.get(_fingerprint(module.weight.detach().cpu().float().numpy()), []))
        for name, module in model.named_modules()
        if type(module) is nn.Linear
    }


def packed_attention_nodes(path: Path, fused: nn.Module) -> dict[str, list[str]]:
    """For the q/k/v ``nn.Linear`` names a :class:`~tools.deploy.onnxruntime.fusion.PackedAttention` replaced:
    its Attention node.

    Names are the original model's (``<attention>.q_proj`` ...), matched by the packed weight's value.
    """
    from tools.deploy.onnxruntime.fusion import PackedAttention

    by_weight: dict[bytes, list[str]] = {}
    for node, print_ in attention_nodes(path).items():
        by_weight.setdefault(print_, []).append(node)
    found: dict[str, list[str]] = {}
    for name, module in fused.named_modules():
        if isinstance(module, PackedAttention) and module.qkv_weight is not None:
            nodes = by_weight.get(_fingerprint(module.qkv_weight.detach().cpu().float().numpy()), [])
            for part in ("q_proj", "k_proj", "v_proj"):
                found[f"{name}.{part}"] = list(nodes)
    return found


def input_name_of(path: Path) -> str:
    """The name of the (single) input of the ONNX model at ``path``, as an ONNX Runtime session sees it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return str(session.get_inputs()[0].name)


def constant_weight_nodes(path: Path, op_types: Sequence[str] = STATIC_OP_TYPES) -> dict[str, str]:
    """Node name -> op type of every ``op_types`` node whose weight (second input) is a constant."""
    import onnx

    graph = onnx.load(str(path)).graph
    constants = {init.name for init in graph.initializer}
    return {
        node.name: node.op_type
        for node in graph.node
        if node.op_type in op_types and len(node.input) > 1 and node.input[1] in constants and node.name
    }


def quantized_op_counts(path: Path) -> dict[str, int]:
    """Op type -> how many nodes of the QDQ graph at ``path`` take a quantized (DequantizeLinear) weight."""
    import onnx

    graph = onnx.load(str(path)).graph
    constants = {init.name for init in graph.initializer}
    int8 = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants}
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.op_type in STATIC_OP_TYPES and len(node.input) > 1 and node.input[1] in int8:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _scope_module(node_name: str) -> str:
    """The module path of a TorchScript-exported node's scope name, as ``named_modules`` spells it:
    ``/model/resnet/stages.0/layer/layer.1/convolution/Conv`` -> ``resnet.stages.0.layer.1.convolution``."""
    parts = [p for p in node_name.split("/") if p][:-1]  # the last part is the operator
    if parts and parts[0] == "model":  # LogitsOnly's attribute
        parts = parts[1:]
    # a container's children appear as "<container>/<container>.<i>": the container's own part is a repeat
    kept = [p for i, p in enumerate(parts) if not (i + 1 < len(parts) and parts[i + 1].startswith(p + "."))]
    return ".".join(kept)


def module_nodes(path: Path, model: nn.Module, op_types: Sequence[str] = STATIC_OP_TYPES) -> dict[str, list[str]]:
    """For every Linear/Conv module of ``model`` (``WEIGHTED_MODULES``): the ``op_types`` nodes with a constant weight
    that apply it, by the exporter's scope names (which survive BatchNorm folding, unlike the weights' values), and
    for Linear layers also by value (:func:`linear_nodes`). A module with no node maps to an empty list."""
    names = {name for name, m in model.named_modules() if isinstance(m, WEIGHTED_MODULES) and name}
    found: dict[str, list[str]] = {name: [] for name in sorted(names)}
    for node in constant_weight_nodes(path, op_types):
        module = _scope_module(node)
        if module in found:
            found[module].append(node)
    if any(op in op_types for op in QUANTIZED_OP_TYPES):
        for name, nodes in linear_nodes(path, model, tuple(op for op in op_types if op in QUANTIZED_OP_TYPES)).items():
            if name in found:
                found[name] = sorted(set(found[name]) | set(nodes))
    return found


def int8_weight_nodes(path: Path) -> set[str]:
    """The Conv/MatMul/Gemm nodes of a QDQ graph whose weight comes through a DequantizeLinear of a constant."""
    import onnx

    graph = onnx.load(str(path)).graph
    constants = {init.name for init in graph.initializer}
    int8 = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants}
    return {
        node.name
        for node in graph.node
        if node.op_type in STATIC_OP_TYPES and len(node.input) > 1 and node.input[1] in int8
    }
