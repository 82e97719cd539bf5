"""ProfilingAgent's LangGraph state machine: ``build_graph()`` returns the uncompiled StateGraph."""

from graph.builder import build_graph
from graph.context import Context

__all__ = ["Context", "build_graph"]
