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


def pytest_configure(config: pytest.Config) -> None:
    """OpenVINO sends usage telemetry from processes forked off a thread (on import, on each conversion): under
    QEMU (tests/test_emulated_cpu_kind.py) such a fork hung the run. Declined here the way the tool declines it,
    before a test module imports openvino (``tools.deploy.openvino.convert.telemetry_declined``)."""
    from importlib.util import find_spec

    if find_spec("openvino") is not None:
        from tools.deploy.openvino.convert import openvino_module

        openvino_module()


REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PROFILING_AGENT_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (real data and models for development only)")
    return SHARED
