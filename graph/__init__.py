"""ProfilingAgent's LangGraph state machine: ``build_graph()`` returns the uncompiled StateGraph.

Names are resolved on first use, so importing ``graph`` for ``Context`` (``agents.context``: the run's settings)
never imports the builder, and so never the nodes themselves.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Context", "build_graph"]


def __getattr__(name: str) -> Any:
    if name == "build_graph":
        from graph.builder import build_graph

        return build_graph
    if name == "Context":
        from agents.context import Context

        return Context
    raise AttributeError(f"module 'graph' has no attribute {name!r}")
