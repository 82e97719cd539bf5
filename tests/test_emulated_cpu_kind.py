"""The int8 tests again on the other CPU kind: an AVX2-only CPU without VNNI, emulated by QEMU.

Int8 accuracy depends on the CPU kind (``tools.deploy.cpu``): on CPUs without VNNI, 8-bit products are summed in
16-bit pairs that saturate. This machine may have VNNI; QEMU's user-mode emulator presents the program a different
CPU (``-cpu EPYC-Milan``: AMD Zen 3, AVX2, no AVX-512, no VNNI), whose ``cpuid`` NumPy, ONNX Runtime and OpenVINO
read, so their kernels take the non-VNNI paths and compute exactly as such a CPU does (only slower). The int8 unit
tests run under it, with the settings detected there. Skipped where ``qemu-x86_64`` is not installed (Debian's
``qemu-user``; ``.ci/run`` installs it) or on a non-x86 machine.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QEMU = shutil.which("qemu-x86_64")
#: A CPU model QEMU emulates with AVX2 and without AVX-512 and VNNI (the issue's AMD EPYC Zen 3).
CPU_MODEL = "EPYC-Milan"
#: The int8 tests whose thresholds must hold on every CPU kind.
INT8_TESTS = [
    "tests/unit/test_cpu_kind.py",
    "tests/unit/test_int8_cpu_kinds.py",
    "tests/unit/test_onnx_runtime.py::test_fp32_matches_torch_and_int8_stays_close",
    "tests/unit/test_openvino.py::test_int8_quantizes_convolutions_and_matmuls_and_agrees_with_fp32",
    "tests/unit/test_onnxruntime_static.py::test_static_int8_artifact_runs_and_mostly_agrees_with_fp32",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed (apt-get install qemu-user)"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="emulates an x86 CPU on an x86 host"),
]


def _emulated(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PROFILING_AGENT_INT8_CPU"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    assert QEMU is not None
    return subprocess.run(
        [QEMU, "-cpu", CPU_MODEL, sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _output(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).splitlines()
    return "\n".join(line for line in lines if "TCG doesn't support requested feature" not in line)[-4000:]


def test_the_emulated_cpu_is_detected_as_one_without_vnni() -> None:
    done = _emulated("-c", "from tools.deploy.cpu import detect_cpu; print(detect_cpu().kind)", timeout=300)
    assert done.returncode == 0, _output(done)
    assert done.stdout.strip().splitlines()[-1] == "no-vnni"


def test_int8_tests_pass_on_a_cpu_without_vnni() -> None:
    done = _emulated("-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *INT8_TESTS, timeout=1500)
    assert done.returncode == 0, _output(done)
    assert " passed" in done.stdout
