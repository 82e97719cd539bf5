"""Evaluation: dataset sources and loading, label matching, accuracy, and cost (latency, throughput, size)."""
