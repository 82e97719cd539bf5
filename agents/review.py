"""Human approval: pause with LangGraph's ``interrupt()`` to show a plan; approve, edit or reject it.

Resume values (from ``profiling-agent resume --approve | --plan FILE | --reject`` or through the
LangGraph API as ``Command(resume=...)``): ``{"action": "approve"}``, ``{"action": "edit", "plan": {...}}``
or ``{"action": "reject"}``. An edited plan is validated against the model like an LLM's; an invalid
one is shown again with its errors.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import BaseModel, ValidationError

from agents.analysis import planning_context
from agents.common import need, settings
from agents.context import Context
from agents.planning.validation import validate_plan
from agents.state import State
from tools.schemas import OptimizationPlan, PlanResult, Review

HOW_TO_ANSWER = (
    'resume with {"action": "approve"}, {"action": "edit", "plan": {...}} or {"action": "reject"} '
    "(CLI: profiling-agent resume --run-dir DIR --approve | --plan FILE | --reject)"
)


class ReviewDecision(BaseModel):
    action: Literal["approve", "edit", "reject"]
    plan: OptimizationPlan | None = None


def _decision(answer: Any) -> tuple[ReviewDecision | None, list[str]]:
    try:
        decision = ReviewDecision.model_validate(answer)
    except ValidationError as exc:
        return None, [f"unreadable answer {answer!r}: {exc.errors()[0]['msg']}"]
    if decision.action == "edit" and decision.plan is None:
        return None, ["an edit needs a plan"]
    return decision, []


def review_plan(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    index = len(state.rounds)
    stage: Literal["analysis", "round"] = "analysis" if index == 0 else "round"
    planned = need(state.next_plan, "next_plan")
    errors: list[str] = []
    while True:
        answer = interrupt(
            {
                "stage": stage,
                "round": index,
                "source": planned.source,
                "plan": planned.plan.model_dump(),
                "errors": errors,
                "how_to_answer": HOW_TO_ANSWER,
            }
        )
        decision, errors = _decision(answer)
        if decision is None:
            continue
        if decision.action != "edit":
            return {"review": Review(stage=stage, round=index, action=decision.action)}
        assert decision.plan is not None
        errors = validate_plan(decision.plan, planning_context(state, ctx))
        if errors:
            continue
        edited = PlanResult(plan=decision.plan, source="human", planner_state={})
        update: dict[str, object] = {"next_plan": edited, "review": Review(stage=stage, round=index, action="edit")}
        if stage == "analysis":  # the analysis plan becomes the human's; the planner's own log stays
            update["plan"] = need(state.plan, "plan").model_copy(update={"plan": decision.plan, "source": "human"})
        return update
