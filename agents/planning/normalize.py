"""Field-name variants of the LLM's plans and input shapes, mapped onto the schemas' names.

Models write ``type`` for ``pruning_type``, ``ratio`` for ``pruning_ratio``, ``"30%"`` for ``0.3``,
``int8`` for ``qint8``, ``{"plan": {...}}`` around a plan, or ``[3, 224, 224]`` for a shape.
:func:`normalize_payload` is the :data:`tools.llm.structured.Normalizer` the LLM planner passes to
:func:`tools.llm.structured.invoke_structured`: it maps such answers onto :class:`OptimizationPlan` and
:class:`InputShape`, and records each change as a note. Other schemas are only unwrapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from tools.compression.units import kind_named
from tools.llm.structured import find_unwrapped, norm_key, normalize_generic
from tools.schemas import InputShape, OptimizationPlan

__all__ = ["NORMALIZERS", "normalize_payload"]

_PRUNING_KEYS = {
    "pruning_recommendations": "pruning_recommendations",
    "pruning": "pruning_recommendations",
    "prune": "pruning_recommendations",
    "pruning_plan": "pruning_recommendations",
    "pruning_recs": "pruning_recommendations",
    "pruning_recommendation": "pruning_recommendations",
    "pruning_decisions": "pruning_recommendations",
    "quantization_recommendations": "quantization_recommendations",
    "quantization": "quantization_recommendations",
    "quantize": "quantization_recommendations",
    "quantization_plan": "quantization_recommendations",
    "quantization_recs": "quantization_recommendations",
    "quantization_recommendation": "quantization_recommendations",
    "quant_recommendations": "quantization_recommendations",
    "quantization_decisions": "quantization_recommendations",
}
_PRUNE_REC_KEYS = {
    "layer": "layer",
    "pattern": "layer",
    "regex": "layer",
    "layer_pattern": "layer",
    "layer_regex": "layer",
    "layers": "layer",
    "module": "layer",
    "modules": "layer",
    "target": "layer",
    "name": "layer",
    "pruning_type": "pruning_type",
    "type": "pruning_type",
    "prune_type": "pruning_type",
    "method": "pruning_type",
    "kind": "pruning_type",
    "strategy": "pruning_type",
    "pruning_ratio": "pruning_ratio",
    "ratio": "pruning_ratio",
    "prune_ratio": "pruning_ratio",
    "amount": "pruning_ratio",
    "sparsity": "pruning_ratio",
    "fraction": "pruning_ratio",
    "justification": "justification",
    "reason": "justification",
    "rationale": "justification",
    "why": "justification",
    "explanation": "justification",
}
_QUANT_REC_KEYS = {
    "layer": "layer",
    "pattern": "layer",
    "regex": "layer",
    "layers": "layer",
    "layer_pattern": "layer",
    "module": "layer",
    "modules": "layer",
    "target": "layer",
    "quantization_type": "quantization_type",
    "type": "quantization_type",
    "method": "quantization_type",
    "mode": "quantization_type",
    "dtype": "dtype",
    "precision": "dtype",
    "data_type": "dtype",
    "bits": "dtype",
    "justification": "justification",
    "reason": "justification",
    "rationale": "justification",
    "why": "justification",
    "explanation": "justification",
}
_SHAPE_KEYS = {
    "channels": "channels",
    "c": "channels",
    "num_channels": "channels",
    "in_channels": "channels",
    "n_channels": "channels",
    "channel": "channels",
    "height": "height",
    "h": "height",
    "image_height": "height",
    "img_height": "height",
    "width": "width",
    "w": "width",
    "image_width": "width",
    "img_width": "width",
}
_DTYPES = {
    "qint8": "qint8",
    "int8": "qint8",
    "torch.qint8": "qint8",
    "i8": "qint8",
    "8": "qint8",
    "8bit": "qint8",
    "8-bit": "qint8",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "torch.float16": "float16",
    "16": "float16",
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "torch.float32": "float32",
    "32": "float32",
    "none": "float32",
    "keep": "float32",
}


def _rename(item: dict[str, Any], aliases: dict[str, str], where: str, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in item.items():
        target = aliases.get(norm_key(key))
        if target is None:
            expected = ", ".join(sorted(set(aliases.values())))
            notes.append(f"{where}: dropped unknown field {key!r} (fields: {expected})")
            continue
        if target in out:
            if norm_key(key) == target:  # the canonical name wins over an alias seen earlier
                out[target] = value
            notes.append(f"{where}: dropped duplicate field {key!r}")
            continue
        if key != target:
            notes.append(f"{where}: read {key!r} as {target!r}")
        out[target] = value
    return out


def _ratio(value: Any, where: str, notes: list[str]) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            if text.endswith("%"):
                value = float(text[:-1]) / 100
                notes.append(f"{where}: read {text!r} as {value}")
                return value
            value = float(text)
        except ValueError:
            return text
    if isinstance(value, int | float) and not isinstance(value, bool) and 1 < value <= 100:
        notes.append(f"{where}: read pruning_ratio {value} as a percentage ({value / 100})")
        return value / 100
    return value


def _layer(value: Any, where: str, notes: list[str]) -> Any:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        joined = value[0] if len(value) == 1 else "|".join(f"(?:{v})" for v in value)
        notes.append(f"{where}: joined a list of {len(value)} layer patterns into one regex")
        return joined
    return value


def _pruning_type(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    kind = kind_named(norm_key(value))  # the kind's name, or one of its words ("head width", "channels")
    return kind.name if kind is not None else value


def _normalize_prune_rec(item: Any, where: str, notes: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    rec = _rename(item, _PRUNE_REC_KEYS, where, notes)
    if "pruning_type" in rec:
        before = rec["pruning_type"]
        rec["pruning_type"] = _pruning_type(before)
        if rec["pruning_type"] != before:
            notes.append(f"{where}: read pruning_type {before!r} as {rec['pruning_type']!r}")
    if "pruning_ratio" in rec:
        rec["pruning_ratio"] = _ratio(rec["pruning_ratio"], where, notes)
    if "layer" in rec:
        rec["layer"] = _layer(rec["layer"], where, notes)
    return rec


def _normalize_quant_rec(item: Any, where: str, notes: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    rec = _rename(item, _QUANT_REC_KEYS, where, notes)
    qtype = rec.get("quantization_type")
    if isinstance(qtype, str | int) and str(qtype).strip().lower() in _DTYPES and "dtype" not in rec:
        rec["dtype"] = qtype
        rec["quantization_type"] = "dynamic"
        notes.append(f"{where}: read quantization_type {qtype!r} as a dtype")
    elif isinstance(qtype, str) and qtype not in ("dynamic", "static"):
        for kind in ("dynamic", "static"):
            if kind in qtype.lower():
                rec["quantization_type"] = kind
                notes.append(f"{where}: read quantization_type {qtype!r} as {kind!r}")
                break
    dtype = rec.get("dtype")
    if isinstance(dtype, str | int) and not isinstance(dtype, bool):
        mapped = _DTYPES.get(str(dtype).strip().lower())
        if mapped and mapped != dtype:
            rec["dtype"] = mapped
            notes.append(f"{where}: read dtype {dtype!r} as {mapped!r}")
    if "layer" in rec:
        rec["layer"] = _layer(rec["layer"], where, notes)
        if isinstance(rec["layer"], str) and rec["layer"].strip().lower() in {"all", "*", ".*", "all_linear"}:
            rec["layer"] = "all"
    return rec


def _is_quant_item(item: Any) -> bool:
    return isinstance(item, dict) and any(norm_key(k) in {"dtype", "quantization_type", "precision"} for k in item)


def _normalize_plan(data: Any, notes: list[str]) -> Any:
    if isinstance(data, list):
        notes.append("read a top-level list as the recommendations")
        data = {"recommendations": data}
    found = find_unwrapped(data, {*_PRUNING_KEYS, "recommendations"}, "plan", notes)
    if found is None:
        rec_keys = {norm_key(k) for k in data} if isinstance(data, dict) else set()
        if {_PRUNE_REC_KEYS.get(k) for k in rec_keys} >= {"layer", "pruning_ratio"}:
            notes.append("read a single top-level recommendation as the pruning recommendations")
            notes.append("unwrapped the plan from an enclosing object")  # the list made around it counts as one
            found = {"pruning_recommendations": [data]}
        else:
            return data
    out: dict[str, Any] = {}
    for key, value in found.items():
        norm = norm_key(key)
        if norm == "recommendations" and isinstance(value, list):
            prune = [v for v in value if not _is_quant_item(v)]
            quant = [v for v in value if _is_quant_item(v)]
            out.setdefault("pruning_recommendations", []).extend(prune)
            out.setdefault("quantization_recommendations", []).extend(quant)
            notes.append("split 'recommendations' into pruning and quantization recommendations")
            continue
        target = _PRUNING_KEYS.get(norm)
        if target is None:
            notes.append(f"dropped unknown top-level field {key!r}")
            continue
        if key != target:
            notes.append(f"read {key!r} as {target!r}")
        if isinstance(value, dict):
            value = [value]
        if value is None:
            value = []
        if isinstance(value, list):
            out.setdefault(target, []).extend(value)
        else:
            out[target] = value
    for i, item in enumerate(out.get("pruning_recommendations", [])):
        out["pruning_recommendations"][i] = _normalize_prune_rec(item, f"pruning_recommendations[{i}]", notes)
    for i, item in enumerate(out.get("quantization_recommendations", [])):
        where = f"quantization_recommendations[{i}]"
        out["quantization_recommendations"][i] = _normalize_quant_rec(item, where, notes)
    return out


def _normalize_shape(data: Any, notes: list[str]) -> Any:
    if isinstance(data, list):
        data = {"shape": data}
    known = {*_SHAPE_KEYS, "shape", "input_shape", "size", "image_size", "input_size"}
    found = find_unwrapped(data, known, "shape", notes)
    if found is None:
        return data
    out: dict[str, Any] = {}
    for key, value in found.items():
        norm = norm_key(key)
        if norm in {"shape", "input_shape", "size", "image_size", "input_size"}:
            dims = [value, value] if isinstance(value, int) else value
            if isinstance(dims, dict):
                out.update(_rename(dims, _SHAPE_KEYS, key, notes))
            elif isinstance(dims, list) and all(isinstance(d, int) for d in dims):
                dims = dims[-3:] if len(dims) == 4 else dims  # drop a batch dimension
                if len(dims) == 3:
                    c, h, w = dims if dims[0] <= 4 or dims[2] > 4 else (dims[2], dims[0], dims[1])
                    out.setdefault("channels", c)
                    out.setdefault("height", h)
                    out.setdefault("width", w)
                elif len(dims) == 2:
                    out.setdefault("height", dims[0])
                    out.setdefault("width", dims[1])
                notes.append(f"read {key!r} {value!r} as the shape")
            continue
        target = _SHAPE_KEYS.get(norm)
        if target is None:
            if norm != "source":
                notes.append(f"dropped unknown field {key!r}")
            continue
        out[target] = value
    return out


#: Schema -> function that maps a parsed JSON value to the schema's field names (recording what it did).
NORMALIZERS: dict[type[BaseModel], Callable[[Any, list[str]], Any]] = {
    OptimizationPlan: _normalize_plan,
    InputShape: _normalize_shape,
}


def normalize_payload(data: Any, schema: type[BaseModel], notes: list[str] | None = None) -> Any:
    """Map a parsed JSON value onto ``schema``'s field names (wrappers, aliases, value spellings)."""
    notes = notes if notes is not None else []
    normalizer = NORMALIZERS.get(schema)
    if normalizer is None:
        return normalize_generic(data, schema, notes)
    return normalizer(data, notes)
