"""What every planner shares: the records it reads and writes, and the :class:`Planner` protocol.

A planner turns a profile (and, in the iterative loop, the earlier rounds) into an
:class:`~tools.schemas.OptimizationPlan`. :mod:`agents.planning.rules` holds the offline rules planner,
:mod:`agents.planning.llm_planner` the LLM planner, :mod:`agents.planning.registry` the names they go by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, Field

from tools.compression.recipes import PruningConfig
from tools.compression.reports import PrunableLayers
from tools.schemas import ModelProfile, OptimizationPlan, PlanResult, RoundResult

__all__ = ["PlanResult", "Planner", "PlanningContext", "RoundRecord"]


class RoundRecord(BaseModel):
    """What a planner sees of one finished round."""

    round: int
    plan: OptimizationPlan
    source: str
    accuracy: float | None = None
    accuracy_drop_points: float | None = None
    budget_drop_points: float | None = Field(
        default=None, description="What the budget test held against the budget: the drop plus one standard error."
    )
    params: int
    latency_s: float
    within_budget: bool
    planner_state: dict[str, Any] = Field(default_factory=dict)
    distilled_from: int | None = Field(
        default=None,
        description="The round whose model this round distilled after the search (cross-fitted); None: pruned.",
    )
    predicted_damage: float | None = Field(
        default=None, description="Share of images whose top-1 answer the plan's damage model predicted would change."
    )
    measured_damage: float | None = Field(
        default=None, description="Share of the evaluation images whose top-1 answer changed (1 - agreement)."
    )
    layers_removed: int = Field(default=0, description="Blocks the round removed whole, as pruning applied them.")

    @classmethod
    def of(cls, result: RoundResult) -> RoundRecord:
        """The planner's view of an evaluated round."""
        from agents.planning.selection import budget_drop_points, layers_removed

        m = result.metrics
        return cls(
            round=result.round,
            plan=result.plan,
            source=result.source,
            accuracy=m.accuracy,
            accuracy_drop_points=result.accuracy_drop_points,
            budget_drop_points=budget_drop_points(result.accuracy_drop_points, m.paired),
            params=m.params,
            latency_s=m.latency_s,
            within_budget=result.within_budget,
            planner_state=result.planner_state,
            distilled_from=result.cross_fit.source_round if result.cross_fit is not None else None,
            predicted_damage=result.planner_state.get("predicted_damage"),
            measured_damage=None if m.paired is None else round(1.0 - m.paired.agreement, 6),
            layers_removed=layers_removed(result),
        )


#: The highest per-unit ratio a plan may use unless the run says (``--max-pruning-ratio``): the pruning recipe's.
MAX_RATIO: float = PruningConfig.model_fields["max_ratio"].default


@dataclass(frozen=True)
class PlanningContext:
    """What a planner knows besides the profile."""

    profile: ModelProfile
    prunable: PrunableLayers
    """What the model can prune, each unit kind's modules (a dict from ``ops.prunable`` is read as one)."""
    baseline_accuracy: float | None
    max_accuracy_drop: float
    max_ratio: float = MAX_RATIO
    history: list[RoundRecord] = field(default_factory=list)
    #: The run's importance criterion and training-free recovery (``None``: not known to the planner).
    importance: str | None = None
    recovery: str | None = None
    #: The share of the accuracy budget kept for int8 (points; ``accuracy_budget``): what int8 decisions work within.
    int8_reserve_points: float = 0.0
    #: After a round distilled after the search came back within budget: the drop before distillation (points) the
    #: next one can be expected to bring back (``selection.distillation_target``); None otherwise.
    distillation_target_points: float | None = None
    #: The unit kinds plans may use (``--unit-kinds``); empty: every one.
    kinds: tuple[str, ...] = ()
    #: What the planner's steps aim at (``--objective``): params (parameters and MACs) or latency (measured).
    objective: str = "params"
    #: Whether distillation after the search takes rounds over the budget (``--distill-rescues``, on and affordable).
    distills: bool = False

    def allows(self, pruning_type: str) -> bool:
        """Whether a plan may use the unit kind ``pruning_type``."""
        return not self.kinds or pruning_type in self.kinds

    def __post_init__(self) -> None:
        object.__setattr__(self, "prunable", PrunableLayers.model_validate(self.prunable))


class Planner(Protocol):
    """Writes the first plan from the profile (:meth:`analyze`) and each later round's (:meth:`next_plan`)."""

    name: str

    def analyze(self, ctx: PlanningContext) -> PlanResult: ...

    def next_plan(self, ctx: PlanningContext) -> PlanResult: ...
