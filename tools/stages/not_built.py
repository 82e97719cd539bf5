"""The builds a deployment does not make, each with the row that says why: they cannot run faster than a build
already made (:func:`tools.stages.deployment.deploy` lists them in its table as not built)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from torch import nn

from tools.artifacts.io import load_module
from tools.deploy.base import PRECISION_BF16
from tools.deploy.choice import TIE_MARGIN, DeployCandidate
from tools.deploy.cpu import detect_cpu, resolve_target
from tools.deploy.registry import BACKENDS, float_reference_of
from tools.models.base import example_input
from tools.profiling.static import mac_shares
from tools.schemas import InputShape

__all__ = ["MIN_LINEAR_SHARE", "cannot_outrun_in_float", "linear_only_pointless", "off_target"]

#: Dynamic int8 of Linear layers is not built for a model whose Linear layers do less than this share of its MACs.
MIN_LINEAR_SHARE = 0.05


def _row(backend: str, why: str) -> DeployCandidate:
    """The table's row for ``backend``, not built, and why."""
    return DeployCandidate(
        backend=backend, runtime=BACKENDS[backend].runtime, precision=BACKENDS[backend].precision, skipped=why
    )


def linear_only_pointless(backends: list[str], source_dir: Path, shape: InputShape) -> list[DeployCandidate]:
    """Rows for the backends that quantize only Linear layers (dynamic int8) of a model whose Linear layers do less
    than :data:`MIN_LINEAR_SHARE` of its MACs (a CNN's classifier): no faster than float, not built."""
    linear_only = [b for b in backends if b in BACKENDS and tuple(BACKENDS[b].layer_kinds) == (nn.Linear,)]
    if not linear_only:
        return []
    share = mac_shares(load_module(source_dir), example_input(shape)).get(nn.Linear, 1.0)
    if share >= MIN_LINEAR_SHARE:
        return []
    why = f"it quantizes only Linear layers, which do {100 * share:.2g} % of this model's MACs (no faster than float)"
    return [_row(b, why) for b in linear_only]


def off_target(backends: list[str], int8_cpu: str) -> list[DeployCandidate]:
    """Rows for the bf16 backends when the deployment is built for CPUs without VNNI (``--int8-cpu no-vnni`` on a
    CPU with it): none of those computes bf16 (AVX512-BF16 and AMX came after VNNI), so there a bf16 model runs in
    FP32, and this CPU's bf16 timing says nothing of the target. Not built."""
    if resolve_target(int8_cpu) != "no-vnni" or detect_cpu().kind == "no-vnni":
        return []
    why = "built for CPUs without VNNI (--int8-cpu no-vnni), which compute no bf16: it would run in FP32 there"
    return [_row(b, why) for b in backends if b in BACKENDS and BACKENDS[b].precision == PRECISION_BF16]


def cannot_outrun_in_float(
    full: list[str],
    left_out: set[str],
    originals: Mapping[str, str],
    build: Callable[[str, bool], DeployCandidate],
    retime: Callable[[dict[str, Path]], dict[str, float]],
) -> tuple[dict[str, DeployCandidate], list[DeployCandidate], list[DeployCandidate]]:
    """The model's float builds in each runtime the original was built in before (``originals``), by backend; the
    original's (copies of those builds); and rows, not built, for the model's other builds in each runtime where its
    float build is not :data:`TIE_MARGIN` faster than the original's, the two timed alone together (``retime``).
    ``build(backend, of_the_original)`` builds one. Pruning's speed-up in a runtime's float build carries over to
    its int8 and bf16 builds, not more, so there they cannot outrun the original's builds, which a tie goes to
    (EfficientNet-Lite2's 3.5 % round: OpenVINO FP32 18.9 against 19.5 ms, its int8 8.11 against 8.16; its two NNCF
    builds cost 70 s of the run)."""
    floats = [b for b in full if b not in left_out and float_reference_of(b) == b and b in originals]
    own = {b: build(b, False) for b in floats}
    theirs = [build(b, True) for b in floats]
    paths = {f"model {b}": c.artifact for b, c in own.items()} | {f"original {c.backend}": c.artifact for c in theirs}
    ran = {name: Path(artifact) for name, artifact in paths.items() if artifact}
    times = retime(ran) if len(ran) > 1 else {}
    cannot_win: list[DeployCandidate] = []
    for b in floats:
        mine, original = times.get(f"model {b}"), times.get(f"original {b}")
        if mine is None or original is None or mine * (1.0 + TIE_MARGIN) <= original:
            continue
        why = (
            f"the model's {b} build ({1e3 * mine:.3f} ms) is not {100 * TIE_MARGIN:.0f} % faster than the "
            f"original's ({1e3 * original:.3f} ms) timed alone together, so no build of it in that runtime can "
            "outrun the original's (a tie goes to the original)"
        )
        cannot_win += [
            _row(o, why) for o in full if o != b and o not in left_out and o in BACKENDS and float_reference_of(o) == b
        ]
    return own, theirs, cannot_win
