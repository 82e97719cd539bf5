"""The operations exposed as LangChain tools work end to end on JSON arguments."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import save_tiny, tiny_vit
from tools.lc_tools import TOOLS


def test_tools_chain_from_acquisition_to_evaluation(tmp_path: Path) -> None:
    tools = {t.name: t for t in TOOLS}
    src = save_tiny(tiny_vit(), tmp_path / "src", 16)
    original = str(tmp_path / "original")
    info = tools["acquire_model_tool"].invoke({"model": str(src), "out_dir": original})
    assert info["family"] == "vit" and info["params"] > 0
    shape = tools["resolve_input_shape_tool"].invoke({"model_dir": original})
    assert (shape["channels"], shape["height"], shape["width"]) == (3, 16, 16)
    profile = tools["profile_model_tool"].invoke(
        {"model_dir": original, "input_shape": shape, "out_dir": str(tmp_path / "profile")}
    )
    assert profile["total_params"] == info["params"] and profile["groups"]
    plan = {
        "pruning_recommendations": [
            {"layer": r"mlp\.fc1$", "pruning_type": "structured", "pruning_ratio": 0.5, "justification": "test"}
        ]
    }
    report = tools["prune_model_tool"].invoke(
        {"model_dir": original, "plan": plan, "input_shape": shape, "out_dir": str(tmp_path / "pruned")}
    )
    assert report["params_after"] < report["params_before"]
    quant = tools["quantize_model_tool"].invoke(
        {
            "model_dir": str(tmp_path / "pruned"),
            "original_dir": original,
            "recommendations": [{"layer": "all", "dtype": "qint8"}],
            "out_dir": str(tmp_path / "q"),
        }
    )
    assert quant["layers"]
    metrics = tools["evaluate_model_tool"].invoke(
        {
            "model_dir": str(tmp_path / "q"),
            "original_dir": original,
            "input_shape": shape,
            "dataset": "digits",
            "samples": 20,
        }
    )
    assert metrics["params"] == report["params_after"] and 0 <= metrics["accuracy"] <= 1
