"""How the LLM planner's loosely written plans are read: pruning types as models spell them."""

from __future__ import annotations

import pytest

from agents.planning.normalize import normalize_payload
from tools.schemas import OptimizationPlan


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("head", "head"),
        ("Attention heads", "head"),
        ("head_dim", "head_dim"),
        ("head dims", "head_dim"),
        ("Head width", "head_dim"),
        ("channels", "structured"),
        ("structured", "structured"),
    ],
)
def test_pruning_types_as_llms_write_them(written: str, read: str) -> None:
    payload = {"pruning_recommendations": [{"layer": "^a$", "pruning_type": written, "pruning_ratio": 0.3}]}
    plan = OptimizationPlan.model_validate(normalize_payload(payload, OptimizationPlan, []))
    assert plan.pruning_recommendations[0].pruning_type == read
