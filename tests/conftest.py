"""Shared fixtures: tiny models built in memory, and the optional ../shared folder."""

from __future__ import annotations

import os
from pathlib import Path

# Tiny test models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP barriers
# make every op wait for a descheduled thread: one thread keeps the suite fast and steady.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PROFILING_AGENT_PROGRESS", "false")
# Full runs deploy with one backend unless a test asks for the measured choice (--deploy auto builds, evaluates
# and times every runtime: the tests of that choice set quant_backend="auto" themselves).
os.environ.setdefault("PROFILING_AGENT_QUANT_BACKEND", "torch-ao-dynamic")

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PROFILING_AGENT_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (real data and models for development only)")
    return SHARED
