"""Choose on some images, confirm on others: the confirm part's size, its seal, the reads each role recorded, the
confirmation's rule and declared sequence, and forced backends held to the budget whatever their name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import deploy_row
from tools.deploy.choice import DeployChoice
from tools.deploy.registry import FLOAT
from tools.evaluation.confirm import ConfirmRule, confirm_sequence
from tools.evaluation.datasets import AUTO_CONFIRM, CONFIRM_MAX, confirm_rows, split_indices
from tools.schemas import InputShape, PairedAccuracy, PartAccuracy
from tools.stages.run_data import ConfirmSealed, DataReads, EvalSpec, confirming, read_log, record_reads


def _paired(delta: float, se: float, samples: int = 1000) -> PairedAccuracy:
    return PairedAccuracy(
        delta_points=delta,
        ci95_low_points=delta - 1.96 * se,
        ci95_high_points=delta + 1.96 * se,
        agreement=0.95,
        samples=samples,
        gained=10,
        lost=20,
    )


def _part(delta: float, se: float) -> PartAccuracy:
    return PartAccuracy(
        part="confirm", accuracy=0.9, samples=1000, accuracy_drop_points=-delta, paired=_paired(delta, se)
    )


def test_the_automatic_confirm_part_is_a_share_of_what_calibration_leaves() -> None:
    assert confirm_rows(AUTO_CONFIRM, 5000, 256) == int(0.25 * 4744)
    assert confirm_rows(AUTO_CONFIRM, 100_000, 256) == CONFIRM_MAX
    assert confirm_rows(AUTO_CONFIRM, 300, 64) == 0  # 59 rows would confirm nothing: none, and the report says so
    assert confirm_rows(50, 300, 64) == 50 and confirm_rows(0, 5000, 256) == 0
    parts = split_indices(5000, {"calibration": 256, "evaluation": 5000, "confirm": AUTO_CONFIRM}, seed=0)
    assert len(parts["confirm"]) == 1186 and len(parts["evaluation"]) == 5000 - 256 - 1186
    rows = [i for name in ("calibration", "evaluation", "confirm") for i in parts[name]]
    assert len(rows) == len(set(rows)) == 5000


def test_the_confirm_part_is_sealed_until_the_confirmation(tmp_path: Path) -> None:
    """Reading the confirm part anywhere but inside ``confirming()`` is a bug, and raises at once."""
    spec = EvalSpec(dataset="digits", samples=60, calibration_samples=20, confirm_samples=30, progress=False)
    with pytest.raises(ConfirmSealed, match="before the confirmation"):
        spec.part("confirm")
    with confirming():
        data = spec.part("confirm")
    assert len(data.images) == 30
    with pytest.raises(ConfirmSealed):
        spec.part("confirm")  # sealed again after


def test_disjointness_is_what_each_role_read_and_a_real_overlap_is_reported(tmp_path: Path) -> None:
    log = tmp_path / "data_reads.json"
    spec = EvalSpec(
        dataset="digits", samples=60, calibration_samples=20, confirm_samples=30, progress=False, reads_log=str(log)
    )
    spec.part("calibration")
    choose = list(spec.part("evaluation").indices)
    with confirming():
        spec.part("confirm")
    reads = read_log(log)
    assert reads.disjoint() and set(reads.rows) == {"fit", "choose", "confirm"}
    assert len(reads.rows["choose"]) == 60 and len(reads.rows["confirm"]) == 30
    record_reads(spec, "fit", choose[:7])  # a student trained on choose images: reported, not hidden
    reads = read_log(log)
    assert not reads.disjoint() and reads.overlaps() == {"choose&fit": 7}
    assert reads.disjoint("confirm", "choose") and reads.disjoint("confirm", "fit")
    assert not DataReads(rows={"choose": [1, 2], "confirm": [2]}).disjoint()

    from tools.reporting.paired_text import split_text
    from tools.reporting.report import data_split

    split = data_split({"run_dir": str(tmp_path), "dataset": "digits", "baseline": {"data_parts": {}}}, {})
    assert split["parts_disjoint"] is False and split["confirm_untouched"] is True
    text = split_text({"spec": "digits", **split}) or ""
    assert "7 choose images also trained the distilled students" in text
    assert "the confirm images read by nothing else" in text and "disjoint)" not in text


def test_the_budget_holds_on_the_confirmed_point_estimate_or_its_bound() -> None:
    """By default the confirmed drop itself holds the budget; --confidence P holds its one-sided bound at P to it,
    counting every tested build of the declared sequence."""
    near = _part(-0.9, 0.4)  # 0.9 points down, se 0.4
    point = ConfirmRule(max_drop_points=1.0)
    assert point.z == 0.0 and point.passes(near) and point.bound_points(near) == pytest.approx(0.9)
    assert not point.passes(_part(-1.1, 0.1))
    sure = ConfirmRule(max_drop_points=1.0, confidence=0.95)
    assert sure.z == pytest.approx(1.645, abs=1e-3) and not sure.passes(near)
    assert sure.passes(_part(-0.2, 0.4))  # 0.2 + 1.645 x 0.4 = 0.86
    two = ConfirmRule(max_drop_points=1.0, confidence=0.95, looks=2)
    assert two.z == pytest.approx(1.96, abs=1e-3) and not two.passes(_part(-0.2, 0.42))


def test_the_sequence_is_declared_from_the_choose_part_and_ends_with_the_originals_float_build() -> None:
    original = Path("/run/original")
    rows = [
        deploy_row("openvino-int8", 0.3, None),
        deploy_row("openvino-int8", 0.45, str(original)),
        deploy_row("onnxruntime", 0.5, str(original)),
        deploy_row("openvino", 0.9, str(original), precision="fp32"),
        deploy_row("onnxruntime-fp32", 1.1, str(original), precision="fp32"),
    ]
    choice = DeployChoice(chosen="openvino-int8", why="fastest", candidates=rows)
    steps, last = confirm_sequence(choice, original)
    assert [(s.backend, s.source, s.ships, s.tested) for s in steps] == [
        ("openvino-int8", None, "kept_round", True),
        ("openvino-int8", str(original), "original", True),
        ("openvino", str(original), "original", False),  # the original's answers: ships untested
    ]
    assert last.backend == "openvino"
    forced = DeployChoice(chosen="onnxruntime", why="forced", candidates=[deploy_row("onnxruntime", 0.4, None)])
    steps, last = confirm_sequence(forced, original)  # no build of the original was made: PyTorch's own model
    assert [(s.backend, s.tested) for s in steps] == [("onnxruntime", True), (FLOAT, False)]
    assert last.backend == FLOAT and last.artifact == str(original)


def test_tries_are_counted_as_the_test_counted_them() -> None:
    """A build of a distilled round's two students judged together is one try in the text, as in the test."""
    from tools.reporting.paired_text import tries_text

    rows = [
        deploy_row("openvino-int8", 0.3, "/run/s1").model_copy(update={"budget_z": 1.0}),
        deploy_row("openvino-int8", 0.3, "/run/s2").model_copy(update={"budget_z": 1.0}),
        deploy_row("onnxruntime", 0.4, None).model_copy(update={"budget_z": 1.0}),
    ]
    text = tries_text({"tries": 2, "candidates": [r.model_dump() for r in rows]}) or ""
    assert "each of the 2 builds judged" in text and "one standard error" in text


@pytest.mark.parametrize("backends", [[FLOAT], [FLOAT, "openvino-int8"]])
def test_a_forced_backend_over_the_budget_is_refused_whatever_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backends: list[str]
) -> None:
    """--deploy torch is held to the budget as any other backend; after a refusal what deploys is within it: with no
    build of the pruned model within it, the original as it is."""
    import torch

    from tools.stages import deployment as deployment_module
    from tools.stages import ops

    def measure(backend: str, source_dir: Path, artifact_dir: Path, *, source: str | None = None, **_: Any) -> Any:
        return deploy_row(backend, 1.0, source, ok=False).model_copy(
            update={"artifact": str(artifact_dir), "accuracy_drop_points": 3.0}
        )

    monkeypatch.setattr(deployment_module, "_measure", measure)
    monkeypatch.setattr(deployment_module, "_time", lambda candidates, *_: 6e-3)
    monkeypatch.setattr(deployment_module, "calibration_images", lambda *_: (torch.zeros(1, 3, 8, 8), "none"))
    monkeypatch.setattr(deployment_module, "judge_together", lambda candidates, *_: len(candidates))
    original = tmp_path / "original"
    choice = deployment_module.deploy(
        tmp_path / "best",
        original,
        [],
        tmp_path / "deploy",
        InputShape(channels=3, height=8, width=8),
        ops.EvalSpec(dataset=None, samples=10, progress=False),
        backends=backends,
        within_budget=lambda drop, paired, z=1.0: False,
        baseline_accuracy=0.8,
        repeats=3,
        forced=True,
    )
    assert choice.refused is not None and f"--deploy {backends[-1]} refused" in choice.refused
    assert choice.chosen == FLOAT and choice.source == str(original)  # within the budget by construction
    shipped = next(c for c in choice.candidates if c.backend == FLOAT and c.source == str(original))
    assert shipped.within_budget and shipped.accuracy_drop_points == 0.0


def test_a_failed_confirmation_chooses_the_next_build_of_the_declared_sequence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The shipped build fails the budget on the confirm images: the original's fastest build within the budget on the
    choose images ships instead, its look counted and reported as the second; each look reads the confirm part only
    inside ``confirming()``."""
    from langgraph.runtime import Runtime

    import agents.confirmation as confirmation
    from agents.context import Context
    from tests.helpers import typed_state
    from tools.stages import run_data

    original = tmp_path / "models" / "original"
    rows = [
        deploy_row("openvino-int8", 0.3, None),
        deploy_row("openvino-int8", 0.45, str(original)),
        deploy_row("openvino", 0.9, str(original), precision="fp32"),
    ]
    choice = DeployChoice(chosen="openvino-int8", why="the fastest within budget", candidates=rows)
    figures = iter([_part(-1.4, 0.4), _part(-0.3, 0.4)])
    opened: list[bool] = []

    def evaluate(*args: Any, **kwargs: Any) -> PartAccuracy:
        assert args[-1] == "confirm"
        opened.append(run_data._CONFIRM_OPEN[0])
        return next(figures)

    monkeypatch.setattr(confirmation.ops, "evaluate_accuracy_on", evaluate)
    monkeypatch.setattr(confirmation, "eval_spec", lambda *_: EvalSpec(dataset="d", progress=False))
    values = {
        "run_dir": str(tmp_path),
        "input_shape": {"channels": 3, "height": 8, "width": 8},
        "baseline": {"accuracy": 0.9, "data_parts": {"confirm": 1000}},
        "deployment": choice,
        "quantized": {"artifact": str(tmp_path / "models" / "quantized"), "source": "s", "backend": "openvino-int8"},
    }
    values["quantized"] |= {"runtime": "openvino", "precision": "int8"}
    runtime = Runtime(context=Context(max_accuracy_drop=1.0))
    first = confirmation.confirm_deployment(typed_state(values), runtime)
    fallback = first["deployment"]
    assert isinstance(fallback, DeployChoice)
    assert (fallback.chosen, fallback.source, fallback.ships) == ("openvino-int8", str(original), "original")
    assert "openvino-int8 failed the budget on the confirm part" in fallback.why
    assert "fails the 1-point budget: Δ -1.40" in first["notes"][0]
    second = confirmation.confirm_deployment(
        typed_state({**values, "deployment": fallback, "confirmation": first["confirmation"]}), runtime
    )
    done = second["confirmation"]
    assert "deployment" not in second and done.done and done.shipped is not None and done.shipped.passed
    assert "(look 2 at the confirm part: the builds before it failed)" in second["notes"][0]
    assert opened == [True, True] and not run_data._CONFIRM_OPEN[0]


def test_without_quantization_the_kept_rounds_float_model_is_confirmed_and_gives_way_to_the_original(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--no-quantize ships the kept round's float model: it is judged on the confirm images too; over the budget
    there, the original ships and ``pruned`` reports it."""
    from langgraph.runtime import Runtime

    import agents.confirmation as confirmation
    from agents.context import Context
    from tests.helpers import typed_state

    figures = iter([_part(-0.4, 0.3), _part(-1.5, 0.3)])
    monkeypatch.setattr(confirmation.ops, "evaluate_accuracy_on", lambda *args, **kwargs: next(figures))
    monkeypatch.setattr(confirmation, "eval_spec", lambda *_: EvalSpec(dataset="d", progress=False))
    entry = {"params": 5, "latency_s": 1.0, "memory_mb": 1.0, "accuracy": 0.8}
    values = {
        "run_dir": str(tmp_path),
        "input_shape": {"channels": 3, "height": 8, "width": 8},
        "baseline": {**entry, "params": 9, "data_parts": {"confirm": 500}},
        "pruned": {**entry, "round": 3, "artifact": str(tmp_path / "rounds" / "round-03" / "model")},
    }
    runtime = Runtime(context=Context(max_accuracy_drop=1.0, quantize=False))
    held = confirmation.confirm_deployment(typed_state(values), runtime)
    assert held["pruned"].round == 3 and held["pruned"].confirmed.accuracy_drop_points == pytest.approx(0.4)
    assert held["confirmation"].done and "round 3 (float) holds the 1-point budget" in held["notes"][0]
    failed = confirmation.confirm_deployment(typed_state(values), runtime)
    assert failed["pruned"].round is None and failed["pruned"].params == 9  # the original ships
    assert failed["confirmation"].shipped.step.name == "the original"
    assert "round 3 (float) fails the 1-point budget" in failed["notes"][0]


def test_an_original_float_build_that_ships_is_its_own_sequence() -> None:
    original = Path("/run/original")
    rows = [
        deploy_row("openvino-int8", 0.3, None, ok=False),
        deploy_row("openvino-int8", 0.9, str(original)),  # within the budget, but slower than the FP32 build chosen
        deploy_row("openvino", 0.5, str(original), precision="fp32"),
    ]
    choice = DeployChoice(chosen="openvino", source=str(original), ships="original", why="w", candidates=rows)
    steps, last = confirm_sequence(choice, original)
    assert [(s.backend, s.source, s.tested) for s in steps] == [("openvino", str(original), False)]
    assert last.backend == "openvino"
