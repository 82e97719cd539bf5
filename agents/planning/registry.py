"""Planners by name: the ``--planner`` choices and a factory for each.

Factories import their planner when called, so this module is cheap to import (e.g. for a CLI's choices)
and every planner module is loaded only when it is used.
"""

from __future__ import annotations

from collections.abc import Callable

from agents.planning.base import Planner

__all__ = ["PLANNERS", "PlannerFactory", "get_planner", "planner_names"]

#: Builds a planner with its default settings (the LLM planner reads its settings from the environment).
PlannerFactory = Callable[[], Planner]


def _rules() -> Planner:
    from agents.planning.rules import RulesPlanner

    return RulesPlanner()


def _llm() -> Planner:
    from agents.planning.llm_planner import LLMPlanner

    return LLMPlanner()


#: Planner name -> factory. A run's LLM planner is built by :func:`agents.planning.llm_planner.llm_planner_for_run`.
PLANNERS: dict[str, PlannerFactory] = {"rules": _rules, "llm": _llm}


def planner_names() -> list[str]:
    """The registered planner names, in registration order (``rules`` first: the default)."""
    return list(PLANNERS)


def get_planner(name: str) -> Planner:
    """A new planner registered as ``name``; ``ValueError`` naming the choices for an unknown name."""
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}: choose one of {', '.join(PLANNERS)}") from None
    return factory()
