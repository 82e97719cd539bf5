"""The rules planner's damage model: flips fitted to KL over a profile, KL costs that add, convex in ratio."""

from __future__ import annotations

import math

import pytest

from agents.planning.allocation import allocate
from agents.planning.damage import DamageModel
from tools.schemas import SensitivityPoint, SensitivityProfile, SensitivityUnit


def _unit(
    name: str,
    kls: list[float],
    saved: int,
    scale: float = 0.3,
    exponent: float = 0.5,
    *,
    macs: int = 0,
    latency_s: float = 0.0,
) -> SensitivityUnit:
    """A unit measured at 0.3/0.6/0.9 whose flips follow ``scale * kl ** exponent`` exactly; ``saved`` parameters,
    ``macs`` MACs and ``latency_s`` seconds in all, a share of each removed by the ratio."""
    return SensitivityUnit(
        pattern=f"^{name}$",
        pruning_type="structured",
        modules=[name],
        size=100,
        points=[
            SensitivityPoint(
                ratio=r,
                params_saved=int(saved * r),
                macs_saved=int(macs * r),
                latency_saved_s=latency_s * r,
                agreement=1 - scale * kl**exponent,
                kl=kl,
            )
            for r, kl in zip((0.3, 0.6, 0.9), kls, strict=True)
        ],
    )


def _profile(*units: SensitivityUnit) -> SensitivityProfile:
    return SensitivityProfile(
        samples=256, importance="act", recovery="reconstruct", ratios=[0.3, 0.6, 0.9], seconds=1.0, units=list(units)
    )


def test_the_fit_recovers_the_power_law_and_converts_both_ways() -> None:
    profile = _profile(_unit("a", [0.001, 0.01, 0.1], 100), _unit("b", [0.004, 0.03, 0.2], 100))
    model = DamageModel.fit(profile)
    assert model.by_kl and model.exponent == pytest.approx(0.5) and model.scale == pytest.approx(0.3)
    assert model.cost_of(model.flips(0.02)) == pytest.approx(0.02)
    assert model.flips(0.01) == pytest.approx(0.03)


def test_costs_are_kl_convex_below_the_first_ratio_and_log_linear_between() -> None:
    unit = _unit("a", [0.01, 0.04, 0.16], 100)
    model = DamageModel.fit(_profile(unit))
    assert model.cost(unit, 0.0) == 0.0 and model.cost(unit, 0.3) == pytest.approx(0.01)
    assert model.cost(unit, 0.15) == pytest.approx(0.01 / 4)  # slope of the first two points, 2
    between = model.cost(unit, 0.45)
    assert between == pytest.approx(0.01 * 1.5**2)  # a power law through (0.3, 0.01) and (0.6, 0.04)
    assert model.cost(unit, 0.95) is None


def test_without_kl_the_flip_shares_are_the_costs() -> None:
    unit = SensitivityUnit(
        pattern="^a$",
        pruning_type="structured",
        modules=["a"],
        size=100,
        points=[SensitivityPoint(ratio=0.5, params_saved=1, agreement=0.9, kl=0.0)],
    )
    model = DamageModel.fit(_profile(unit))
    assert not model.by_kl and model.flips(0.1) == pytest.approx(0.1)
    assert model.cost(unit, 0.5) == pytest.approx(0.1) and model.cost(unit, 0.25) == pytest.approx(0.025)


def test_allocation_spreads_over_alike_units_instead_of_emptying_one() -> None:
    """Two alike units with convex damage: the same predicted damage buys more at moderate ratios on both."""
    a, b = _unit("a", [0.01, 0.04, 0.16], 1000), _unit("b", [0.01, 0.04, 0.16], 1000)
    profile = _profile(a, b)
    model = DamageModel.fit(profile)
    ratios, predicted = allocate(profile, total_params=2000, damage_budget=model.flips(0.02), max_ratio=0.9)
    assert ratios == {"^a$": pytest.approx(0.3), "^b$": pytest.approx(0.3)}
    assert predicted == pytest.approx(model.flips(0.02))
    assert math.isclose(sum(model.cost(u, ratios[u.pattern]) or 0 for u in (a, b)), 0.02)


def test_the_parameters_objective_spends_damage_where_the_parameters_are() -> None:
    """Alike damage: the unit holding parameters is taken, not the one holding MACs (EfficientNet-Lite2's last-stage
    blocks against its 16x16 ones); with the latency objective the measured latency saving decides."""

    kls = [0.01, 0.04, 0.16]
    late = _unit("late", kls, 900, macs=10, latency_s=1e-5)
    early = _unit("early", kls, 100, macs=990, latency_s=1e-3)
    profile = _profile(late, early)
    budget = DamageModel.fit(profile).flips(0.01)
    by_params, _ = allocate(profile, total_params=1000, damage_budget=budget, max_ratio=0.9)
    assert by_params == {"^late$": pytest.approx(0.3)}
    by_latency, _ = allocate(profile, total_params=1000, damage_budget=budget, max_ratio=0.9, objective="latency")
    assert by_latency == {"^early$": pytest.approx(0.3)}
