"""Automatic distillation (``--finetune-steps auto``): steps from the model's MACs, images from what the
data leaves beside evaluation, and the run's first note saying what was decided."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.context import AUTO_STEPS
from graph import Context
from graph.cli import build_parser
from tests.helpers import digits_vit_report, typed_state
from tools.compression import distill_budget as distill
from tools.compression.distill_budget import (
    AUTO_DISTILL_IMAGES,
    AUTO_DISTILL_LR,
    AUTO_DISTILL_LR_ATTENTION,
    AUTO_DISTILL_STEPS,
    AUTO_FEATURE_WEIGHT,
    auto_distill_config,
    auto_distill_steps,
    auto_rescue_config,
    auto_rescue_plan,
    auto_rescues,
)


def test_steps_follow_the_macs_between_the_bounds() -> None:
    low, high = AUTO_DISTILL_STEPS
    assert auto_distill_steps(None) == 0 and auto_distill_steps(0) == 0  # no profile: nothing to size it by
    assert auto_distill_steps(10**6) == high  # a tiny model: the cap
    assert auto_distill_steps(127_881_866) == low  # CIFAR ResNet-56: the floor (about 490 s), never fewer
    assert low < auto_distill_steps(20_000_000) < high  # in between: about 150 s
    assert auto_distill_steps(20_000_000) > auto_distill_steps(30_000_000)  # more MACs, fewer steps
    assert auto_distill_steps(253_000_000) == 0  # CIFAR ResNet-110: its 300 steps would take over the limit
    assert auto_distill_steps(319_373_642) == 0  # a 224-px MobileNetV2


def test_auto_parses_from_the_command_line_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PROFILING_AGENT_FINETUNE_STEPS", raising=False)
    assert Context().finetune_steps == 0  # off unless asked for
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--finetune-steps", "auto"])
    assert args.finetune_steps == AUTO_STEPS
    assert (
        build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--finetune-steps", "7"]).finetune_steps
        == 7
    )
    monkeypatch.setenv("PROFILING_AGENT_FINETUNE_STEPS", "AUTO")
    assert Context().finetune_steps == AUTO_STEPS
    monkeypatch.setenv("PROFILING_AGENT_FINETUNE_STEPS", "0")
    assert Context().finetune_steps == 0


def _run(run_dir: Path, eval_samples: int) -> dict[str, Any]:
    return digits_vit_report(
        run_dir,
        iterations=0,
        eval_samples=eval_samples,
        calibration_samples=64,
        finetune_steps=AUTO_STEPS,
        batch_size=100,
    )


def test_a_cheap_model_with_images_to_spare_is_distilled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distill, "AUTO_DISTILL_IMAGES", (200, 4096))  # the digits' test split has 540 images
    monkeypatch.setattr(distill, "AUTO_DISTILL_STEPS", (10, 60))  # a tiny model would take the 1,000-step cap
    report = _run(tmp_path / "run", eval_samples=200)
    steps = auto_distill_steps(report["profile"]["total_macs"])
    assert steps > 0
    parts = report["baseline"]["data_parts"]
    # every image neither calibration, evaluation nor confirm
    assert parts["finetune"] == parts["total"] - 64 - 200 - parts["confirm"] > 0 and parts["confirm"] > 0
    tuned = report["rounds"][0]["prune_report"]["finetune"]
    assert tuned["steps"] == steps and tuned["samples"] == 64 + parts["finetune"]
    assert tuned["loss_last"] < tuned["loss_first"]
    assert report["profile"]["attention"] and tuned["lr"] == AUTO_DISTILL_LR_ATTENTION  # a transformer's rate
    assert f"distillation: automatic, {steps} steps after each prune on {tuned['samples']}" in report["notes"][0]


def test_too_few_images_beside_evaluation_turn_it_off_and_say_so(tmp_path: Path) -> None:
    report = _run(tmp_path / "run", eval_samples=200)
    assert not (report["rounds"][0]["prune_report"].get("finetune") or {}).get("steps")
    left = 64 + report["baseline"]["data_parts"]["finetune"]
    note = f"{left} unlabelled images are left for it beside evaluation, it needs {AUTO_DISTILL_IMAGES[0]:,}"
    assert any(n.startswith("distillation: off") and note in n for n in report["notes"])


def test_distillations_after_the_search_follow_the_macs() -> None:
    assert auto_rescues(None) == 0 and auto_rescues(253_000_000) == 0  # where automatic distillation is off
    # CIFAR ResNet-56: one pair of 1,000 steps would take 3,270 s estimated: one of 300 (980 s)
    assert auto_rescue_plan(127_881_866) == (1, 300)
    assert auto_rescue_plan(41_398_922) == (1, 300)  # CIFAR ResNet-20: 318 s a pair of 300 steps
    assert auto_rescue_plan(32_637_706) == (2, 359)  # the shared CIFAR ViT-tiny: 300 s a pair of 359
    assert auto_rescue_plan(5_247_242) == (4, 1000)  # the shared ResNet-tiny: 134 s a pair of 1,000 planned
    assert auto_rescue_plan(69_000_000) == (1, 300)  # a CIFAR ResNet-32: 530 s a pair of 300 steps
    assert auto_rescues(41_398_922) == auto_rescue_plan(41_398_922)[0]
    rescue, per_round = auto_rescue_config(41_398_922, seed=3), auto_distill_config(41_398_922, seed=3)
    assert rescue is not None and per_round is not None and auto_rescue_config(253_000_000) is None
    assert rescue.steps == 300 and rescue.model_copy(update={"steps": per_round.steps}) == per_round
    assert rescue.feature_weight == AUTO_FEATURE_WEIGHT > 0 and rescue.seed == 3
    # a transformer's students take the higher rate its measurements chose (a CNN's keeps its BatchNorm answers lower)
    assert rescue.lr == AUTO_DISTILL_LR < AUTO_DISTILL_LR_ATTENTION
    assert auto_rescue_config(41_398_922, attention=True) == rescue.model_copy(
        update={"lr": AUTO_DISTILL_LR_ATTENTION, "seed": 0}
    )
    assert auto_distill_config(32_637_706, attention=True).lr == AUTO_DISTILL_LR_ATTENTION  # type: ignore[union-attr]
    assert Context(distill_rescues=AUTO_STEPS).distill_rescues == AUTO_STEPS == Context().distill_rescues
    args = build_parser().parse_args(["run", "--model", "m", "--run-dir", "r", "--distill-rescues", "0"])
    assert args.distill_rescues == 0


def test_no_distillation_after_the_search_for_an_original_at_chance_level() -> None:
    """A sweep over unseen architectures (random weights) spent 60 s a distillation, four or five times, on models
    the run had already said score at chance: `auto` leaves them out; an explicit count is still honoured."""
    from agents.evaluation import rescue_config

    state = typed_state(
        {
            "dataset": "digits",
            "baseline": {"data_parts": {"calibration": 256, "evaluation": 2000}, "at_chance": False},
            "profile_summary": {"total_macs": 41_398_922},
        }
    )
    assert rescue_config(state, Context()) is not None
    assert state.baseline is not None
    state.baseline.at_chance = True
    assert rescue_config(state, Context()) is None
    assert rescue_config(state, Context(distill_rescues=2)) is not None


def test_students_shrink_only_where_auto_chose_the_count() -> None:
    """A slow first pair shortens the later students only to fit more pairs in auto's time: with
    ``--distill-rescues N`` the count is the user's, and the students keep their steps."""
    from agents.evaluation import rescue_config
    from tools.schemas import CrossFitStudent

    slow = CrossFitStudent.model_construct(distilled={"steps": 1000, "seconds": 330.0}, artifact="s")
    cross_fit = {"source_round": 0, "judged_on_half": 0, "images_per_student": 100, "students": [slow, slow]}
    state = typed_state(
        {
            "dataset": "cifar10",
            "baseline": {"params": 100, "accuracy": 0.9, "data_parts": {"calibration": 64, "evaluation": 400}},
            "profile_summary": {"total_macs": 41_398_922},
            "rounds": [
                {"round": 0, "metrics": {"params": 90, "latency_s": 1.0, "accuracy": 0.89, "artifact": "r0"}},
                {
                    "round": 1,
                    "metrics": {"params": 90, "latency_s": 1.0, "accuracy": 0.9, "artifact": "r1"},
                    "cross_fit": cross_fit,
                },
            ],
        }
    )
    auto, fixed = rescue_config(state, Context()), rescue_config(state, Context(distill_rescues=5))
    assert auto is not None and fixed is not None and (auto.steps, fixed.steps) == (300, 300)
