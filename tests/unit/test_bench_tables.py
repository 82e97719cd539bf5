"""The benchmark's Table 1 and its matched summary, from hand-built bench rows: values, not headings."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from tools.reporting.bench_tables import table1, table1_matched, tradeoff_plot

MODEL = "m"


def _row(method: str, accuracy: float, params: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "method": method,
        "importance": None,
        "recovery": "none",
        "finetune_steps": 0,
        "ratio": None,
        "matched": False,
        "accuracy": accuracy,
        "params": params,
        "latency_s": 0.001,
        "memory_mb": params / 250_000,
        "artifact": f"/a/{method}-{extra.get('importance')}-{extra.get('recovery')}-{extra.get('ratio')}",
        "paired": None,
        **extra,
    }


def _paired(delta: float, half: float = 1.0) -> dict[str, Any]:
    return {
        "delta_points": delta,
        "ci95_low_points": delta - half,
        "ci95_high_points": delta + half,
        "agreement": 0.9,
        "samples": 1000,
        "gained": 5,
        "lost": 5,
    }


def _uniform(importance: str, recovery: str, accuracy: float, ratio: float = 0.3, **extra: Any) -> dict[str, Any]:
    matched = ratio == 0.3
    params = 7_000 if matched else 9_000
    return _row(
        "uniform", accuracy, params, importance=importance, recovery=recovery, ratio=ratio, matched=matched, **extra
    )


def rows() -> list[dict[str, Any]]:
    return [
        _row("original", 0.80, 10_000),
        _row(
            "agent-prune",
            0.79,
            7_000,
            importance="act",
            recovery="reconstruct",
            finetune_steps=100,
            paired=_paired(-1.0),
        ),
        _uniform("l1", "none", 0.70),
        _uniform("l1", "none", 0.80, ratio=0.1),  # not at the agent's size: never the "best"
        _uniform("l2", "none", 0.74, paired=_paired(-6.0)),
        _uniform("random", "none", 0.60),
        _uniform("l1", "reconstruct", 0.77),
        _uniform("l2", "reconstruct", 0.78, paired=_paired(-2.0)),
        _uniform("random", "reconstruct", 0.795, ratio=0.1),
        _uniform("act", "none", 0.79),  # the agent's importance: not one of the paper's criteria
        _uniform("act", "reconstruct", 0.785, paired=_paired(-1.5)),
        _row("agent-quant", 0.80, 10_000),
    ]


def test_table1_has_every_pruned_row_with_its_settings_and_changes() -> None:
    header, body = table1(MODEL, rows())
    lines = [dict(zip(header, line, strict=True)) for line in body]
    assert [(x["method"], x["importance"], x["recovery"], x["ratio"]) for x in lines[:3]] == [
        ("original", "-", "-", "-"),
        ("agent-prune", "act", "reconstruct + KD 100 steps", "-"),
        ("uniform", "l1", "none", "0.3 (matched)"),
    ]
    assert len(lines) == 2 + 9  # agent-quant is not a pruning row
    original, agent, l1 = lines[:3]
    assert original["ΔAccuracy (pts) [95% CI]"] == "+0.00" and original["Δparams"] == "+0.0%"
    assert agent["ΔAccuracy (pts) [95% CI]"] == "-1.00 [-2.00, +0.00]" and agent["Δparams"] == "-30.0%"
    assert l1["ΔAccuracy (pts) [95% CI]"] == "-10.00" and l1["accuracy"] == "70.00%" and l1["params (M)"] == "0.007"
    l2_repaired = next(x for x in lines if x["importance"] == "l2" and x["recovery"] == "reconstruct")
    assert l2_repaired["ΔAccuracy (pts) [95% CI]"] == "-2.00 [-3.00, -1.00]"
    assert l2_repaired["latency (ms)"] == "1.00"


def test_matched_summary_picks_the_best_at_the_agent_size_and_the_gaps() -> None:
    header, body = table1_matched(MODEL, rows())
    (line,) = [dict(zip(header, b, strict=True)) for b in body]
    assert line["params removed"] == "30.0%"
    assert line["agent"] == "act, reconstruct + KD 100 steps: -1.00 [-2.00, +0.00]"
    # l1 -10, l2 -6 (paired), random -20 without recovery; act (not a paper criterion) is left out of "best"
    assert line["best uniform, no recovery"] == "l2, none: -6.00 [-7.00, -5.00]"
    assert line["best uniform + recovery"] == "l2, reconstruct: -2.00 [-3.00, -1.00]"
    assert line["uniform, agent's importance + recovery"] == "act, reconstruct: -1.50 [-2.50, -0.50]"
    # the agent's round was distilled (KD 100 steps), no uniform baseline was: the gap is not the planner's alone
    assert line["planner + distillation − best no recovery (pts)"] == "+5.00"
    assert line["planner + distillation − best + recovery (pts)"] == "+1.00"
    undistilled = [{**r, "finetune_steps": 0} for r in rows()]
    header, body = table1_matched(MODEL, undistilled)
    assert dict(zip(header, body[0], strict=True))["agent − best + recovery (pts)"] == "+1.00"


def test_matched_summary_without_accuracy_or_agent() -> None:
    untrained = [{**r, "accuracy": None, "paired": None} for r in rows()]
    header, body = table1_matched(MODEL, untrained)
    line = dict(zip(header, body[0], strict=True))
    assert line["best uniform, no recovery"] == "-" and line["planner + distillation − best no recovery (pts)"] == "-"
    assert table1_matched(MODEL, [r for r in rows() if r["method"] != "agent-prune"])[1] == []


def test_tradeoff_plot_draws_every_row() -> None:
    image = Image.open(io.BytesIO(tradeoff_plot(MODEL, rows())))
    assert image.size[0] > 400 and image.size[1] > 200


def _timed(method: str, latency_s: float, runtime: str, precision: str, params: int = 10_000) -> dict[str, Any]:
    return _row(method, 0.80, params, latency_s=latency_s, runtime=runtime, precision=precision)


def test_table3_splits_each_speed_up_into_runtime_precision_and_pruning() -> None:
    from tools.reporting.bench_tables import table3

    dyn = "int8 dynamic (MatMul/Gemm)"
    timed = [
        _timed("original", 8e-3, "pytorch", "fp32"),
        _timed("onnxruntime-fp32", 4e-3, "onnxruntime", "fp32"),
        _timed("openvino-fp32", 5e-3, "openvino", "fp32"),
        _timed("onnxruntime-quant", 2e-3, "onnxruntime", dyn),
        _timed("openvino-int8-quant", 2.5e-3, "openvino", "int8 static (NNCF)"),
        _timed("agent-quant", 2e-3, "onnxruntime", dyn),
        _timed("agent-prune+quant", 1e-3, "onnxruntime", dyn, params=5_000),
    ]
    header, body = table3(MODEL, timed)
    by_method = {line[1]: dict(zip(header, line, strict=True)) for line in body}
    final = by_method["agent-prune+quant"]
    assert final["speed-up vs FP32"] == "8.00x"
    assert (final["= runtime"], final["x precision"], final["x pruning"]) == ("2.00x", "2.00x", "2.00x")
    assert final["speed gain vs ONNX Runtime"] == "2.00x" and final["speed gain vs OpenVINO int8"] == "2.50x"
    ov = by_method["openvino-int8-quant"]
    assert (ov["= runtime"], ov["x precision"], ov["x pruning"]) == ("1.60x", "2.00x", "1.00x")
    assert by_method["agent-quant"]["note"].startswith("same export and quantize_dynamic as onnxruntime-quant")
    assert by_method["onnxruntime-quant"]["note"] == ""
