"""The HTML report and its charts: content, escaping, embedded PNGs, untrained models, a real run."""

from __future__ import annotations

import base64
import copy
import html
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tools.reporting import plots
from tools.reporting.html import load_profile, render_html, write_html_report

IMG_PREFIX = '<img src="data:image/png;base64,'
ATTN = r"^vit\.layers\.\d+\.attention$"
FC1 = r"^vit\.layers\.\d+\.mlp\.fc1$"
TRICKY = "heads <b>cost</b> 44% & \"more\" <script>alert('x')</script>"


def _metrics(acc: float | None, params: int, latency: float, memory: float, artifact: str, **extra: Any) -> dict:
    return {
        "accuracy": acc,
        "params": params,
        "macs": params * 18,
        "latency_s": latency,
        "memory_mb": memory,
        "artifact": artifact,
        **extra,
    }


def _plan(head: float, fc1: float, why: str = "attention is expensive") -> dict[str, Any]:
    return {
        "pruning_recommendations": [
            {"layer": ATTN, "pruning_type": "head", "pruning_ratio": head, "justification": why},
            {"layer": FC1, "pruning_type": "structured", "pruning_ratio": fc1, "justification": "fc1 is internal"},
        ],
        "quantization_recommendations": [
            {"layer": "all", "quantization_type": "dynamic", "dtype": "qint8", "justification": "Linear holds 87%"}
        ],
    }


def _round(n: int, acc: float | None, drop: float | None, params: int, within: bool, **state: Any) -> dict:
    return {
        "round": n,
        "source": state.pop("source", "rules"),
        "plan": _plan(0.25 * (n + 1), 0.1 * (n + 1)),
        "planner_state": {"level": 0.25 * (n + 1), **state},
        "metrics": _metrics(acc, params, 0.0004 - 0.00001 * n, params / 250000, f"/run/rounds/round-0{n}/model"),
        "accuracy_drop_points": drop,
        "within_budget": within,
        "prune_report": {
            "applied": [
                {"pattern": ATTN, "pruning_type": "head", "ratio": 0.25, "modules": [], "before": 8, "after": 6}
            ],
            "skipped": [{"target": "vit.layers.0.attention", "reason": "ratio 0.12 removes no head of 4"}],
            "params_before": 20000,
            "params_after": params,
        },
    }


@pytest.fixture()
def report() -> dict[str, Any]:
    """A report in build_report's shape: two rounds within budget, one over, an LLM rejection."""
    rejected = {"attempt": 1, "failure": "invalid", "reasons": ["ratio 0.9 > max <0.6>"], "plan": None}
    return {
        "model": {
            "spec": "org/tiny-vit",
            "source": "hub",
            "family": "vit",
            "model_class": "ViTForImageClassification",
            "untrained": False,
            "num_labels": 10,
            "params": 20000,
            "artifact": "/run/models/original",
            "input_shape": {"channels": 3, "height": 16, "width": 16, "source": "processor.size"},
        },
        "dataset": {"spec": "digits", "split": None, "label_match": {"mapping": {"0": 0}, "unmatched": ["ten"]}},
        "baseline": _metrics(0.9, 20000, 0.0004, 0.08, "/run/models/original", latency_measured="interleaved"),
        "pruned": _metrics(
            0.89,
            14000,
            0.0003,
            0.056,
            "/run/rounds/round-01/model",
            round=1,
            within_budget=True,
            accuracy_drop_points=1.0,
            latency_measured="interleaved",
        ),
        "quantized": {
            **_metrics(0.88, 14000, 0.00025, 0.03, "/run/models/quantized", accuracy_drop_points=2.0),
            **BUILD,
        },
        "quantized_original": {**_metrics(0.9, 20000, 0.00035, 0.04, "/run/models/quantized-original"), **BUILD},
        "rounds": [
            _round(0, 0.9, 0.0, 16000, True),
            _round(1, 0.89, 1.0, 14000, True, source="llm-repaired", attempts=2, rejected=[rejected]),
            _round(2, 0.5, 40.0, 9000, False),
        ],
        "plan": {"source": "rules", **_plan(0.25, 0.14, TRICKY), "planner_state": {"level": 0.25}},
        "profile": {"path": None, "latency_s": 0.0004, "total_macs": 360000, "total_params": 20000},
        "untrained": False,
        "notes": ["round 2: skipped <odd> & things"],
        "settings": {"max_accuracy_drop": 2.0, "selection": "accuracy", "iterations": 2, "planner": "llm"},
    }


@pytest.fixture()
def profile() -> dict[str, Any]:
    groups = [
        {"pattern": ATTN, "type": "ViTAttention", "count": 2, "latency_share": 0.44, "macs_share": 0.1},
        {"pattern": FC1, "type": "Linear", "count": 2, "latency_share": 0.2, "macs_share": 0.2},
        {"pattern": r"^(?:features\.0|features\.3)$", "type": "Conv2d", "count": 2, "latency_share": 1.7},
        {"pattern": r"^classifier$", "type": "Linear", "count": 1, "latency_share": 0.01, "macs_share": 0.001},
    ]
    return {"device": "cpu", "latency_s": 0.0004, "groups": groups}


#: The build the fixture's deployed model and original's build record.
BUILD = {"backend": "openvino-int8", "runtime": "openvino", "precision": "int8 static (NNCF)"}
DEPLOYED = "deployed: pruned, openvino int8 static (NNCF)"
ORIGINAL_BUILD = "original, openvino int8 static (NNCF)"


def html_escaped(text: str) -> str:
    return html.escape(text, quote=True)


def _images(page: str) -> list[Image.Image]:
    found = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(data))) for data in found]


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_page_has_summary_rounds_and_escaped_text(report: dict[str, Any], profile: dict[str, Any]) -> None:
    page = render_html(report, profile)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for label in ("original", "best pruned", DEPLOYED, ORIGINAL_BUILD):
        assert f"<td>{label}" in page, label
    assert "90.00%" in page and "89.00%" in page and "-1.00" in page  # accuracy and its change in points
    assert "1.33×" in page  # speed-up of best pruned: 0.4 ms / 0.3 ms
    assert "30.0%" in page  # memory saved by the best pruned model
    # justifications, escaped; nothing from the report reaches the page as markup
    assert html_escaped(TRICKY) in page
    assert "<script>" not in page and "<b>cost</b>" not in page
    assert "fc1 is internal" in page and "Linear holds 87%" in page
    assert "vit.layers.*.attention" in page and html_escaped(ATTN) in page
    # rounds: budget badges, the skipped target, the best round marked
    assert page.count("within budget</span>") >= 2 and "over budget</span>" in page
    assert "ratio 0.12 removes no head of 4" in page and "(8→6 heads)" in page
    # planner decisions: the rejected LLM plan and its reason
    assert "llm-repaired" in page and html_escaped("ratio 0.9 > max <0.6>") in page
    assert html_escaped("round 2: skipped <odd> & things") in page
    assert "/run/models/quantized-original" in page and "/run/rounds/round-02/model" in page
    assert "UNTRAINED" not in page
    assert "http://" not in page and "https://" not in page  # self-contained


def test_charts_are_embedded_pngs_of_sensible_size(report: dict[str, Any], profile: dict[str, Any]) -> None:
    page = render_html(report, profile)
    assert page.count(IMG_PREFIX) == 2
    images = _images(page)
    assert len(images) == 2
    for image in images:
        assert image.format == "PNG"
        assert 600 <= image.width <= 1400 and 300 <= image.height <= 800


def test_without_profile_the_latency_chart_is_left_out(report: dict[str, Any]) -> None:
    page = render_html(report, None)
    assert page.count(IMG_PREFIX) == 1
    assert "No profile available" in page


def test_untrained_report_has_banner_and_charts(report: dict[str, Any], profile: dict[str, Any]) -> None:
    untrained = copy.deepcopy(report)
    untrained["untrained"] = True
    untrained["model"]["untrained"] = True
    for key in ("baseline", "pruned", "quantized", "quantized_original"):
        untrained[key]["accuracy"] = None
        untrained[key].pop("accuracy_drop_points", None)
    for r in untrained["rounds"]:
        r["metrics"]["accuracy"] = None
        r["accuracy_drop_points"] = None
        r["within_budget"] = True
    page = render_html(untrained, profile)
    assert "UNTRAINED model (random weights)" in page
    assert "n/a" in page and "Accuracy was not measured" in page
    assert "size against latency instead" in page
    assert len(_images(page)) == 2
    chart = _png(plots.tradeoff_charts(untrained))
    assert chart.size == (900, 500)


def test_over_budget_report_says_so(report: dict[str, Any]) -> None:
    report["pruned"] = {**report["baseline"], "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
    page = render_html(report, None)
    assert "No pruned candidate stayed within the accuracy budget" in page


def test_missing_stages_render(report: dict[str, Any]) -> None:
    report.update(pruned=None, quantized=None, rounds=[])
    page = render_html(report, None)
    assert "No pruning round ran." in page and "<td>deployed" not in page
    assert page.count(IMG_PREFIX) == 1


def test_write_html_report_and_load_profile(report: dict[str, Any], profile: dict[str, Any], tmp_path: Path) -> None:
    profile_path = tmp_path / "profile" / "profile.json"
    profile_path.parent.mkdir()
    profile_path.write_text(json.dumps(profile))
    report["profile"]["path"] = str(profile_path)
    assert load_profile(report) == profile
    out = write_html_report(report, load_profile(report), tmp_path / "report.html")
    assert out == tmp_path / "report.html"
    assert out.read_text(encoding="utf-8").count(IMG_PREFIX) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    report["profile"]["path"] = str(tmp_path / "missing.json")
    assert load_profile(report) is None


# --- charts ---------------------------------------------------------------------------------------


def test_layer_latency_chart_is_a_deterministic_png(profile: dict[str, Any]) -> None:
    data = plots.layer_latency_chart(profile)
    assert data == plots.layer_latency_chart(profile)
    image = _png(data)
    assert image.width == 900 and 300 <= image.height <= 600


def test_tradeoff_chart_size_and_points(report: dict[str, Any]) -> None:
    image = _png(plots.tradeoff_charts(report))
    assert image.size == (900, 500)
    points = plots.tradeoff_points(report)
    series = [s for s, _, _ in points]
    assert series.count("round (within budget)") == 2 and series.count("round (over budget)") == 1
    assert {"original", "best pruned", DEPLOYED, ORIGINAL_BUILD} <= set(series)
    assert [note for _, note, _ in points if note] == ["R0", "R1", "R2"]


def test_an_original_deployed_is_named_so(report: dict[str, Any]) -> None:
    """When the deployment chose the unpruned original's runtime, its row and chart point say so; a float build is
    named by its precision, never "quantized"."""
    report["quantized"] = {**report["quantized"], "source": "/run/models/original", "precision": "fp32"}
    page = render_html(report, None)
    label = "deployed: original, openvino fp32"
    assert f"<td>{label}" in page and "<td>deployed: pruned" not in page and "quantized (deployed)" not in page
    assert label in {s for s, _, _ in plots.tradeoff_points(report)}
    _png(plots.tradeoff_charts(report))


def test_an_entry_without_its_build_keeps_the_old_names(report: dict[str, Any]) -> None:
    """A report written before entries recorded their build still renders, with the generic names."""
    for key in ("quantized", "quantized_original"):
        report[key] = {k: v for k, v in report[key].items() if k not in BUILD}
    page = render_html(report, None)
    assert "<td>deployed" in page and "<td>original quantized" in page


def test_generic_charts_handle_empty_input(tmp_path: Path) -> None:
    assert _png(plots.share_bar_chart([], title="nothing")).size == (900, 500)
    assert _png(plots.scatter_panels([], title="nothing")).size == (900, 500)
    panel = plots.Panel([plots.Point(1.0, 2.0, "a", "p1"), plots.Point(1.0, 2.0, "b")], "x", "y")
    data = plots.scatter_panels([panel], title="one point twice", footnote="same place")
    target = plots.save_png(data, tmp_path / "charts" / "c.png")
    assert _png(target.read_bytes()).size == (900, 500)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (ATTN, "vit.layers.*.attention"),
        (r"^classifier$", "classifier"),
        (r"^(?:features\.0|features\.3|features\.6)$", "features.0 (+2)"),
        (r"^$", "(model)"),
        (
            r"^swin\.encoder\.layers\.\d+\.blocks\.\d+\.attention\.self\.query$",
            "…layers.*.blocks.*.attention.self.query",
        ),
    ],
)
def test_short_pattern(pattern: str, expected: str) -> None:
    assert plots.short_pattern(pattern) == expected
    assert len(plots.short_pattern(pattern, max_len=20)) <= 20


# --- a real run -----------------------------------------------------------------------------------


def test_real_run_renders(tmp_path: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from graph import Context, build_graph
    from tests.helpers import save_tiny, tiny_vit

    model_dir = save_tiny(tiny_vit(), tmp_path / "vit", 16)
    run_dir = tmp_path / "run"
    ctx = Context(run_dir=str(run_dir), iterations=1, eval_samples=20, batch_size=20, latency_repeats=2, progress=False)
    graph = build_graph().compile(checkpointer=InMemorySaver())
    graph.invoke(
        {"model": str(model_dir), "dataset": "digits"},
        {"configurable": {"thread_id": "html"}, "recursion_limit": 100},
        context=ctx,
        durability="sync",
    )
    report = json.loads((run_dir / "report.json").read_text())
    profile = load_profile(report)
    assert profile is not None and profile["groups"]
    page = write_html_report(report, profile, run_dir / "report.html").read_text(encoding="utf-8")
    assert len(_images(page)) == 2
    for rec in report["plan"]["pruning_recommendations"]:
        assert html_escaped(rec["justification"]) in page
    assert page.count("<tr") >= 1 + 4 + 1 + len(report["rounds"])
