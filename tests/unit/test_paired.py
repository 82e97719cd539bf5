"""Paired accuracy: the interval's arithmetic, the budget test built on it, and the per-image predictions cache."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from agents.planning.selection import budget_drop_points, within_budget
from tools.evaluation import paired
from tools.evaluation.paired import paired_accuracy, standard_error_points
from tools.schemas import PairedAccuracy

# Eight images, labels 3 1 2 4 4 1 7 7. The original misses images 3 and 5; the candidate fixes image 3
# and misses 1 and 4: per-image differences 0 -1 0 +1 -1 0 0 0.
REF_PRED = [3, 1, 2, 5, 4, 0, 7, 7]
CAND_PRED = [3, 9, 2, 4, 8, 0, 7, 7]
REF_OK = [1, 1, 1, 0, 1, 0, 1, 1]
CAND_OK = [1, 0, 1, 1, 0, 0, 1, 1]


def test_hand_computed_example() -> None:
    result = paired_accuracy(REF_OK, CAND_OK, REF_PRED, CAND_PRED)
    # mean = -1/8; squared deviations: 5 x 0.125^2 + 2 x 0.875^2 + 1.125^2 = 2.875; s^2 = 2.875 / 7
    # half-width = 1.96 * sqrt(2.875 / 7 / 8) = 0.444101 -> 44.41 points
    assert result.delta_points == pytest.approx(-12.5)
    assert result.ci95_low_points == pytest.approx(-12.5 - 44.4101, abs=1e-3)
    assert result.ci95_high_points == pytest.approx(-12.5 + 44.4101, abs=1e-3)
    assert result.agreement == pytest.approx(5 / 8)
    assert (result.samples, result.gained, result.lost) == (8, 1, 2)
    assert standard_error_points(result) == pytest.approx(100 * math.sqrt(2.875 / 7 / 8), abs=1e-3)


def test_identical_models_have_a_zero_width_interval() -> None:
    result = paired_accuracy(REF_OK, REF_OK, REF_PRED, REF_PRED)
    assert (result.delta_points, result.ci95_low_points, result.ci95_high_points) == (0.0, 0.0, 0.0)
    assert result.agreement == 1.0 and result.gained == result.lost == 0


def test_bools_count_like_ints_and_agreement_is_independent_of_correctness() -> None:
    result = paired_accuracy([True, False], [False, True], [1, 2], [3, 4])
    assert result.delta_points == 0.0 and result.gained == 1 and result.lost == 1
    assert result.agreement == 0.0
    # d = -1, +1: s = sqrt(2), half-width 1.96 * sqrt(2) / sqrt(2) = 1.96 -> 196 points either way
    assert result.ci95_high_points == pytest.approx(196.0)


def test_too_few_images_give_the_whole_range() -> None:
    empty = paired_accuracy([], [], [], [])
    assert empty.samples == 0 and empty.delta_points == 0.0 and empty.agreement == 1.0
    assert (empty.ci95_low_points, empty.ci95_high_points) == (-100.0, 100.0)
    one = paired_accuracy([1], [0], [2], [5])
    assert one.delta_points == -100.0 and one.lost == 1 and one.agreement == 0.0
    assert (one.ci95_low_points, one.ci95_high_points) == (-100.0, 100.0)
    assert not within_budget(100.0, 1.0, one)


def test_misaligned_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="align"):
        paired_accuracy([1, 0], [1], [1, 2], [1, 2])
    with pytest.raises(ValueError, match="align"):
        paired_accuracy([1, 0], [1, 0], [1, 2], [1])


def _pair(n: int, lost: int, gained: int) -> PairedAccuracy:
    """A candidate on n images that loses ``lost`` of the original's right answers and gains ``gained``."""
    ref = [1] * lost + [0] * gained + [1] * (n - lost - gained)
    cand = [0] * lost + [1] * gained + [1] * (n - lost - gained)
    pred_ref = [1 if ok else 0 for ok in ref]
    pred_cand = [1 if ok else 2 for ok in cand]
    return paired_accuracy(ref, cand, pred_ref, pred_cand)


def test_budget_rejects_a_noisy_candidate_that_measures_under_budget() -> None:
    noisy = _pair(250, lost=4, gained=2)  # -0.8 points on 250 images; se = 0.98 points
    assert noisy.delta_points == pytest.approx(-0.8)
    assert standard_error_points(noisy) == pytest.approx(0.98, abs=0.01)
    assert within_budget(0.8, 1.0), "the point estimate alone is under budget"
    assert budget_drop_points(0.8, noisy) == pytest.approx(1.78, abs=0.01)
    assert not within_budget(0.8, 1.0, noisy)
    assert not within_budget(0.8, 1.0, noisy.model_dump()), "a paired result read back from state counts too"


def test_budget_accepts_a_clear_candidate() -> None:
    clear = _pair(5000, lost=10, gained=0)  # -0.2 points on 5,000 images; se = 0.06 points
    assert within_budget(0.2, 1.0, clear)
    assert budget_drop_points(0.2, clear) == pytest.approx(0.263, abs=0.005)
    assert within_budget(0.0, 0.0, _pair(100, 0, 0)), "a candidate identical to the original meets a zero budget"


def test_budget_without_a_pair_uses_the_point_estimate() -> None:
    assert within_budget(1.0, 1.0) and not within_budget(1.01, 1.0)
    assert within_budget(None, 0.0), "an unknown accuracy never rejects"
    assert budget_drop_points(0.5, None) == 0.5


# --- the predictions kept beside an artifact -----------------------------------------------------------


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers import save_tiny, tiny_vit
    from tools.stages import ops

    root = tmp_path_factory.mktemp("paired")
    source = save_tiny(tiny_vit(), root / "tiny", 16)
    out = root / "models" / "original"
    ops.acquire(str(source), out)
    return out


def _spec(original: Path, **changes: Any) -> Any:
    from tools.stages import ops

    label_match = ops.match_dataset_labels(original, "digits", None, 40, 0)
    fields = {"dataset": "digits", "label_match": label_match, "samples": 40, "calibration_samples": 16}
    return ops.EvalSpec(**{**fields, "batch_size": 20, "progress": False, **changes})


def _shape() -> Any:
    from tools.schemas import InputShape

    return InputShape(channels=3, height=16, width=16, source="test")


def test_predictions_are_kept_beside_the_artifact_and_reused(original: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import load_compressed
    from tools.stages import ops

    spec = _spec(original)
    first = ops.predictions_on(original, original, _shape(), spec)
    assert first is not None and first.samples == 40 and len(first.predictions) == 40
    path = original.with_name("original.predictions.evaluation.json")
    assert path.is_file() and not (original / path.name).exists(), "the artifact directory is left alone"
    assert first.accuracy == pytest.approx(ops.accuracy_of(load_compressed(original), original, _shape(), spec)[0])

    calls: list[str] = []
    real = paired.predict_part

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("desc", ""))
        return real(*args, **kwargs)

    monkeypatch.setattr(paired, "predict_part", counting)
    again = ops.predictions_on(original, original, _shape(), spec)
    assert calls == [] and again == first, "same artifact, same images: read back, not run"
    assert ops.predictions_on(original, original, _shape(), spec.model_copy(update={"batch_size": 7})) == first

    other_rows = ops.predictions_on(original, original, _shape(), spec.model_copy(update={"seed": 1}))
    assert len(calls) == 1 and other_rows is not None and other_rows.key["indices"] != first.key["indices"]
    shifted = ops.predictions_on(original, original, _shape(), spec.model_copy(update={"calibration_samples": 8}))
    assert len(calls) == 2 and shifted is not None, "another calibration size moves the evaluation rows"

    mapping = {k: v for k, v in spec.label_match["mapping"].items() if int(k) != 0}
    fewer = spec.model_copy(update={"label_match": {**spec.label_match, "mapping": mapping}})
    narrowed = ops.predictions_on(original, original, _shape(), fewer)
    assert len(calls) == 3 and narrowed is not None and narrowed.samples < 40, "another label mapping: run again"

    path.write_text("{not json")
    assert ops.predictions_on(original, original, _shape(), spec) is not None and len(calls) == 4

    weights = original / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the model was written again
    assert ops.predictions_on(original, original, _shape(), spec) == first.model_copy(
        update={"key": _saved_key(original, "evaluation")}
    )
    assert len(calls) == 5, "another model file: run again"


def _saved_key(artifact: Path, part: str) -> dict[str, Any]:
    key: dict[str, Any] = json.loads(paired.predictions_path(artifact, part).read_text())["key"]
    return key


def test_evaluate_pairs_every_artifact_but_the_original(original: Path) -> None:
    from tools.schemas import OptimizationPlan, PruningRecommendation
    from tools.stages import ops

    spec = _spec(original)
    base = ops.evaluate(original, original, _shape(), spec)
    assert base.paired is None and base.samples == 40
    plan = OptimizationPlan(
        pruning_recommendations=[
            PruningRecommendation(
                layer=r"mlp\.fc1$",
                pruning_type="structured",
                pruning_ratio=0.5,
                justification="test",
            )
        ]
    )
    pruned_dir = original.parent.parent / "rounds" / "round-00" / "model"
    ops.prune(original, plan, _shape(), pruned_dir)
    metrics = ops.evaluate(pruned_dir, original, _shape(), spec)
    assert metrics.params < base.params
    p = metrics.paired
    assert p is not None and p.samples == 40
    assert base.accuracy is not None and metrics.accuracy is not None
    assert p.delta_points == pytest.approx(100 * (metrics.accuracy - base.accuracy), abs=1e-3)
    assert p.ci95_low_points <= p.delta_points <= p.ci95_high_points
    assert p.gained - p.lost == round(p.delta_points * 40 / 100)

    from tools.stages.run_data import confirming

    with confirming():
        confirm = ops.evaluate_accuracy_on(
            pruned_dir, original, _shape(), spec.model_copy(update={"confirm_samples": 30}), "confirm"
        )
    assert confirm is not None and confirm.samples == 30 and confirm.paired is not None
    assert confirm.paired.samples == 30 and confirm.baseline_accuracy is not None
    evaluation_rows = set(_saved_key(pruned_dir, "evaluation")["indices"])
    confirm_rows = set(_saved_key(pruned_dir, "confirm")["indices"])
    assert len(confirm_rows) == 30 and not evaluation_rows & confirm_rows
