"""The deployment choice: the fastest runtime within the budget, never one slower than the original FP32 model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools.deploy.choice import DeployCandidate, DeployChoice, available_backends, choose
from tools.deploy.registry import FLOAT
from tools.schemas import InputShape, PairedAccuracy


def _c(backend: str, latency_ms: float | None, ok: bool = True, error: str | None = None) -> DeployCandidate:
    return DeployCandidate(
        backend=backend,
        runtime="r",
        precision="p",
        latency_s=None if latency_ms is None else latency_ms / 1e3,
        within_budget=ok,
        error=error,
    )


def _fake_measure(built: list[tuple[str | None, str]], over: set[tuple[str | None, str]]) -> Callable[..., Any]:
    """A stand-in for ``tools.stages.deployment._measure``: an OpenVINO row for each backend asked for, recording
    ``(source, backend)`` in ``built``; over the budget for the pairs in ``over``."""

    def measure(backend: str, source_dir: Path, artifact_dir: Path, *, source: str | None = None, **_: Any) -> Any:
        built.append((source, backend))
        precision = "int8" if "int8" in backend else "bf16" if "bf16" in backend else "fp32"
        return DeployCandidate(
            backend=backend,
            runtime="openvino",
            precision=precision,
            source=source,
            artifact=str(artifact_dir),
            within_budget=(source, backend) not in over,
            accuracy=0.8,
        )

    return measure


def test_fastest_within_budget_wins() -> None:
    candidates = [
        _c(FLOAT, 3.0),
        _c("onnxruntime", 1.2),
        _c("openvino-int8", 0.9),
        _c("onnxruntime-static", 0.5, ok=False),
    ]
    chosen, why = choose(candidates, original_latency_s=4e-3)
    assert chosen == "openvino-int8"
    assert "fastest within the accuracy budget" in why and "onnxruntime-static" in why  # named as over budget


def test_never_slower_than_the_original_fp32_model() -> None:
    chosen, why = choose([_c(FLOAT, 5.0), _c("onnxruntime", 4.5)], original_latency_s=4e-3)
    assert chosen == FLOAT and "not faster than the original FP32 model" in why
    chosen, _ = choose([_c(FLOAT, 3.0), _c("onnxruntime", 3.5)], original_latency_s=4e-3)
    assert chosen == FLOAT  # the pruned float model is the fastest


def test_failed_and_over_budget_candidates_are_not_deployed() -> None:
    candidates = [_c(FLOAT, 3.0), _c("openvino", None, error="boom"), _c("onnxruntime", 1.0, ok=False)]
    chosen, why = choose(candidates, original_latency_s=4e-3)
    assert chosen == FLOAT and "could not run: openvino" in why
    chosen, why = choose([_c("onnxruntime", 1.0, ok=False)], original_latency_s=4e-3)
    assert chosen == FLOAT and "no runtime candidate" in why


def test_available_backends_lists_float_first_and_only_importable_ones() -> None:
    names = available_backends(["torch-ao-dynamic", "onnxruntime", "openvino"], lambda n: n != "openvino")
    assert names == [FLOAT, "torch-ao-dynamic", "onnxruntime"]


def test_without_data_static_int8_is_calibrated_on_synthetic_inputs(tmp_path: Path) -> None:
    """An untrained built-in has no dataset: static int8 still runs (latency, memory) and the table says on what."""
    from tests.helpers import save_tiny, tiny_vit
    from tools.stages import ops
    from tools.stages.deployment import deploy

    source = save_tiny(tiny_vit(), tmp_path / "src", 16)
    original = tmp_path / "run" / "models" / "original"
    ops.acquire(str(source), original)
    shape = ops.resolve_input_shape(original)
    spec = ops.EvalSpec(dataset=None, samples=10, progress=False)
    choice = deploy(
        original,
        original,
        [],
        tmp_path / "run" / "models" / "deploy",
        shape,
        spec,
        backends=[FLOAT, "onnxruntime-static"],
        within_budget=lambda drop, paired, z=1.0: True,
        baseline_accuracy=None,
        repeats=3,
    )
    static = next(c for c in choice.candidates if c.backend == "onnxruntime-static")
    assert static.error is None and static.latency_s is not None and static.accuracy is None
    assert "synthetic" in choice.calibration
    assert choice.chosen in {FLOAT, "onnxruntime-static"}


def test_backends_over_budget_are_built_again_from_a_round_with_more_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The best round's candidates all fail the budget: the headroom round's are built, timed with them, and
    the choice says which model the deployed one was built from."""
    from tests.helpers import save_tiny, tiny_vit
    from tools.stages import deployment as deployment_module
    from tools.stages import ops
    from tools.stages.deployment import deploy

    # each candidate keeps the answer its measurement got (the count of tries is test_the_budget_test_counts_...)
    monkeypatch.setattr(deployment_module, "judge_together", lambda candidates, *_: len(candidates))

    original = tmp_path / "run" / "models" / "original"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "src", 16)), original)
    headroom = tmp_path / "run" / "rounds" / "round-02" / "model"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "src2", 16)), headroom)
    calls: list[int] = []

    def budget(drop: float | None, paired: object, z: float = 1.0) -> bool:  # the best round's two candidates fail
        calls.append(1)
        return len(calls) > 2

    shape = ops.resolve_input_shape(original)
    choice = deploy(
        original,
        original,
        [],
        tmp_path / "run" / "models" / "deploy",
        shape,
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=[FLOAT, "onnxruntime-fp32"],
        within_budget=budget,
        baseline_accuracy=None,
        repeats=3,
        alternatives=[headroom],
    )
    rebuilt = [c for c in choice.candidates if c.source is not None]
    assert [(c.backend, c.source, c.within_budget) for c in rebuilt] == [
        (FLOAT, str(headroom), True),
        ("onnxruntime-fp32", str(headroom), True),
    ]
    assert [c.key for c in rebuilt] == ["torch (round-02)", "onnxruntime-fp32 (round-02)"]
    assert all(c.latency_s for c in choice.candidates)  # all timed together
    assert choice.source == str(headroom) or (choice.chosen == FLOAT and "not faster" in choice.why)
    assert "round-02" in choice.why or choice.chosen == FLOAT


def test_a_headroom_candidate_is_chosen_by_its_own_latency() -> None:
    fast = _c("onnxruntime", 0.8).model_copy(update={"source": "/run/rounds/round-02/model"})
    chosen, why = choose([_c(FLOAT, 3.0), _c("onnxruntime", 0.5, ok=False), fast], original_latency_s=4e-3)
    assert chosen == "onnxruntime" and why.startswith("onnxruntime (round-02) (r, p) is the fastest")
    assert "over the accuracy budget: onnxruntime" in why


def test_another_source_is_deployed_only_when_clearly_faster() -> None:
    """The unpruned original (or a round with more headroom) replaces the best model's candidate only when at least
    ALTERNATIVE_MARGIN faster: a pruned model that ties keeps its smaller size."""
    from tools.deploy.choice import ALTERNATIVE_MARGIN, eligible

    def original(latency_ms: float) -> DeployCandidate:
        return _c("onnxruntime-static", latency_ms).model_copy(update={"source": "/run/models/original"})

    best = [_c(FLOAT, 3.0), _c("onnxruntime-static", 0.60)]
    tie = original(0.60 * (1 - ALTERNATIVE_MARGIN / 2))
    assert tie not in eligible([*best, tie])
    assert choose(eligible([*best, tie]), 4e-3)[0] == "onnxruntime-static"
    faster = original(0.60 * (1 - 2 * ALTERNATIVE_MARGIN))
    assert faster in eligible([*best, faster])
    assert "(original)" in choose(eligible([*best, faster]), 4e-3)[1]


def test_the_unpruned_original_deploys_only_when_no_pruned_model_is_within_budget() -> None:
    """Deploying the original gives back every parameter pruning removed: however much faster it runs, it is a
    candidate only when no pruned model (the best one, another round) has one within the budget."""
    from tools.deploy.choice import ALTERNATIVE_MARGIN, eligible

    original_dir = Path("/run/models/original")
    best = [_c(FLOAT, 3.0), _c("onnxruntime-static", 0.60)]
    much_faster = 0.60 * (1 - 4 * ALTERNATIVE_MARGIN)
    unpruned = _c("openvino-bf16", much_faster).model_copy(update={"source": str(original_dir)})
    other_round = _c("onnxruntime-static", much_faster).model_copy(update={"source": "/run/rounds/round-00/model"})
    pool = eligible([*best, unpruned, other_round], original_dir)
    assert other_round in pool and unpruned not in pool
    assert unpruned not in eligible([*best, unpruned], original_dir)
    # every pruned candidate over the budget: the original's are the ones left
    over = [c.model_copy(update={"within_budget": False}) for c in best]
    assert unpruned in eligible([*over, unpruned], original_dir)
    assert choose(eligible([*over, unpruned], original_dir), 4e-3)[0] == "openvino-bf16"


def test_the_unpruned_original_deploys_when_faster_and_no_larger_than_the_pruned_models_fastest() -> None:
    """A pruned model whose int8 kept a layer in float (CIFAR ResNet-20: 0.52 MB, 0.20 ms) against the original's
    full int8 within the same budget (0.43 MB, 0.18 ms): the original's is better on every count left open, so it is
    a candidate; one that is faster but larger (or of unknown size) is not."""
    from tools.deploy.choice import ALTERNATIVE_MARGIN, eligible

    original_dir = Path("/run/models/original")
    mixed = _c("openvino-int8-mixed", 0.20).model_copy(update={"memory_mb": 0.52})
    best = [_c(FLOAT, 1.8).model_copy(update={"memory_mb": 1.06}), mixed]
    faster = 0.20 * (1 - 2 * ALTERNATIVE_MARGIN)

    def unpruned(memory_mb: float | None) -> DeployCandidate:
        return _c("openvino-int8", faster).model_copy(update={"source": str(original_dir), "memory_mb": memory_mb})

    smaller = unpruned(0.43)
    assert smaller in eligible([*best, smaller], original_dir)
    assert "(original)" in choose(eligible([*best, smaller], original_dir), 4e-3)[1]
    for other in (unpruned(0.60), unpruned(None)):
        assert other not in eligible([*best, other], original_dir)
    # as fast as the pruned model's (within the margin): the pruned one stays
    tie = smaller.model_copy(update={"latency_s": 0.20 * (1 - ALTERNATIVE_MARGIN / 2) / 1e3})
    assert tie not in eligible([*best, tie], original_dir)


def test_the_headroom_round_is_the_one_with_the_smallest_drop_plus_one_standard_error(tmp_path: Path) -> None:
    from agents.quantization import _headroom_round
    from tests.helpers import typed_state

    def round_(n: int, drop: float, half_width: float, ok: bool = True) -> dict[str, object]:
        interval = {"ci95_low_points": -drop - half_width, "ci95_high_points": -drop + half_width}
        paired = {"delta_points": -drop, **interval, "agreement": 0.9, "samples": 1000, "gained": 1, "lost": 1}
        metrics = {"artifact": str(tmp_path / f"round-{n:02d}" / "model"), "paired": paired}
        return {"round": n, "within_budget": ok, "accuracy_drop_points": drop, "metrics": metrics}

    rounds = [round_(0, 0.6, 1.0), round_(1, -0.2, 1.2), round_(2, 0.3, 1.2), round_(3, -1.0, 0.1, ok=False)]
    state = typed_state({"rounds": rounds})
    assert _headroom_round(state, tmp_path / "round-02" / "model").round == 1  # type: ignore[union-attr]
    assert _headroom_round(state, tmp_path / "round-01" / "model") is None  # it is the roomiest itself
    assert _headroom_round(typed_state({"rounds": rounds[:1]}), tmp_path / "round-00" / "model") is None


def test_a_backend_that_does_not_apply_is_listed_without_a_warning(tmp_path: Path, caplog: Any) -> None:
    """Fused attention on a CNN: the row says why it was not built (not a failure); the log has no WARNING for it."""
    import logging

    from tests.helpers import save_tiny, tiny_resnet
    from tools.stages import ops
    from tools.stages.deployment import deploy

    original = tmp_path / "run" / "models" / "original"
    ops.acquire(str(save_tiny(tiny_resnet(), tmp_path / "src", 16)), original)

    def fused_choice(forced: bool) -> Any:
        return deploy(
            original,
            original,
            [],
            tmp_path / "run" / "models" / "deploy",
            ops.resolve_input_shape(original),
            ops.EvalSpec(dataset=None, samples=10, progress=False),
            backends=[FLOAT, "onnxruntime-fused"],
            within_budget=lambda drop, paired, z=1.0: True,
            baseline_accuracy=None,
            repeats=3,
            forced=forced,
        )

    def fused_row(forced: bool) -> Any:
        return next(c for c in fused_choice(forced).candidates if c.backend == "onnxruntime-fused")

    # measured choice: a backend of Linear layers only is not even built for a CNN
    assert "only Linear layers" in (fused_row(forced=False).skipped or "")
    with caplog.at_level(logging.INFO, logger="tools.stages.deployment"):
        fused = fused_row(forced=True)  # asked for: it is tried, and says why it cannot be built
    assert fused.error is None and "no attention module that can be fused" in (fused.skipped or "")
    records = [r for r in caplog.records if "onnxruntime-fused" in r.getMessage()]
    assert records and all(r.levelno == logging.INFO for r in records)
    forced = fused_choice(forced=True)  # the deployed model is another, and the reason says why
    assert forced.chosen != "onnxruntime-fused"
    assert forced.why.startswith("--deploy onnxruntime-fused was not built: ") and "no attention module" in forced.why


def test_linear_only_int8_is_left_out_where_linear_layers_do_little() -> None:
    import torch
    from torch import nn

    from tests.helpers import tiny_vit
    from tools.profiling.static import mac_shares
    from tools.stages.not_built import MIN_LINEAR_SHARE
    from tools.zoo.cifar_resnet import resnet20

    cnn = mac_shares(resnet20(), torch.randn(1, 3, 32, 32))
    assert cnn[nn.Linear] < MIN_LINEAR_SHARE < cnn[nn.Conv2d]  # a CNN: the classifier only
    vit = mac_shares(tiny_vit(), torch.randn(1, 3, 16, 16))
    assert vit[nn.Linear] > 0.5 and abs(sum(vit.values()) - 1.0) < 1e-9


def test_another_source_stays_deployed_only_if_it_is_still_faster_when_timed_again(monkeypatch: Any) -> None:
    """A margin measured among many candidates on a loaded machine can be noise: the winner from another model and
    the best model's fastest are timed again, alone; the other model deploys only if it is still clearly faster."""
    from tools.deploy.choice import unconfirmed_alternative

    alternative = _c("openvino-int8", 0.50).model_copy(
        update={"source": "/run/rounds/round-00/model", "artifact": "/run/deploy/alt-0/openvino-int8"}
    )
    best = _c("onnxruntime-fp32", 0.60).model_copy(update={"artifact": "/run/deploy/onnxruntime-fp32"})
    timed: list[dict[str, Path]] = []

    def again(alternative_ms: float) -> Any:
        def time_alone(artifacts: dict[str, Path]) -> dict[str, float]:
            timed.append(artifacts)
            return {"alternative": alternative_ms / 1e3, "best": 0.60 / 1e3}

        return time_alone

    doubt = unconfirmed_alternative([best, alternative], "openvino-int8", again(0.59))
    assert doubt and "not 5 % faster" in doubt and "openvino-int8 (round-00)" in doubt
    assert timed[-1] == {"alternative": Path(alternative.artifact or ""), "best": Path(best.artifact or "")}
    assert unconfirmed_alternative([best, alternative], "openvino-int8", again(0.50)) is None
    calls = len(timed)
    assert unconfirmed_alternative([best, alternative], "onnxruntime-fp32", again(0.50)) is None
    assert len(timed) == calls, "the best model's own candidate is not timed again"


def test_an_alternative_refuted_when_timed_again_is_not_what_deploys(monkeypatch: Any, tmp_path: Path) -> None:
    """The best model's int8 is over the budget; a round with more headroom is built in int8 (only that: its bf16
    could not beat the best model's), runs 10 % faster than the best model's bf16 among all candidates, then only 2 %
    when the two are timed again alone: the best model deploys, and the choice says it was built from it."""
    import torch

    from tools.stages import deployment as deployment_module
    from tools.stages import ops

    headroom = tmp_path / "rounds" / "round-00" / "model"
    latency_ms = {(None, "openvino-bf16"): 1.00, (None, "openvino-int8"): 0.80, (str(headroom), "openvino-int8"): 0.90}
    built: list[tuple[str | None, str]] = []

    measure = _fake_measure(built, over={(None, "openvino-int8")})

    def time_all(candidates: list[DeployCandidate], *_: Any) -> float:
        for c in candidates:
            c.latency_s = latency_ms.get((c.source, c.backend), 5.0) / 1e3
        return 6e-3

    def again(artifacts: dict[str, Path], shape: Any, repeats: int = 20, seed: int = 0, **_: Any) -> dict[str, float]:
        return {"alternative": 0.98e-3, "best": 1.00e-3}

    monkeypatch.setattr(deployment_module, "_measure", measure)
    monkeypatch.setattr(deployment_module, "_time", time_all)
    monkeypatch.setattr(deployment_module, "calibration_images", lambda *_: (torch.zeros(1, 3, 8, 8), "none"))
    monkeypatch.setattr(ops, "compare_latency", again)
    monkeypatch.setattr("tools.deploy.decide.runoff", lambda pool, chosen, why, *_, **__: (chosen, why, None))
    monkeypatch.setattr(deployment_module, "judge_together", lambda candidates, *_: len(candidates))
    choice = deployment_module.deploy(
        tmp_path / "best",
        tmp_path / "original",
        [],
        tmp_path / "deploy",
        InputShape(channels=3, height=8, width=8),
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=[FLOAT, "openvino-bf16", "openvino-int8"],
        within_budget=lambda drop, paired, z=1.0: True,
        baseline_accuracy=0.8,
        repeats=3,
        alternatives=[headroom],
    )
    assert (str(headroom), "openvino-int8") in built and (str(headroom), "openvino-bf16") not in built
    assert choice.chosen == "openvino-bf16" and "timed again alone" in choice.why
    assert choice.source is None, "the refuted alternative is not deployed after all"


def test_bf16_is_not_built_for_cpus_without_vnni(monkeypatch: Any) -> None:
    """--int8-cpu no-vnni on a CPU with bf16: the target computes no bf16, so the bf16 row says why it is not built;
    on such a CPU itself, or for the CPU's own kind, nothing is left out here."""
    from tools.deploy.cpu import CpuFeatures
    from tools.stages import not_built

    amx = CpuFeatures(model_name="Xeon", machine="x86_64", features=["avx2", "avx512bw", "amx_int8", "amx_bf16"])
    avx2 = CpuFeatures(model_name="EPYC", machine="x86_64", features=["avx2"])
    backends = [FLOAT, "openvino", "openvino-bf16", "openvino-int8"]
    monkeypatch.setattr(not_built, "detect_cpu", lambda: amx)
    monkeypatch.setattr("tools.deploy.cpu.detect_cpu", lambda: amx)
    rows = not_built.off_target(backends, "no-vnni")
    assert [(r.backend, r.ran) for r in rows] == [("openvino-bf16", False)]
    assert "compute no bf16" in (rows[0].skipped or "")
    assert not_built.off_target(backends, "auto") == []
    monkeypatch.setattr(not_built, "detect_cpu", lambda: avx2)
    assert not_built.off_target(backends, "no-vnni") == [], "its own row says why (not applicable here)"


def test_a_candidate_the_process_died_in_is_left_out_when_the_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime that kills the process (a segfault) leaves the candidate's marker: the resumed deployment leaves
    that candidate out with a row saying why, deploys the others, and leaves no marker of those behind. A marker
    left by a process the machine's restart killed (another boot id in it) is no crash: that candidate is tried."""
    from tests.helpers import save_tiny, tiny_resnet
    from tools.stages import ops
    from tools.stages.deployment import attempt_marker, deploy
    from tools.store import files

    boot_id = tmp_path / "boot_id"
    boot_id.write_text("this-boot\n")
    monkeypatch.setattr(files, "BOOT_ID", boot_id)
    original = tmp_path / "run" / "models" / "original"
    ops.acquire(str(save_tiny(tiny_resnet(), tmp_path / "src", 16)), original)
    out_root = tmp_path / "run" / "models" / "deploy"
    crashed = attempt_marker(out_root / "onnxruntime-fp32")
    crashed.parent.mkdir(parents=True)
    crashed.write_text("this-boot")  # what a process killed while building or running it leaves
    attempt_marker(out_root / "openvino").write_text("an-earlier-boot")  # the machine restarted then

    choice = deploy(
        original,
        original,
        [],
        out_root,
        ops.resolve_input_shape(original),
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=[FLOAT, "onnxruntime-fp32", "openvino"],
        within_budget=lambda drop, paired, z=1.0: True,
        baseline_accuracy=None,
        repeats=3,
    )
    rows = {c.backend: c for c in choice.candidates}
    assert rows["onnxruntime-fp32"].error and "died" in rows["onnxruntime-fp32"].error
    assert str(crashed) in rows["onnxruntime-fp32"].error and rows["onnxruntime-fp32"].latency_s is None
    assert rows["openvino"].ran and rows["openvino"].latency_s is not None
    assert choice.chosen != "onnxruntime-fp32"
    assert sorted(p.name for p in out_root.glob(".*.attempt")) == [crashed.name]  # only the one that died


def test_close_candidates_are_timed_again_alone_and_the_fastest_there_deploys() -> None:
    """Among many interleaved models every call is cache-cold, which can rank runtimes differently from a model
    served alone: the candidates within the runoff margin of the fastest (each backend's fastest row) are timed again
    alone, and the fastest there deploys; a clear winner is not timed again."""
    from tools.deploy.choice import runoff

    def row(backend: str, ms: float, source: str | None = None, ok: bool = True) -> DeployCandidate:
        return _c(backend, ms, ok=ok).model_copy(update={"artifact": f"/run/deploy/{backend}", "source": source})

    pool = [
        row("onnxruntime", 1.72),
        row("openvino", 1.95),
        row("openvino", 1.90, source="/run/rounds/round-00/model"),  # the backend's fastest row stands for it
        row("openvino-int8", 2.70),  # not close
        row("onnxruntime-static", 1.00, ok=False),  # over budget
        row(FLOAT, 1.80),  # the float model is not a runtime rival
    ]
    timed: list[dict[str, Path]] = []

    def again(artifacts: dict[str, Path]) -> dict[str, float]:
        timed.append(artifacts)
        return {name: {"onnxruntime": 1.44e-3}.get(name, 1.18e-3) for name in artifacts}

    chosen, why, winner = runoff(pool, "onnxruntime", "fastest", again)
    assert chosen == "openvino" and winner is not None and winner.source == "/run/rounds/round-00/model"
    assert set(timed[-1]) == {"onnxruntime", "openvino", "openvino (round-00)"}, "each backend's and source's fastest"
    assert "openvino 1.18 ms" in why and "openvino (round-00) 1.18 ms" in why and "onnxruntime 1.44 ms" in why
    assert why.startswith("openvino (round-00) deploys, decided when"), "no preference given: sources count the same"
    assert why.endswith("in the interleaved table, fastest"), "the decision first, the table's reasoning after"
    assert [r.alone_latency_s for r in pool[:4]] == [1.44e-3, 1.18e-3, 1.18e-3, None], "the rows keep the runoff's"
    clear = [row("onnxruntime", 1.0), row("openvino", 1.6)]
    assert runoff(clear, "onnxruntime", "fastest", again) == ("onnxruntime", "fastest", None)
    assert len(timed) == 1, "a clear winner is not timed again"
    assert runoff(pool, FLOAT, "float", again) == (FLOAT, "float", None)
    # a candidate built from another model deploys only when that much faster than the best model's own
    chosen, _, winner = runoff(pool, "onnxruntime", "fastest", again, other_source_margin=0.05)
    assert chosen == "openvino" and winner is not None and winner.source is None, "the best model's, as fast"
    other = [row("onnxruntime", 1.72), row("openvino", 1.90, source="/run/rounds/round-00/model")]
    chosen, _, winner = runoff(other, "onnxruntime", "fastest", again, other_source_margin=0.05)
    assert chosen == "openvino" and winner is not None and winner.source  # 1.18 ms against 1.44: 18 % faster
    chosen, why, _ = runoff(other, "onnxruntime", "fastest", again, other_source_margin=0.20)
    assert chosen == "onnxruntime" and " deploys" not in why


def test_a_tie_in_the_runoff_goes_to_the_smaller_artifact() -> None:
    """A trained 224-px EfficientNet-B0: OpenVINO int8 (5.3 MB) and bf16 (13.3 MB) timed 4.85 / 4.88 ms alone in one
    run and 4.26 / 4.24 in the next, so the deployment flipped between them by noise: within TIE_MARGIN of each
    other, the smaller one deploys; clearly faster, the faster one still does."""
    from tools.deploy.choice import TIE_MARGIN, runoff

    def row(backend: str, ms: float, mb: float) -> DeployCandidate:
        return _c(backend, ms).model_copy(update={"artifact": f"/run/deploy/{backend}", "memory_mb": mb})

    pool = [row("openvino-int8", 3.84, 5.28), row("openvino-bf16", 3.95, 13.33), row("openvino", 5.99, 13.33)]

    def alone(ms: dict[str, float]) -> Callable[[dict[str, Path]], dict[str, float]]:
        return lambda artifacts: {name: ms[name] / 1e3 for name in artifacts}

    tied = alone({"openvino-int8": 4.26, "openvino-bf16": 4.24, "openvino": 6.0})
    chosen, why, _ = runoff(pool, "openvino-int8", "fastest", tied)
    assert chosen == "openvino-int8" and "smaller: 5.28 MB against 13.33" in why
    clear = alone({"openvino-int8": 4.24 * (1 + 2 * TIE_MARGIN), "openvino-bf16": 4.24, "openvino": 6.0})
    chosen, why, _ = runoff(pool, "openvino-int8", "fastest", clear)
    assert chosen == "openvino-bf16" and "smaller" not in why


def test_a_tie_of_builds_as_small_goes_to_the_more_accurate_whatever_the_timing() -> None:
    """CIFAR ResNet-20's original in OpenVINO int8 with and without NNCF's fast bias correction: 0.43 MB each,
    81.48 % and 80.94 % on the choose images, 0.36 and 0.37 ms alone in one run and the other way in the next, so the
    shipped build flipped between two runs of the same rounds: as small as each other, the more accurate deploys."""
    from tools.deploy.choice import runoff

    def row(backend: str, ms: float, mb: float, accuracy: float) -> DeployCandidate:
        update = {"artifact": f"/run/deploy/{backend}", "memory_mb": mb, "accuracy": accuracy}
        return _c(backend, ms).model_copy(update=update)

    pool = [row("openvino-int8-fast-bias", 0.33, 0.430, 0.8094), row("openvino-int8", 0.34, 0.431, 0.8148)]
    for fast_bias_ms, plain_ms in ((0.36, 0.37), (0.37, 0.36)):
        times = {"openvino-int8-fast-bias": fast_bias_ms / 1e3, "openvino-int8": plain_ms / 1e3}
        chosen, why, _ = runoff(pool, "openvino-int8-fast-bias", "fastest", lambda artifacts, t=times: t)
        assert chosen == "openvino-int8"
        if plain_ms > fast_bias_ms:
            assert "as small, more accurate on the choose images: 81.48 % against 80.94 %" in why


def test_the_second_student_is_the_best_model_when_the_first_fails_its_half() -> None:
    """Alternatives count in their order of preference: when every runtime of the kept round's first student fails
    the budget on its half, its second student (the same round) is the best model; a round with more headroom that
    runs a hair faster is not deployed for it (measured: Swin-tiny deployed round 0, 20 % fewer parameters, over the
    48 % round's second student, 1.25 against 1.26 ms alone)."""
    from tools.deploy.choice import ALTERNATIVE_MARGIN, eligible, own_source, runoff

    second, headroom = "/run/rounds/round-06/model-second", "/run/rounds/round-00/model"

    def row(backend: str, ms: float, source: str | None = None, ok: bool = True) -> DeployCandidate:
        return _c(backend, ms, ok=ok).model_copy(update={"artifact": f"/run/{source}/{backend}", "source": source})

    candidates = [
        row("openvino", 1.77, ok=False),  # the first student: over the budget on its half
        row("openvino", 1.70, source=second),
        row("onnxruntime-fused", 1.63, source=second),
        row("openvino-int8", 1.99, source=headroom),
        row("onnxruntime", 1.71, source=headroom),
    ]
    own = own_source(candidates, [None, second, headroom])
    assert own == second
    assert own_source(candidates[:1] + candidates[3:], [None, second, headroom]) == headroom
    pool = eligible(candidates, None, own)
    assert all(c.source != headroom for c in pool), "not 5 % faster than the second student's fastest"
    chosen, _, _ = runoff(
        pool, "onnxruntime-fused", "fastest", lambda a: dict.fromkeys(a, 1.3e-3), other_source_margin=ALTERNATIVE_MARGIN
    )
    assert chosen in {"onnxruntime-fused", "openvino"}
    # in the runoff itself, a headroom candidate 1 % faster than the second student's does not win
    close = [row("openvino", 1.26, source=second), row("openvino-int8", 1.25, source=headroom)]
    times = {"openvino (model-second)": 1.26e-3, "openvino-int8 (round-00)": 1.25e-3}
    chosen, _, _ = runoff(
        close,
        "openvino",
        "fastest",
        lambda a: {k: times[k] for k in a},
        other_source_margin=0.05,
        preference=[second, None, headroom],
    )
    assert chosen == "openvino"


def test_alternatives_count_in_order_when_the_first_student_has_a_slow_runtime_within_budget() -> None:
    """Swin-tiny as timm builds it: the kept round's first student had only ONNX Runtime dynamic int8 within the
    budget on its half (0.51 ms), so it stood as the best model; its second student's OpenVINO int8 and round 0's
    (20 % fewer parameters against 48 %) both ran 0.37 ms, and the runoff kept one row per backend, round 0's: it
    deployed. Sources now count in order (the best model, the second student, the round with more headroom, the
    original), each later one only when 5 % faster than every earlier one's fastest, and the runoff times each
    backend's fastest row of every source."""
    from tools.deploy.choice import ALTERNATIVE_MARGIN, eligible, own_source, preferred, runoff

    second, headroom = "/run/rounds/round-06/model-second", "/run/rounds/round-00/model"

    def row(backend: str, ms: float, source: str | None = None, ok: bool = True) -> DeployCandidate:
        return _c(backend, ms, ok=ok).model_copy(update={"artifact": f"/run/{source}/{backend}", "source": source})

    candidates = [
        row("onnxruntime", 0.51),  # the first student: only this within the budget on its half
        row("openvino-int8", 0.38, ok=False),
        row("openvino-int8", 0.37, source=headroom),  # listed first among the ties, as the table had it
        row("openvino-int8", 0.37, source=second),
        row("openvino", 0.44, source=second),
    ]
    sources = [None, second, headroom]
    own = own_source(candidates, sources)
    assert own is None
    pool = eligible(candidates, None, own)
    times = {"onnxruntime": 0.53e-3, "openvino-int8 (round-00)": 0.41e-3, "openvino-int8 (model-second)": 0.41e-3}
    times["openvino (model-second)"] = 0.48e-3
    timed: list[set[str]] = []

    def again(artifacts: dict[str, Path]) -> dict[str, float]:
        timed.append(set(artifacts))
        return {k: times[k] for k in artifacts}

    chosen, why, winner = runoff(
        pool, "openvino-int8", "fastest", again, other_source_margin=ALTERNATIVE_MARGIN, preference=sources
    )
    assert "openvino-int8 (model-second)" in timed[-1] and "openvino-int8 (round-00)" in timed[-1]
    assert chosen == "openvino-int8" and winner is not None and winner.source == second, why
    # without a runoff, the interleaved latencies decide the same way
    rows = [c for c in pool if c.backend == "openvino-int8" and c.within_budget]
    assert preferred(rows, {c.key: c.latency_s or 0.0 for c in rows}, sources, ALTERNATIVE_MARGIN).source == second
    faster = {**{c.key: c.latency_s or 0.0 for c in rows}, "openvino-int8 (round-00)": 0.30e-3}
    assert preferred(rows, faster, sources, ALTERNATIVE_MARGIN).source == headroom, "clearly faster still wins"


def test_a_students_lead_on_its_half_is_taken_off_its_builds_for_the_budget_test(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """CIFAR ResNet-44: the kept round's first student was +0.67 points on the half it is judged on, the round's
    cross-fitted estimate +0.30; its OpenVINO int8 −0.34 [−1.16, +0.49] there passed a 1-point budget with one
    standard error, and lost 1.28 points on 5,000 images no run saw. Less the student's 0.37-point lead it fails."""
    from agents.quantization import half_luck
    from tests.helpers import save_tiny, tiny_vit, typed_state
    from tools.deploy.choice import luck_removed
    from tools.schemas import Metrics, PairedAccuracy
    from tools.stages import ops
    from tools.stages.deployment import Judging, deploy
    from tools.stats import within_budget

    half = PairedAccuracy(
        delta_points=-0.34,
        ci95_low_points=-1.16,
        ci95_high_points=0.49,
        agreement=0.95,
        samples=2372,
        gained=46,
        lost=54,
    )
    assert within_budget(0.34, 1.0, half)
    assert not within_budget(0.34, 1.0, luck_removed(half, 0.37))
    assert luck_removed(half, 0.0) == half and luck_removed(half, -0.5) == half  # luck only makes it stricter

    student, second, other = (
        "/run/rounds/round-13/model",
        "/run/rounds/round-13/model-second",
        "/run/rounds/round-02/model",
    )

    def paired(delta: float) -> dict[str, float]:
        interval = {"ci95_low_points": delta - 1.0, "ci95_high_points": delta + 1.0}
        return {"delta_points": delta, **interval, "agreement": 0.9, "samples": 1000, "gained": 1, "lost": 1}

    state = typed_state(
        {
            "rounds": [
                {"round": 2, "metrics": {"artifact": other, "paired": paired(-0.2)}},
                {
                    "round": 13,
                    "metrics": {"artifact": student, "paired": paired(0.30)},
                    "cross_fit": {
                        "source_round": 2,
                        "students": [
                            {"artifact": student, "judged_on_half": 1, "paired": paired(0.67)},
                            {"artifact": second, "judged_on_half": 0, "paired": paired(-0.07)},
                        ],
                    },
                },
            ]
        }
    )
    assert half_luck(state, Path(student)) == 0.37
    assert half_luck(state, Path(second)) == 0.0  # behind the round's estimate: nothing added
    assert half_luck(state, Path(other)) == 0.0  # not a student

    original = tmp_path / "original"
    ops.acquire(str(save_tiny(tiny_vit(), tmp_path / "src", 16)), original)
    measured = Metrics(accuracy=0.8, params=1, latency_s=1e-3, memory_mb=1.0, paired=half)
    monkeypatch.setattr("tools.stages.deployment.ops.evaluate", lambda *args, **kwargs: measured)
    choice = deploy(
        original,
        original,
        [],
        tmp_path / "deploy",
        ops.resolve_input_shape(original),
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=[FLOAT],
        within_budget=lambda drop, paired, z=1.0: within_budget(drop, 1.0, paired, z=z),
        baseline_accuracy=0.8,
        repeats=2,
        forced=True,
        judging={original: Judging(spec=ops.EvalSpec(dataset=None, samples=10, progress=False), luck_points=0.37)},
    )
    row = choice.candidates[0]
    assert row.paired == half and row.accuracy_drop_points == 0.34  # the table shows what was measured
    assert row.half_luck_points == 0.37 and not row.within_budget
    from tools.reporting.report import _deployment_lines

    assert any(
        "| NO (judged 0.37 lower: the student's lead on this half) |" in line
        for line in _deployment_lines(choice.model_dump())
    )


def test_the_note_says_why_the_unpruned_original_deploys() -> None:
    """The run's note names the reason: no pruned runtime within the budget, or one faster and no larger."""
    from agents.quantization import _original_note
    from tools.deploy.choice import DeployChoice

    original, pruned = Path("/run/models/original"), Path("/run/rounds/round-02/model")
    theirs = _c("openvino-int8", 0.18).model_copy(update={"source": str(original), "memory_mb": 0.43})
    ours = _c("openvino-int8-mixed", 0.20).model_copy(update={"memory_mb": 0.52})
    choice = DeployChoice(chosen="openvino-int8", why="", source=str(original), candidates=[ours, theirs])
    note = _original_note(choice, pruned, original)
    assert "faster than every runtime of the pruned model (round-02) within the accuracy budget and no larger" in note
    assert "--objective latency" not in note
    assert "`--objective latency` ranks rounds by their latency" in _original_note(
        choice, pruned, original, objective="params"
    )
    over = choice.model_copy(update={"candidates": [ours.model_copy(update={"within_budget": False}), theirs]})
    assert "no runtime of the pruned model (round-02)" in _original_note(over, pruned, original)


def test_every_candidate_is_judged_alone_on_the_choose_images() -> None:
    """Each candidate that ran is judged alone, drop plus one standard error (the confirmation then judges the one
    that ships on images nothing chose on): twelve builds that each pass alone all pass, and the count is returned."""
    from tools.stages.judging import judge_together
    from tools.stats import CHOOSE_Z, within_budget

    paired = PairedAccuracy(
        delta_points=-0.7,
        ci95_low_points=-1.28,
        ci95_high_points=-0.11,
        agreement=0.95,
        samples=2000,
        gained=10,
        lost=24,
    )
    rows = [
        _c(f"b{i}", 1.0).model_copy(update={"artifact": f"/a/{i}", "paired": paired, "accuracy_drop_points": 0.7})
        for i in range(12)
    ]
    assert within_budget(0.7, 1.0, paired)  # alone: drop + one standard error (0.3) = 1.0
    tried = judge_together(rows, lambda drop, p, z: within_budget(drop, 1.0, p, z=z), Path("/a/original"))
    assert tried == 12 and all(c.within_budget and c.budget_z == CHOOSE_Z == 1.0 for c in rows)
    worse = paired.model_copy(update={"delta_points": -0.75})
    over = [rows[0].model_copy(update={"accuracy_drop_points": 0.75, "paired": worse})]
    judge_together(over, lambda drop, p, z: within_budget(drop, 1.0, p, z=z), Path("/a/original"))
    assert not over[0].within_budget  # 0.75 + 0.3 > 1


def test_a_forced_backend_over_the_budget_is_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--deploy NAME over the budget does not ship (the fastest within it does, with one line saying so and what to
    do); --allow-over-budget ships it, and the choice says so."""
    import torch

    from tools.stages import deployment as deployment_module
    from tools.stages import ops

    def measure(backend: str, source_dir: Path, artifact_dir: Path, *, source: str | None = None, **_: Any) -> Any:
        over = backend == "openvino-int8"
        return _c(backend, 1.0, ok=not over).model_copy(
            update={"artifact": str(artifact_dir), "accuracy_drop_points": 3.0 if over else 0.0}
        )

    monkeypatch.setattr(deployment_module, "_measure", measure)
    monkeypatch.setattr(deployment_module, "_time", lambda candidates, *_: 6e-3)
    monkeypatch.setattr(deployment_module, "calibration_images", lambda *_: (torch.zeros(1, 3, 8, 8), "none"))
    monkeypatch.setattr(deployment_module, "judge_together", lambda candidates, *_: len(candidates))
    for allowed in (False, True):
        choice = deployment_module.deploy(
            tmp_path / "best",
            tmp_path / "original",
            [],
            tmp_path / f"deploy-{allowed}",
            InputShape(channels=3, height=8, width=8),
            ops.EvalSpec(dataset=None, samples=10, progress=False),
            backends=[FLOAT, "openvino-int8"],
            within_budget=lambda drop, paired, z=1.0: True,
            baseline_accuracy=0.8,
            repeats=3,
            forced=True,
            allow_over_budget=allowed,
        )
        if allowed:
            assert choice.chosen == "openvino-int8" and "over the accuracy budget (--allow-over-budget)" in choice.why
        else:
            assert choice.chosen == FLOAT and choice.refused and "--allow-over-budget" in choice.refused


def _built(backend: str, latency_ms: float, source: str | None) -> DeployCandidate:
    row = _c(backend, latency_ms)
    return row.model_copy(update={"source": source, "artifact": f"{source or '/run/pruned'}/{backend}"})


def test_what_ships_is_never_slower_than_the_originals_one_command_builds() -> None:
    """The deployed row is timed once more, alone, against the original's fastest one-command build within budget:
    when it is not faster, the original in that build ships, with the reason."""
    from tools.deploy.choice import never_slower

    original = "/run/original"
    rows = [
        _built("onnxruntime-static", 1.0, None),
        _built("openvino-int8", 1.1, original),
        _built("openvino", 2.0, original),
        _built("onnxruntime-static", 0.9, original),  # not a one-command build: not the floor
    ]

    def timer(deployed_ms: float, original_ms: float) -> Callable[[dict[str, Path]], dict[str, float]]:
        def time_alone(pair: dict[str, Path]) -> dict[str, float]:
            assert pair["original"] == Path("/run/original/openvino-int8")
            return {"deployed": deployed_ms / 1e3, "original": original_ms / 1e3}

        return time_alone

    rival, why = never_slower(rows, "onnxruntime-static", None, Path(original), timer(1.2, 1.1))
    assert rival is not None and rival.backend == "openvino-int8" and rival.source == original
    assert "not 3 % faster than the original's openvino-int8" in why
    assert never_slower(rows, "onnxruntime-static", None, Path(original), timer(1.0, 1.1)) == (None, "")
    # a tie within timing noise (the ResNet-56 row: 1.15 against 1.15 ms in the run, 1.21 against 1.11 ms re-timed)
    rival, why = never_slower(rows, "onnxruntime-static", None, Path(original), timer(1.09, 1.1))
    assert rival is not None and "a tie within timing noise goes to the original" in why
    # the original's own row ships as it is; with no original build within budget there is no floor
    assert never_slower(rows, "openvino-int8", original, Path(original), timer(1.2, 1.1)) == (None, "")
    assert never_slower(rows[:1], "onnxruntime-static", None, Path(original), timer(1.2, 1.1)) == (None, "")


def test_an_alternatives_mixed_precision_is_built_only_where_its_full_int8_is_over_the_budget(
    monkeypatch: Any, tmp_path: Path
) -> None:
    """The best model's full int8 is over the budget, so its mixed precision is built, and faster than the chosen
    build; from the alternatives it is built again only where their own full int8 is over the budget too: the
    original's is within, so its mixed build (a minute of accuracy control at 260 px) is a row saying why not."""
    original, headroom = tmp_path / "original", tmp_path / "rounds" / "round-00" / "model"
    over = {(None, "openvino-int8"), (None, "openvino-int8-mixed"), (str(headroom), "openvino-int8")}
    latency_ms = {"openvino": 5.0, "openvino-int8": 2.0, "openvino-int8-mixed": 2.2}
    built: list[tuple[str | None, str]] = []

    measure = _fake_measure(built, over)

    choice = _deploy_with_alternatives(monkeypatch, tmp_path, measure, latency_ms, original_slower=1.5)
    assert (None, "openvino-int8-mixed") in built
    assert (str(headroom), "openvino-int8-mixed") in built, "its full int8 is over the budget too"
    assert (str(original), "openvino-int8-mixed") not in built
    row = next(c for c in choice.candidates if c.source == str(original) and c.backend == "openvino-int8-mixed")
    assert row.skipped is not None and "full int8 (openvino-int8) is within the accuracy budget" in row.skipped


def _deploy_with_alternatives(
    monkeypatch: Any, tmp_path: Path, measure: Callable[..., Any], latency_ms: dict[str, float], original_slower: float
) -> Any:
    """``deploy`` of ``tmp_path / "best"`` with a round of more headroom and the original as alternatives, OpenVINO
    FP32, int8 and int8 mixed, every row timed at ``latency_ms[backend]`` (the original's times ``original_slower``)."""
    import torch

    from tools.deploy.accuracy import AccuracyControl
    from tools.stages import deployment as deployment_module
    from tools.stages import ops

    original, headroom = tmp_path / "original", tmp_path / "rounds" / "round-00" / "model"

    def time_all(candidates: list[DeployCandidate], *_: Any) -> float:
        for c in candidates:
            slower = original_slower if c.source == str(original) else 1.0
            c.latency_s = slower * latency_ms.get(c.backend, 9.0) / 1e3
        return 9e-3

    monkeypatch.setattr(deployment_module, "_measure", measure)
    monkeypatch.setattr(deployment_module, "_time", time_all)
    monkeypatch.setattr(deployment_module, "calibration_images", lambda *_: (torch.zeros(1, 3, 8, 8), "none"))

    def time_alone(pair: dict[str, Path], *_: Any, **__: Any) -> dict[str, float]:  # the original's builds: alt-1
        slower = {k: original_slower if Path(p).parent.name == "alt-1" else 1.0 for k, p in pair.items()}
        return {k: slower[k] * latency_ms.get(Path(p).name, 9.0) / 1e3 for k, p in pair.items()}

    monkeypatch.setattr(ops, "compare_latency", time_alone)
    monkeypatch.setattr("tools.deploy.decide.runoff", lambda pool, chosen, why, *_, **__: (chosen, why, None))
    monkeypatch.setattr(deployment_module, "judge_together", lambda candidates, *_: len(candidates))
    return deployment_module.deploy(
        tmp_path / "best",
        original,
        [],
        tmp_path / "deploy",
        InputShape(channels=3, height=8, width=8),
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=["openvino", "openvino-int8", "openvino-int8-mixed"],
        within_budget=lambda drop, paired, z=1.0: True,
        baseline_accuracy=0.8,
        repeats=3,
        alternatives=[headroom, original],
        control=AccuracyControl(torch.zeros(1, 3, 8, 8), [0], [0], [1], max_drop_points=1.0),
    )


def test_no_mixed_precision_is_built_of_a_model_whose_full_int8_cannot_outrun_the_originals(
    monkeypatch: Any, tmp_path: Path
) -> None:
    """EfficientNet-Lite2's kept round (2.2 % fewer parameters): its OpenVINO int8, over the budget, ran 7.26 ms
    beside the original's 7.17 ms, within it; its mixed builds (58 s of a 15-minute run) keep layers of it in float
    and cannot run 3 % faster than the original's build, as a pruned build must to ship. The original's one-command
    builds are measured first, once, and timed beside the best model's; on the previous code both mixed builds ran."""
    original, headroom = tmp_path / "original", tmp_path / "rounds" / "round-00" / "model"
    built: list[tuple[str | None, str]] = []
    over = {(None, "openvino-int8"), (str(headroom), "openvino-int8")}
    latency_ms = {"openvino": 5.0, "openvino-int8": 2.0, "openvino-int8-mixed": 2.2}
    choice = _deploy_with_alternatives(
        monkeypatch, tmp_path, _fake_measure(built, over), latency_ms, original_slower=1.01
    )
    assert not [b for b in built if b[1] == "openvino-int8-mixed"], built
    assert built.count((str(original), "openvino-int8")) == 1, "the original's rows are measured once"
    row = next(c for c in choice.candidates if c.source is None and c.backend == "openvino-int8-mixed")
    assert row.skipped is not None and "original's openvino-int8" in row.skipped and "(2.020 ms)" in row.skipped
    assert "timed alone together" in row.skipped and "no mixed precision of it can ship" in row.skipped
    assert choice.chosen == "openvino-int8" and choice.source == str(original)
    # the original 10 % slower: the best model's mixed build can ship, so it is built
    built.clear()
    _deploy_with_alternatives(monkeypatch, tmp_path / "b", _fake_measure(built, over), latency_ms, original_slower=1.1)
    assert (None, "openvino-int8-mixed") in built


def test_a_round_that_saves_less_than_the_tie_margin_of_the_originals_macs_is_not_built_for_headroom(
    tmp_path: Path,
) -> None:
    """A round with more headroom than the kept one but 2 % fewer MACs than the original cannot run 3 % faster than
    the original's build, which a pruned build must to ship: the next roomiest that can is built, and the
    deployment's notes name the one left out."""
    from agents.quantization import _headroom_left_out, _headroom_round, _left_out_note
    from tests.helpers import typed_state
    from tools.deploy.choice import TIE_MARGIN, can_outrun_the_original

    assert can_outrun_the_original(96, 100) and not can_outrun_the_original(98, 100)
    assert can_outrun_the_original(None, 100) and can_outrun_the_original(98, None)
    assert can_outrun_the_original(98, 100, sheds_layers=True)
    assert not can_outrun_the_original(int(100 * (1 - TIE_MARGIN / 2)), 100)

    def round_(n: int, drop: float, macs: int) -> dict[str, object]:
        paired = {"delta_points": -drop, "ci95_low_points": -drop - 1, "ci95_high_points": -drop + 1}
        paired |= {"agreement": 0.9, "samples": 1000, "gained": 1, "lost": 1}
        metrics = {"artifact": str(tmp_path / f"round-{n:02d}" / "model"), "paired": paired, "macs": macs}
        return {"round": n, "within_budget": True, "accuracy_drop_points": drop, "metrics": metrics}

    rounds = [round_(0, 0.6, 700), round_(1, -0.5, 980), round_(2, 0.0, 900)]
    state = typed_state(
        {"rounds": rounds, "baseline": {"params": 10, "latency_s": 1.0, "memory_mb": 1.0, "macs": 1000}}
    )
    kept = tmp_path / "round-00" / "model"
    headroom = _headroom_round(state, kept)
    assert headroom is not None and headroom.round == 2
    (note,) = _left_out_note(_headroom_left_out(state, kept, headroom))
    assert "round 1: 2.0 %" in note and "3 %" in note
    assert _left_out_note(_headroom_left_out(state, kept, _headroom_round(state, tmp_path / "round-02" / "model"))) == [
        note
    ]


@pytest.mark.parametrize(
    ("kept_macs", "kind", "built_from"),
    [(980, "structured", "original"), (900, "structured", "kept"), (980, "block", "kept")],
)
def test_a_kept_round_that_saves_less_than_the_tie_margin_of_the_originals_macs_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_macs: int, kind: str, built_from: str
) -> None:
    """The kept round saves 2 % of the original's MACs by channels: none of its builds can run 3 % faster than the
    original's build in the same runtime, so the deployment builds the original's alone, ships it and says why; a
    round that saves 10 % is built as before, and so is one that removes a block (its layers' fixed cost goes too:
    latency may fall by more than MACs)."""
    from langgraph.runtime import Runtime

    import agents.quantization
    from agents.context import Context
    from tests.helpers import typed_state

    kept = tmp_path / "run" / "rounds" / "round-00" / "model"
    paired = {"delta_points": -0.5, "ci95_low_points": -1.5, "ci95_high_points": 0.5, "agreement": 0.9}
    paired |= {"samples": 1000, "gained": 1, "lost": 1}
    metrics = {"artifact": str(kept), "paired": paired, "macs": kept_macs, "params": 9}
    entry = {"params": 9, "latency_s": 1.0, "memory_mb": 1.0, "macs": kept_macs, "artifact": str(kept), "round": 0}
    plan = {"pruning_recommendations": [{"layer": "^layer1$", "pruning_type": kind, "pruning_ratio": 1.0}]}
    state = typed_state(
        {
            "run_dir": str(tmp_path / "run"),
            "input_shape": {"channels": 3, "height": 8, "width": 8},
            "rounds": [
                {"round": 0, "within_budget": True, "accuracy_drop_points": 0.5, "metrics": metrics, "plan": plan}
            ],
            "pruned": entry | {"within_budget": True, "accuracy_drop_points": 0.5, "plan": plan},
            "baseline": {"params": 10, "latency_s": 1.0, "memory_mb": 1.0, "macs": 1000, "accuracy": 0.8},
            "plan": {"plan": {}, "source": "rules"},
        }
    )
    seen: dict[str, Any] = {}

    def fake_deploy(source: Path, original: Path, *args: Any, alternatives: list[Path], **kwargs: Any) -> DeployChoice:
        seen.update(source=source, alternatives=alternatives)
        row = DeployCandidate(
            backend="openvino-int8", runtime="openvino", precision="int8", ran=True, within_budget=True, latency_s=1e-3
        )
        ships = kwargs["ships"][""]  # the model the candidates of no other source are: the node says which
        return DeployChoice(chosen="openvino-int8", why="test", source=None, candidates=[row], ships=ships)

    monkeypatch.setattr(agents.quantization, "deploy", fake_deploy)
    ctx = Context(run_dir=str(tmp_path / "run"), max_accuracy_drop=1.0, progress=False, quant_backend="auto")
    changes: Any = agents.quantization.quantize_model(state, Runtime(context=ctx))
    original = tmp_path / "run" / "models" / "original"
    if built_from == "kept":
        assert seen["source"] == kept and [p.resolve() for p in seen["alternatives"]] == [original.resolve()]
        assert changes["deployment"].ships == "kept_round"
        return
    assert seen["source"].resolve() == original.resolve() and seen["alternatives"] == []
    assert changes["deployment"].ships == "original"
    assert any("round 0: 2.0 % (the kept round)" in n for n in changes["notes"])
    state = state.model_copy(update={"deployment": changes["deployment"]})
    (note,) = agents.quantization.adopt_original(state, Runtime(context=ctx))["notes"]
    assert "nothing of the pruned model (round-00) was built" in note


def test_no_build_is_made_in_a_runtime_where_the_model_in_float_cannot_outrun_the_original(tmp_path: Path) -> None:
    """A model whose float build in a runtime is not 3 % faster than the original's there, timed alone together, gets
    no int8 or bf16 build in that runtime (a tie goes to the original): the rows say so. A runtime where it is
    faster builds as before, and a runtime the original was not built in before is not judged."""
    from tools.deploy.choice import DeployCandidate
    from tools.stages.not_built import cannot_outrun_in_float

    built: list[tuple[str, bool]] = []

    def build(backend: str, of_the_original: bool) -> DeployCandidate:
        built.append((backend, of_the_original))
        where = tmp_path / ("original" if of_the_original else "model") / backend
        return DeployCandidate(backend=backend, runtime="?", precision="fp32", artifact=str(where))

    times = {"model openvino": 0.0190, "original openvino": 0.0195, "model onnxruntime-fp32": 0.0150}
    times["original onnxruntime-fp32"] = 0.0200
    full = ["torch", "onnxruntime-fp32", "onnxruntime-static", "openvino", "openvino-bf16", "openvino-int8"]
    full.append("openvino-int8-fast-bias")
    originals = {"openvino": "x", "onnxruntime-fp32": "y"}

    def retime(paths: dict[str, Path]) -> dict[str, float]:
        return {name: times[name] for name in paths}

    own, theirs, rows = cannot_outrun_in_float(full, set(), originals, build, retime)
    assert sorted(own) == ["onnxruntime-fp32", "openvino"] and {c.backend for c in theirs} == set(own)
    assert sorted(built) == [(b, o) for b in ("onnxruntime-fp32", "openvino") for o in (False, True)]
    assert [r.backend for r in rows] == ["openvino-bf16", "openvino-int8", "openvino-int8-fast-bias"]
    why = "19.000 ms) is not 3 % faster than the original's (19.500 ms)"
    assert all(not r.ran and why in (r.skipped or "") for r in rows)
    _, _, rows = cannot_outrun_in_float(full, set(), {"onnxruntime-fp32": "y"}, build, retime)
    assert rows == []
