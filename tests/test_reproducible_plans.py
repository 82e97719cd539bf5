"""Plans are reproducible from what is saved: nothing timed reaches the rules planner, the sensitivity profile is
deterministic, and two full runs of the same command write the same plans in every round."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from langgraph.checkpoint.memory import InMemorySaver

from agents.planning.base import PlanningContext, RoundRecord
from agents.planning.rules import RulesPlanner
from graph import Context, build_graph
from tests.helpers import planning_context, save_tiny, tiny_vit
from tools.compression.sensitivity import auto_samples, measure_sensitivity
from tools.compression.units import prunable_units
from tools.schemas import ModelProfile


@pytest.fixture(scope="module")
def vit_ctx() -> PlanningContext:
    """A tiny ViT's real profile and prunable layers, with a sensitivity profile measured on seeded images."""
    ctx = planning_context(tiny_vit(), 16)
    images = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    units = prunable_units(ctx.prunable, ctx.profile.layers)
    sensitivity = measure_sensitivity(tiny_vit(), images, units, layers=ctx.profile.layers)
    profile = ctx.profile.model_copy(update={"sensitivity": sensitivity})
    return PlanningContext(
        profile=profile, prunable=ctx.prunable, baseline_accuracy=0.9, max_accuracy_drop=1.0, max_ratio=0.6
    )


def _retimed(profile: ModelProfile, rng: random.Random) -> ModelProfile:
    """The same profile with every timed figure replaced by noise (latencies, their shares, saved latency)."""
    data = profile.model_dump()
    data["latency_s"] = rng.uniform(1e-4, 10.0)
    for row in [*data["layers"], *data["groups"]]:
        row["latency_s"], row["latency_share"] = rng.uniform(0.0, 1.0), rng.uniform(0.0, 1.0)
    for op in data["operators"]:
        op["self_cpu_time_s"] = op["cpu_time_total_s"] = rng.uniform(0.0, 1.0)
    for unit in (data.get("sensitivity") or {}).get("units", []):
        for point in unit["points"]:
            point["latency_saved_s"] = rng.uniform(0.0, 1.0)
    if data.get("sensitivity"):
        data["sensitivity"]["seconds"] = rng.uniform(0.0, 100.0)
    return ModelProfile.model_validate(data)


def _history(ctx: PlanningContext, rng: random.Random, rounds: int) -> list[RoundRecord]:
    """Rounds planned by the rules planner in turn, alternately within and beyond budget, with random latencies."""
    planner, history = RulesPlanner(), list[RoundRecord]()
    for i in range(rounds):
        now = PlanningContext(**{**ctx.__dict__, "history": history})
        result = planner.analyze(now) if i == 0 else planner.next_plan(now)
        history.append(
            RoundRecord(
                round=i,
                plan=result.plan,
                source=result.source,
                accuracy=0.9,
                params=1000 - 10 * i,
                latency_s=rng.uniform(1e-4, 1.0),
                within_budget=i % 3 != 2,
                planner_state=result.planner_state,
            )
        )
    return history


@pytest.mark.parametrize("with_sensitivity", [True, False])
def test_rules_plans_ignore_every_timing(vit_ctx: PlanningContext, with_sensitivity: bool) -> None:
    profile = vit_ctx.profile if with_sensitivity else vit_ctx.profile.model_copy(update={"sensitivity": None})
    ctx = PlanningContext(**{**vit_ctx.__dict__, "profile": profile})
    history = _history(ctx, random.Random(0), 4)
    plans = []
    for seed in range(3):
        rng = random.Random(seed + 10)
        noisy_history = [r.model_copy(update={"latency_s": rng.uniform(1e-4, 1.0)}) for r in history]
        noisy = PlanningContext(**{**ctx.__dict__, "profile": _retimed(profile, rng), "history": noisy_history})
        first = RulesPlanner().analyze(PlanningContext(**{**noisy.__dict__, "history": []}))
        plans.append((first.model_dump(), RulesPlanner().next_plan(noisy).model_dump()))
    assert plans[0][0]["plan"]["pruning_recommendations"], "the planner prunes something"
    assert plans[0] == plans[1] == plans[2], "a timing changed a plan, its order or its text"


def _macs_selected(profile: ModelProfile, pattern: str) -> int:
    """MACs of the layers a recommendation selects, or that sit inside a module it selects (heads)."""

    def selected(name: str) -> bool:
        parts = name.split(".")
        return any(re.search(pattern, ".".join(parts[:k])) for k in range(1, len(parts) + 1))

    return sum(lp.macs for lp in profile.layers if selected(lp.name))


def test_fallback_targets_rank_by_macs_not_latency(vit_ctx: PlanningContext) -> None:
    """Without a sensitivity profile, targets are ordered and weighted by MACs: the most MACs, the largest ratio."""
    profile = vit_ctx.profile.model_copy(update={"sensitivity": None})
    recs = RulesPlanner().analyze(PlanningContext(**{**vit_ctx.__dict__, "profile": profile})).plan
    macs = [_macs_selected(profile, r.layer) for r in recs.pruning_recommendations]
    ratios = [r.pruning_ratio for r in recs.pruning_recommendations]
    assert len(macs) >= 2 and macs == sorted(macs, reverse=True), "ordered by MACs"
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > ratios[-1], "weighted by MACs"
    texts = [r.justification for r in recs.pruning_recommendations + recs.quantization_recommendations]
    assert all("of MACs" in t and "latency" not in t for t in texts)


def test_sensitivity_profile_is_deterministic_and_leaves_the_rng_alone() -> None:
    model = tiny_vit()
    images = torch.randn(12, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    ctx = planning_context(model, 16)
    units = prunable_units(ctx.prunable, ctx.profile.layers)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = measure_sensitivity(model, images, units, ratios=(0.3, 0.6))
    assert torch.equal(torch.rand(3), expected_next), "the caller's RNG stream is not consumed"
    assert not torch.are_deterministic_algorithms_enabled(), "the deterministic mode is restored"
    second = measure_sensitivity(model, images, units, ratios=(0.3, 0.6))
    assert first.units and first.model_dump(exclude={"seconds"}) == second.model_dump(exclude={"seconds"})


def test_automatic_sample_count_follows_macs_only() -> None:
    # ViT-B/16 (17.6 GMACs, 24 units x 3 ratios): the floor; a CIFAR ViT (33 MMACs): every calibration image
    assert auto_samples(17_600_000_000, 72, 256) == 32
    assert auto_samples(33_000_000, 24, 256) == 256
    assert auto_samples(0, 24, 100) == 100
    assert auto_samples(128_000_000, 90, 256) == 102  # CIFAR ResNet-56: 30 units x 3 ratios
    assert auto_samples(320_000_000, 75, 256) == 49  # MobileNetV2 at 224 px: 25 units x 3 ratios


# --- two full runs of the same command ---------------------------------------------------------------------

TIMED = {"latency_s", "throughput_ips", "seconds", "artifact", "latency_saved_s", "self_cpu_time_s"}


def _untimed(value: Any) -> Any:
    """A saved record without its timings and paths (what may differ between two runs of the same command)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMED}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _noisy_timings(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Every profiled latency multiplied by a random factor (0.01x to 1000x): what a very noisy machine might see."""
    import tools.profiling.profile as profile_module

    rng = random.Random(seed)
    real_layers, real_model = profile_module.self_latencies, profile_module.model_latency

    def layers(*args: Any, **kwargs: Any) -> dict[str, float]:
        return {k: v * 10 ** rng.uniform(-2, 3) for k, v in real_layers(*args, **kwargs).items()}

    def whole(*args: Any, **kwargs: Any) -> float:
        return float(real_model(*args, **kwargs)) * 1000.0

    monkeypatch.setattr(profile_module, "self_latencies", layers)
    monkeypatch.setattr(profile_module, "model_latency", whole)


def _full_run(model: str, run_dir: Path) -> dict[str, Any]:
    ctx = Context(
        run_dir=str(run_dir),
        iterations=2,
        eval_samples=60,
        calibration_samples=48,
        batch_size=30,
        latency_repeats=2,
        max_accuracy_drop=2.0,
        quantize=False,
        progress=False,
        seed=3,
    )
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    graph.invoke({"model": model, "dataset": "digits"}, config, context=ctx, durability="sync")
    rounds = sorted((run_dir / "rounds").glob("round-*/round.json"))
    return {
        "plan": json.loads((run_dir / "plan.json").read_text()),
        "sensitivity": _untimed(json.loads((run_dir / "profile" / "sensitivity.json").read_text())),
        "rounds": [_untimed(json.loads(path.read_text())) for path in rounds],
    }


def test_two_runs_of_the_same_command_write_the_same_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = str(save_tiny(tiny_vit(), tmp_path / "vit", 16))
    a = _full_run(model, tmp_path / "A")
    _noisy_timings(monkeypatch, seed=1)  # run B's profile times nothing like run A's
    b = _full_run(model, tmp_path / "B")
    assert len(a["rounds"]) == 3 and a["plan"]["plan"]["pruning_recommendations"]
    assert a["plan"] == b["plan"], "the analysis plan differs"
    assert a["sensitivity"] == b["sensitivity"], "the sensitivity profile differs"
    for round_a, round_b in zip(a["rounds"], b["rounds"], strict=True):
        assert round_a["plan"] == round_b["plan"], f"round {round_a['round']}: plans differ"
        assert round_a["planner_state"] == round_b["planner_state"]
        assert round_a == round_b, f"round {round_a['round']}: results differ beyond timings"
    assert len({json.dumps(r["plan"], sort_keys=True) for r in a["rounds"]}) == 3, "each round planned anew"
