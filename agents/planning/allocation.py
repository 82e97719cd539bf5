"""The rules planner's allocation: per-unit ratios from the sensitivity profile under a damage budget, and the
patterns that name them (:func:`allocate`, :func:`exact_pattern`).

A unit's saving is what the objective ranks rounds by: its share of the model's parameters, or with the latency
objective its measured latency saving, interpolated between the measured points (:func:`unit_saving`); its damage is
the damage model's (:class:`~agents.planning.damage.DamageModel`).
"""

from __future__ import annotations

import itertools

from agents.planning.damage import DamageModel
from tools.compression.units import reachable_ratio, unit_kind
from tools.profiling.profile import exact_pattern
from tools.schemas import SensitivityProfile, SensitivityUnit

__all__ = [
    "ALLOCATION_RATIOS",
    "allocate",
    "exact_pattern",
    "interpolate",
    "next_reachable",
    "params_saved",
    "unit_saving",
]

#: Ratios the allocation may choose (those above the run's highest ratio are left out).
ALLOCATION_RATIOS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def interpolate(points: list[tuple[float, float]], ratio: float) -> float | None:
    """Piecewise-linear value at ``ratio`` through ``points`` (with (0, 0)); None beyond the last point."""
    xs = [(0.0, 0.0), *sorted(points)]
    for (r0, v0), (r1, v1) in itertools.pairwise(xs):
        if r0 <= ratio <= r1:
            return v0 if r1 == r0 else v0 + (v1 - v0) * (ratio - r0) / (r1 - r0)
    return None


def next_reachable(unit: SensitivityUnit, current: float, step: float) -> float | None:
    """The first ratio of ``unit`` past ``current`` in the direction of ``step`` (in steps of ``step``) that removes a
    different count; None when there is none within [0, 1]."""
    ratio = current
    for _ in range(int(1 / abs(step)) + 1):
        ratio = round(ratio + step, 4)
        if not 0.0 <= ratio <= 1.0:
            return None
        reached = reachable_ratio(unit, ratio)
        if reached != round(current, 4):
            return reached
    return None


def unit_saving(unit: SensitivityUnit, ratio: float, total_params: int, objective: str = "params") -> float | None:
    """What pruning ``unit`` at ``ratio`` saves, in what the objective ranks rounds by: its share of the model's
    parameters, or with the latency objective its measured latency saving (seconds, batch 1, in the runtime the
    original deploys to); interpolated between the measured points (None beyond the last).

    The parameters objective counted MACs too, as a stand-in for speed; that steered the damage away from where the
    parameters are. EfficientNet-Lite2 (260 px, `--max-accuracy-drop 2`): its mid-network blocks, 1.6 % of the
    parameters and the MACs of a 16x16 map, outranked its last stage's, 9.1 % each; the run kept 2.2 % fewer
    parameters, and 11.3 % with one last-stage block taken (the same rounds up to it).
    """
    if objective == "latency":
        saved = [(p.ratio, p.latency_saved_s) for p in unit.points]
    else:
        saved = [(p.ratio, p.params_saved / max(1, total_params)) for p in unit.points]
    return interpolate(saved, ratio)


def params_saved(sensitivity: SensitivityProfile, allocation: dict[str, float]) -> float:
    """The parameters an allocation (ratio by unit pattern) removes, from the measured points (units summed)."""
    units = {u.pattern: u for u in sensitivity.units}
    return sum(
        interpolate([(p.ratio, float(p.params_saved)) for p in units[pattern].points], ratio) or 0.0
        for pattern, ratio in allocation.items()
        if pattern in units
    )


def allocate(
    sensitivity: SensitivityProfile,
    total_params: int,
    damage_budget: float,
    max_ratio: float,
    objective: str = "params",
) -> tuple[dict[str, float], float]:
    """Per-unit ratios (by pattern) whose predicted damage together stays within ``damage_budget`` (a share of images
    that change class).

    Costs and the budget are the damage model's (:class:`~agents.planning.damage.DamageModel`: KL divergences that
    add, fitted to the flips). Greedy by saving per cost: at each step every unit may move from its ratio to any
    larger allowed one; the move with the best marginal saving per marginal cost (free moves first, by saving) is
    taken. Returns (ratio by unit pattern, predicted damage).
    """
    model = DamageModel.fit(sensitivity)
    budget = model.cost_of(damage_budget)
    options: dict[str, list[tuple[float, float, float]]] = {}  # pattern -> [(ratio, cost, saving)]
    for unit in sensitivity.units:
        choices = []
        kind = unit_kind(unit)
        for ratio in sorted({reachable_ratio(unit, r) for r in ALLOCATION_RATIOS} - {0.0}):
            if not kind.allowed(ratio, max_ratio):
                continue
            d, v = model.cost(unit, ratio), unit_saving(unit, ratio, total_params, objective)
            if d is not None and v is not None:
                choices.append((ratio, d, v))
        if choices:
            options[unit.pattern] = choices
    chosen: dict[str, tuple[float, float, float]] = {p: (0.0, 0.0, 0.0) for p in options}
    units = {u.pattern: u for u in sensitivity.units}
    profile_units = list(sensitivity.units)
    spent = 0.0
    while True:
        best: tuple[float, float, str, tuple[float, float, float]] | None = None
        taken = [units[p] for p, c in chosen.items() if c[0] > 0]
        for pattern, choices in options.items():
            _, d0, v0 = chosen[pattern]
            if chosen[pattern][0] == 0 and not unit_kind(units[pattern]).admits(units[pattern], taken, profile_units):
                continue
            for option in choices:
                ratio, d, v = option
                if ratio <= chosen[pattern][0] or v <= v0 or spent + (d - d0) > budget * (1 + 1e-9) + 1e-12:
                    continue
                gain, cost = v - v0, max(d - d0, 0.0)
                key = (gain / max(cost, 1e-9), gain)
                if best is None or key > best[:2]:
                    best = (*key, pattern, option)
        if best is None:
            break
        pattern, option = best[2], best[3]
        spent += max(option[1] - chosen[pattern][1], 0.0)
        chosen[pattern] = option
    return {p: c[0] for p, c in chosen.items() if c[0] > 0}, model.flips(spent)
