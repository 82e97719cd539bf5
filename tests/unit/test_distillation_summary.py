"""The run's one line on distillation after the search (``agents.distillation.distillation_summary``): why it was
off, or how many rounds it distilled and why it stopped. A run that distilled nothing said nothing of it."""

from __future__ import annotations

from typing import Any

from agents.context import Context
from agents.distillation import distillation_summary
from tests.helpers import typed_state


def _round(index: int, params: int, drop: float, within: bool, speedup: float, **extra: Any) -> dict[str, Any]:
    metrics = {
        "params": params,
        "latency_s": 1.0,
        "accuracy": 0.9 - drop / 100,
        "artifact": f"r{index}",
        "deploy_speedup": speedup,
        "deploy_backend": "openvino-int8",
    }
    return {"round": index, "metrics": metrics, "accuracy_drop_points": drop, "within_budget": within, **extra}


def _state(macs: float = 4e7, rounds: list[dict[str, Any]] | None = None, **baseline: Any) -> Any:
    parts = baseline.pop("data_parts", {"calibration": 64, "evaluation": 400})
    return typed_state(
        {
            "dataset": "cifar10",
            "baseline": {"params": 100, "accuracy": 0.9, "data_parts": parts, **baseline},
            "profile_summary": {"total_macs": macs},
            "rounds": rounds
            if rounds is not None
            else [_round(0, 80, 0.2, True, 1.10), _round(1, 90, 1.8, False, 1.11)],
        }
    )


def test_a_run_that_distilled_nothing_says_why() -> None:
    """CIFAR Swin-tiny with --objective latency: its depth round timed 1.086x the original, the kept round 1.086x."""
    line = distillation_summary(_state(), Context(objective="latency"))
    assert line is not None and "0 distillation(s) made" in line
    assert "3 % faster than round 0, the kept one (1.10x the original in openvino-int8)" in line
    smaller = distillation_summary(_state(), Context())  # the parameter objective: round 1 is larger than round 0
    assert (
        smaller is not None
        and "none not distilled yet is smaller than round 0, the kept one (80 parameters)" in smaller
    )


def test_a_model_too_large_for_automatic_distillation_is_told_so() -> None:
    """EfficientNet-Lite2 at 260 px: 898 M MACs per image."""
    line = distillation_summary(_state(macs=8.98e8), Context())
    assert line is not None and line.startswith("distillation after the search: off: 898 M MACs per image")
    uncounted = distillation_summary(_state(macs=0), Context())
    assert uncounted is not None and "MACs were not counted" in uncounted
    few = distillation_summary(_state(data_parts={"calibration": 64, "evaluation": 50}), Context())
    assert few is not None and "at least 100 evaluation images" in few and "64 and 50" in few


def test_the_distillations_spent_are_counted() -> None:
    cross_fit = {"source_round": 1, "judged_on_half": 0, "images_per_student": 100, "students": []}
    rounds = [_round(0, 80, 0.2, True, 1.10), _round(1, 60, 1.8, False, 1.3), _round(2, 60, 0.1, True, 1.3)]
    rounds[2]["cross_fit"] = cross_fit
    line = distillation_summary(_state(rounds=rounds), Context(distill_rescues=1))
    assert line == "distillation after the search: 1 distillation(s) made of at most 1"


def test_students_that_took_fewer_steps_than_the_first_pair_are_said_so() -> None:
    """An AVX2-only CPU in FP32: CIFAR ResNet-20's first pair of 1,000-step students took 643 s of the 1,200."""
    from tools.schemas import CrossFitStudent

    def fitted(source: int, steps: int, seconds: float) -> dict[str, Any]:
        student = CrossFitStudent.model_construct(distilled={"steps": steps, "seconds": seconds / 2}, artifact="s")
        return {"source_round": source, "judged_on_half": 0, "images_per_student": 100, "students": [student] * 2}

    rounds = [_round(0, 80, 0.2, True, 1.10), _round(1, 60, 1.8, False, 1.3), _round(2, 60, 0.1, True, 1.3)]
    rounds += [_round(3, 50, 2.0, False, 1.4), _round(4, 50, 0.3, True, 1.4)]
    rounds[2]["cross_fit"], rounds[4]["cross_fit"] = fitted(1, 1000, 643.0), fitted(3, 300, 190.0)
    line = distillation_summary(_state(rounds=rounds), Context(distill_rescues=2))
    assert line is not None and line.startswith("distillation after the search: 2 distillation(s) made of at most 2")
    assert "(students of 1,000 steps, then 300: at the time the first pair took, 2 pairs of 1,000 would not fit" in line
    same = [*rounds[:4], {**rounds[4], "cross_fit": fitted(3, 1000, 640.0)}]
    assert "students of" not in (distillation_summary(_state(rounds=same), Context(distill_rescues=2)) or "")


def test_nothing_is_said_where_the_settings_turned_it_off_or_the_original_is_at_chance() -> None:
    assert distillation_summary(_state(), Context(distill_rescues=0)) is None
    assert distillation_summary(_state(), Context(finetune_steps=100)) is None
    assert distillation_summary(_state(), Context(prune=False)) is None
    assert distillation_summary(_state(at_chance=True), Context()) is None
