"""The deployment's decision is one pure function: the measured candidates and the rules in, one choice out, made by
named steps in order; the timings alone it needs are asked for, not made."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import deploy_row
from tools.deploy.decide import STEPS, DecisionRules, NeedTimes, decide
from tools.deploy.registry import FLOAT

ORIGINAL = "/run/models/original"


def _times(answers: dict[str, float]) -> dict[frozenset[str], dict[str, float]]:
    return {frozenset(answers): answers}


def test_the_decision_asks_for_the_timings_it_needs_and_is_the_same_given_them() -> None:
    rows = [
        deploy_row(FLOAT, 5.0, precision="fp32"),
        deploy_row("openvino-int8", 1.0),
        deploy_row("onnxruntime", 1.2),
        deploy_row("openvino-int8", 1.1, ORIGINAL),
        deploy_row("openvino", 3.0, ORIGINAL, precision="fp32"),
    ]
    rules = DecisionRules(original_dir=ORIGINAL, original_latency_s=5e-3)
    with pytest.raises(NeedTimes) as runoff:  # the two close ones are timed again alone first
        decide(rows, rules, {})
    close = {str(p): 1e-3 for p in runoff.value.models.values()}
    assert set(close) == {"/run/pruned/openvino-int8", "/run/pruned/onnxruntime"}
    close["/run/pruned/onnxruntime"] = 0.8e-3  # alone, ONNX Runtime is the faster
    alone = _times(close)
    with pytest.raises(NeedTimes) as floor:  # then the chosen build against the original's fastest one-command build
        decide(rows, rules, alone)
    assert set(map(str, floor.value.models.values())) == {"/run/pruned/onnxruntime", f"{ORIGINAL}/openvino-int8"}
    alone |= _times({"/run/pruned/onnxruntime": 0.8e-3, f"{ORIGINAL}/openvino-int8": 1.1e-3})
    decision = decide(rows, rules, alone)
    assert (decision.chosen, decision.source, decision.ships) == ("onnxruntime", None, "kept_round")
    assert [s.name for s in decision.steps] == [
        "fastest within the budget",
        "runoff of the close candidates, timed alone",
    ]
    assert decide(rows, rules, alone) == decision  # pure: the same inputs, the same choice
    assert all(c.alone_latency_s is None for c in rows), "the candidates given are not changed"
    assert {s for s, _ in STEPS} >= {step.name for step in decision.steps}


def test_nothing_within_the_budget_ships_the_original_as_it_is() -> None:
    rows = [deploy_row(FLOAT, 5.0, ok=False, precision="fp32"), deploy_row("openvino-int8", 1.0, ok=False)]
    decision = decide(rows, DecisionRules(original_dir=ORIGINAL, original_latency_s=5e-3), {})
    assert (decision.chosen, decision.source, decision.ships) == (FLOAT, ORIGINAL, "original")
    assert decision.steps[-1].name == "within the budget by construction"
    shipped = next(c for c in decision.candidates if c.source == ORIGINAL)
    assert shipped.within_budget and shipped.accuracy_drop_points == 0.0 and shipped.artifact == ORIGINAL


def test_a_forced_build_slower_than_the_originals_says_so(tmp_path: Path) -> None:
    prebuilt = tmp_path / "deploy-original"
    (prebuilt / "openvino-int8").mkdir(parents=True)
    rows = [deploy_row(FLOAT, 5.0, precision="fp32"), deploy_row("onnxruntime", 1.0)]
    rules = DecisionRules(
        original_dir=ORIGINAL, forced="onnxruntime", original_builds={"openvino-int8": str(prebuilt / "openvino-int8")}
    )
    with pytest.raises(NeedTimes) as need:
        decide(rows, rules, {})
    alone = _times({"/run/pruned/onnxruntime": 1.0e-3, str(prebuilt / "openvino-int8"): 0.7e-3})
    assert set(map(str, need.value.models.values())) == set(next(iter(alone)))
    decision = decide(rows, rules, alone)
    assert decision.chosen == "onnxruntime" and "--deploy onnxruntime forces it" in decision.why
    assert "is not 3 % faster than the original's openvino-int8" in decision.why
