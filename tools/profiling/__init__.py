"""Profiling: static MACs and parameters (``static``), per-layer latency and operators (``dynamic``), grouping."""
