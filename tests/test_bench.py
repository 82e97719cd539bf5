"""`profiling-agent bench` on a tiny model: every method's row, the tables, CSV and plots.

Every uniform baseline appears twice, without recovery and with the run's recovery, at the same sizes,
evaluated on the agent run's evaluation images (disjoint from its calibration images).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from graph.cli import main
from tests.helpers import save_tiny, tiny_vit
from tools.text import slug

METHODS = {
    "original",
    "uniform",
    "agent-prune",
    "agent-quant",
    "agent-prune+quant",
    "onnxruntime-fp32",
    "onnxruntime-quant",
    "onnxruntime-static-quant",
    "openvino-fp32",
    "openvino-int8-quant",
}
# l1, l2 and random as in the paper, and the run's own importance (act) applied uniformly
CRITERIA = {"l1", "l2", "random", "act"}


def test_bench_writes_tables_and_plots(tmp_path: Path) -> None:
    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    out = tmp_path / "bench"
    argv = [
        "bench",
        "--model",
        str(model_dir),
        "--dataset",
        "digits",
        "--out",
        str(out),
        "--eval-samples",
        "30",
        "--calibration-samples",
        "64",
        "--iterations",
        "1",
        "--ratios",
        "0.1,0.3",
        "--max-accuracy-drop",
        "100",
        "--no-progress",
    ]
    assert main(argv) == 0
    bench = json.loads((out / "bench.json").read_text())
    rows = bench["models"][str(model_dir)]
    assert {r["method"] for r in rows} == METHODS
    for row in rows:
        assert set(row) >= {"accuracy", "params", "latency_s", "memory_mb", "recovery"} and row["latency_s"] > 0

    # the baselines saw the agent run's data parts: the same evaluation images, after 64 calibration images
    report = json.loads((out / "runs" / slug(str(model_dir)) / "report.json").read_text())
    assert bench["data_parts"][str(model_dir)] == report["baseline"]["data_parts"]
    assert bench["data_parts"][str(model_dir)]["calibration"] == 64

    uniform = [r for r in rows if r["method"] == "uniform"]
    assert {r["importance"] for r in uniform} == CRITERIA
    by = {(r["importance"], r["recovery"], r["ratio"]): r for r in uniform}
    assert len(by) == len(uniform) == len(CRITERIA) * 2 * 3  # 2 ratios and the matched one, with and without
    matched = {r["ratio"] for r in uniform if r["matched"]}
    assert len(matched) == 1 and 0.3 < matched.pop() < 1
    ratios = sorted({r["ratio"] for r in uniform})
    l1 = {ratio: by[("l1", "none", ratio)] for ratio in ratios}
    assert l1[0.3]["params"] < l1[0.1]["params"]
    for criterion in CRITERIA:
        for ratio in ratios:
            plain, repaired = by[(criterion, "none", ratio)], by[(criterion, "reconstruct", ratio)]
            # same size whichever criterion, with or without recovery; a different model all the same
            assert plain["params"] == repaired["params"] == l1[ratio]["params"]
            assert plain["matched"] == repaired["matched"] and plain["artifact"] != repaired["artifact"]
            recipe = json.loads((Path(repaired["artifact"]) / "artifact.json").read_text())["recipe"]
            assert recipe["recovery"]["method"] == "reconstruct" and recipe["recovery"]["reconstructed"]
            assert recipe["recovery"]["calibration_samples"] == 64 and recipe["importance"] == criterion
            recipe = json.loads((Path(plain["artifact"]) / "artifact.json").read_text())["recipe"]
            assert recipe["recovery"]["method"] == "none"
    agent = next(r for r in rows if r["method"] == "agent-prune")
    assert (agent["importance"], agent["recovery"]) == ("act", "reconstruct")
    at_agent = next(r for r in uniform if r["matched"])
    if abs(at_agent["params"] - agent["params"]) > 0.15 * agent["params"]:
        # the agent also narrowed heads, beyond any uniform ratio: the table says so when it is far
        assert at_agent["params"] > agent["params"]
        base = next(r for r in rows if r["method"] == "original")["params"]
        far = at_agent["params"] - agent["params"] > 0.02 * base
        assert ("the closest it reaches" in (out / "table1-matched.md").read_text()) == far

    for name in ("table1", "table1-matched", "table3", "table4"):
        assert (out / f"{name}.md").read_text().startswith("# Table")
        assert len(list(csv.reader((out / f"{name}.csv").open()))) > 1
    table1 = list(csv.DictReader((out / "table1.csv").open()))
    assert len(table1) == 2 + len(uniform)  # the original, the agent, every uniform baseline
    for line in table1:
        if line["method"] == "uniform":
            twin = next(
                t
                for t in table1
                if t["method"] == "uniform"
                and t["importance"] == line["importance"]
                and t["ratio"] == line["ratio"]
                and t["recovery"] != line["recovery"]
            )
            assert line["params (M)"] == twin["params (M)"] and line["Δparams"] == twin["Δparams"]
    (matched_line,) = list(csv.DictReader((out / "table1-matched.csv").open()))
    assert matched_line["agent"].startswith("act, reconstruct: ")
    assert matched_line["best uniform, no recovery"].split(",")[0] in {"l1", "l2", "random"}
    assert ", none: " in matched_line["best uniform, no recovery"]
    assert ", reconstruct: " in matched_line["best uniform + recovery"]
    assert matched_line["uniform, agent's importance + recovery"].startswith("act, reconstruct: ")
    # Table 3's values are bench.json's: each speed-up over PyTorch FP32, and its three factors multiply to it
    latency = {r["method"]: r["latency_s"] for r in rows if r["ratio"] is None}
    table3 = {line["method"]: line for line in csv.DictReader((out / "table3.csv").open())}
    assert set(table3) == METHODS - {"original", "uniform", "agent-prune"}
    for method, line in table3.items():
        assert line["speed-up vs FP32"] == f"{latency['original'] / latency[method]:.2f}x"
        assert line["speed gain vs ONNX Runtime"] == f"{latency['onnxruntime-quant'] / latency[method]:.2f}x"
        assert line["speed gain vs OpenVINO int8"] == f"{latency['openvino-int8-quant'] / latency[method]:.2f}x"
        factors = [float(line[k].rstrip("x")) for k in ("= runtime", "x precision", "x pruning")]
        product = factors[0] * factors[1] * factors[2]
        assert abs(product - latency["original"] / latency[method]) <= 0.02 * product + 0.01, line
    fp32 = {"onnxruntime": "onnxruntime-fp32", "openvino": "openvino-fp32", "pytorch": "original"}
    for method in ("onnxruntime-quant", "openvino-int8-quant", "onnxruntime-static-quant"):
        row = next(r for r in rows if r["method"] == method)
        reference = latency[fp32[row["runtime"]]]
        assert table3[method]["= runtime"] == f"{latency['original'] / reference:.2f}x"
        assert table3[method]["x precision"] == f"{reference / latency[method]:.2f}x"
    assert table3["agent-prune+quant"]["x pruning"] == f"{latency['agent-quant'] / latency['agent-prune+quant']:.2f}x"
    assert (out / "vit-tradeoffs.png").stat().st_size > 1000
    assert main(argv) == 0, "a second bench reuses the runs"
