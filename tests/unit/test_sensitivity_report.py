"""The sensitivity profile in the reports: ranking, report.json, report.md and report.html."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tools.reporting.html import render_html
from tools.reporting.report import build_report, render_markdown, report_json
from tools.reporting.sensitivity_view import kl_text, middle_ratio, point_at, ranked_units
from tools.schemas import SensitivityPoint, SensitivityProfile, SensitivityUnit

HEAD0 = r"^vit\.layers\.0\.attention$"
HEAD1 = r"^vit\.layers\.1\.attention$"
FC1 = r"^vit\.layers\.0\.mlp\.fc1$"
ODD = r"^odd<b>|x$"
TOTAL = 20_000


def _point(ratio: float, saved: int, agreement: float, kl: float, drop: float | None = None) -> SensitivityPoint:
    return SensitivityPoint(
        ratio=ratio,
        params_saved=saved,
        macs_saved=10 * saved,
        latency_saved_s=1e-5 * ratio,
        agreement=agreement,
        kl=kl,
        accuracy_drop_points=drop,
    )


def sensitivity(with_accuracy: bool = True) -> SensitivityProfile:
    """Four units; at the middle ratio (0.5) KL per parameter saved ranks FC1 < HEAD1 < ODD < HEAD0."""
    drop = (lambda d: d) if with_accuracy else (lambda d: None)
    units = [
        SensitivityUnit(  # damaging: 0.2 / 1000
            pattern=HEAD0,
            pruning_type="head",
            modules=["vit.layers.0.attention"],
            size=4,
            params=4000,
            points=[_point(0.25, 1000, 0.91, 0.08, drop(6.25)), _point(0.5, 1000, 0.80, 0.2, drop(12.5))],
        ),
        SensitivityUnit(  # 0.01 / 1000; 0.25 of 2 heads rounds to 1 head: measured at 0.5
            pattern=HEAD1,
            pruning_type="head",
            modules=["vit.layers.1.attention"],
            size=2,
            params=4000,
            points=[_point(0.5, 1000, 0.99, 0.01, drop(0.5))],
        ),
        SensitivityUnit(  # cheapest: 0.004 / 2000
            pattern=FC1,
            pruning_type="structured",
            modules=["vit.layers.0.mlp.fc1"],
            size=64,
            params=8000,
            points=[
                _point(0.25, 1000, 0.998, 0.001, drop(0.0)),
                _point(0.5, 2000, 0.996, 0.004, drop(-0.25)),
                _point(0.75, 3000, 0.95, 0.05, drop(1.5)),
            ],
        ),
        SensitivityUnit(  # 0.1 / 1000: a pattern to escape
            pattern=ODD,
            pruning_type="structured",
            modules=["odd"],
            size=8,
            points=[_point(0.5, 1000, 0.9, 0.1, drop(3.0))],
        ),
    ]
    return SensitivityProfile(
        samples=64,
        importance="act",
        recovery="reconstruct",
        ratios=[0.75, 0.25, 0.5],
        seconds=12.34,
        units=units,
        skipped={r"^vit\.layers\.1\.mlp\.fc1$": "trace failed <here>"},
    )


def _report(sens: SensitivityProfile | None) -> dict[str, Any]:
    profile: dict[str, Any] = {"path": None, "total_params": TOTAL, "latency_s": 0.0004}
    if sens is not None:
        profile["sensitivity"] = sens.model_dump(mode="json")
    return {
        "model": {"spec": "tiny", "model_class": "ViT", "family": "vit", "source": "hub", "input_shape": None},
        "dataset": {"spec": "digits", "split": None, "label_match": None},
        "profile": profile,
        "settings": {},
    }


def test_ranking_is_kl_per_parameter_saved_at_the_middle_ratio() -> None:
    sens = sensitivity()
    assert middle_ratio(sens) == 0.5
    assert [u.pattern for u in ranked_units(sens)] == [FC1, HEAD1, ODD, HEAD0]
    # the point measured for a requested ratio is at what rounding leaves of it (1 of 2 heads for 25 %)
    assert point_at(sens.units[1], 0.25) is point_at(sens.units[1], 0.5) is sens.units[1].points[0]
    assert point_at(sens.units[1], 0.1) is None, "0.1 of 2 heads removes none: nothing measured"
    # a unit that removed nothing at the middle ratio is ranked by its nearest measured ratio
    lone = SensitivityUnit(
        pattern="^late$", pruning_type="structured", modules=["late"], size=2, points=[_point(0.75, 10, 0.5, 9.0)]
    )
    ranked = ranked_units(sens.model_copy(update={"units": [*sens.units, lone]}))
    assert ranked[-1].pattern == "^late$"


def test_markdown_table_rows_in_rank_order_with_values() -> None:
    text = render_markdown(_report(sensitivity()))
    assert "## Sensitivity: damage of pruning each unit alone" in text
    assert "64 calibration images" in text and "`act`" in text and "`reconstruct`" in text and "12.3 s" in text
    header = next(line for line in text.splitlines() if line.startswith("| unit | type | size |"))
    assert [c.strip(" |") for c in header.split(" | ")][3:] == [
        f"{r}: params saved / agreement / KL / Δacc (pts)" for r in ("25%", "50%", "75%")
    ]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    rows = [r for r in rows if "| head |" in r or "| structured |" in r]
    assert [re.search(r"`(.*?)`", r).group(1) for r in rows] == [FC1, HEAD1, ODD.replace("|", "\\|"), HEAD0]  # type: ignore[union-attr]
    fc1 = rows[0].split(" | ")
    assert fc1[1:3] == ["structured", "64"]
    # saved share of the 20,000 parameters / agreement / KL / change in points (a drop of -0.25 is a gain)
    assert fc1[3] == "5.0% / 99.8% / 0.0010 / +0.00"
    assert fc1[4] == "10.0% / 99.6% / 0.0040 / +0.25"
    assert fc1[5].rstrip(" |") == "15.0% / 95.0% / 0.0500 / -1.50"
    assert rows[1].split(" | ")[3] == "(at 50%) 5.0% / 99.0% / 0.0100 / -0.50"  # 25 % of 2 heads is 1 head
    assert "trace failed <here>" in text


def test_markdown_without_labels_or_sensitivity() -> None:
    text = render_markdown(_report(sensitivity(with_accuracy=False))).split("## Sensitivity", 1)[1]
    assert "Δacc" not in text and "5.0% / 99.8% / 0.0010 |" in text
    assert "Sensitivity" not in render_markdown(_report(None))


def test_html_section_ranks_escapes_and_groups_columns_by_ratio() -> None:
    page = render_html(_report(sensitivity()))
    assert '<section id="sensitivity">' in page and 'href="#sensitivity"' in page
    body = page.split('<section id="sensitivity">', 1)[1].split("</section>", 1)[0]
    titles = [html.unescape(t) for t in re.findall(r'<td><span title="([^"]*)">', body)]
    assert titles == [FC1, HEAD1, ODD, HEAD0]
    assert "<b>" not in body and "&lt;b&gt;" in body and "trace failed &lt;here&gt;" in body
    assert body.count('colspan="4"') == 3 and "50% pruned" in body
    fc1_row = body.split("<tr>")[3]  # two header rows, then the first unit
    cells = re.findall(r'<td class="num"[^>]*>(.*?)</td>', fc1_row)
    assert cells[0] == "64"
    assert re.sub(r"<[^>]+>", "", cells[1]) == "5.0%" and cells[2:4] == ["99.8%", "0.0010"]
    assert "+0.25" in cells[8] and cells[10] == "95.0%" and len(cells) == 13
    assert '<section id="sensitivity">' not in render_html(_report(None))


def test_build_report_copies_the_profile_sensitivity_into_report_json(tmp_path: Path) -> None:
    sens = sensitivity()
    profile_path = tmp_path / "profile" / "profile.json"
    profile_path.parent.mkdir()
    profile_path.write_text(json.dumps({"total_params": TOTAL, "sensitivity": sens.model_dump(mode="json")}))
    state = {
        "model_info": {"spec": "tiny", "model_class": "ViT", "family": "vit", "source": "hub"},
        "run_dir": str(tmp_path),
        "profile_path": str(profile_path),
        "profile_summary": {"total_params": TOTAL},
    }
    written = report_json(build_report(state, {}))
    assert SensitivityProfile.model_validate(written["profile"]["sensitivity"]) == sens
    assert written["profile"]["total_params"] == TOTAL
    profile_path.write_text(json.dumps({"total_params": TOTAL}))  # --no-sensitivity
    assert "sensitivity" not in report_json(build_report(state, {}))["profile"]


@pytest.mark.parametrize("ratios", [[], [0.5], [0.25, 0.5], [0.25, 0.5, 0.75]])
def test_middle_ratio(ratios: list[float]) -> None:
    sens = SensitivityProfile(samples=1, importance="l1", recovery="none", ratios=ratios, seconds=0)
    assert middle_ratio(sens) == ({0: None, 1: 0.5, 2: 0.5, 3: 0.5}[len(ratios)])


def test_a_summary_in_place_of_the_profile_is_not_a_table() -> None:
    """profile_summary's {"units": n, ...} is replaced by the whole profile in report.json; alone, it shows nothing."""
    report = _report(None)
    report["profile"]["sensitivity"] = {"units": 4, "samples": 64, "seconds": 1.0}
    assert "## Sensitivity" not in render_markdown(report)
    assert '<section id="sensitivity">' not in render_html(report)
    # the HTML page falls back to profile.json's copy
    page = render_html(report, {"sensitivity": sensitivity().model_dump(mode="json")})
    assert '<section id="sensitivity">' in page and "trace failed &lt;here&gt;" in page


def test_kl_text_reads_at_every_scale() -> None:
    assert [kl_text(v) for v in (0.0, 2.1e-5, 0.00049, 0.001, 0.25678)] == [
        "0",
        "2.1e-05",
        "0.00049",
        "0.0010",
        "0.2568",
    ]
