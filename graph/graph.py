"""The compiled graph served by ``langgraph dev`` (no checkpointer: the server brings its own)."""

from graph.builder import build_graph

graph = build_graph().compile(name="profiling-agent")
