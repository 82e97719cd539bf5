"""A distilled round's two students: a build of each is judged with the same build of the other on every choose
image, as one try, as the round was judged (``tools.stages.judging.judge_together``)."""

from __future__ import annotations

import random
from pathlib import Path

from tools.deploy.choice import DeployCandidate
from tools.evaluation.paired import ImagePredictions, predictions_path, save_predictions
from tools.stages.judging import judge_together
from tools.stats import Budget, paired_accuracy

IMAGES = 2000


def _save(path: Path, correct: list[int]) -> None:
    key = {"indices": list(range(IMAGES)), "part": "evaluation"}
    save_predictions(path, ImagePredictions(key=key, predictions=correct, correct=correct))


def _changed(start: list[int], lost: int, gained: int, seed: int) -> list[int]:
    """``start`` with ``lost`` right answers made wrong and ``gained`` wrong ones made right, at random."""
    rng = random.Random(seed)
    right = [i for i, c in enumerate(start) if c]
    wrong = [i for i, c in enumerate(start) if not c]
    correct = list(start)
    for i in rng.sample(right, lost) + rng.sample(wrong, gained):
        correct[i] = 1 - correct[i]
    return correct


def _half_build(
    root: Path, name: str, source: str | None, original: list[int], half: range, seed: int
) -> DeployCandidate:
    """A build of a distilled round's student, judged on the half of the images its student did not see: 22 of its
    right answers there lost and 18 gained against the original (0.4 points, one standard error 0.63 on 1,000)."""
    correct = [original[i] for i in half]
    correct = _changed(correct, 22, 18, seed)
    artifact = root / name
    key = {"indices": list(half), "part": "evaluation"}
    save_predictions(
        predictions_path(artifact, "evaluation"), ImagePredictions(key=key, predictions=correct, correct=correct)
    )
    reference = [original[i] for i in half]
    paired = paired_accuracy(reference, correct, reference, correct)
    return DeployCandidate(
        backend="onnxruntime-static",
        runtime="onnxruntime",
        precision="int8",
        artifact=str(artifact),
        source=source,
        paired=paired,
        accuracy_drop_points=-paired.delta_points,
        predictions=str(predictions_path(artifact, "evaluation")),
    )


def test_a_build_of_each_student_is_judged_together_on_every_image_as_the_round_was(tmp_path: Path) -> None:
    """CIFAR ResNet-20's kept round (+0.06 on 4,744 images) had each build of its first student judged alone on the
    2,372 images that student did not see: -0.13 to -0.55 there, every one over a 1-point budget, and a slower round
    shipped. The same build of its second student covers the other half; the two together are one try on every image
    (its 0.4-point loss passes within one standard error of 0.45, where each half alone has 0.63 and fails), and both
    rows say so. Without the twin each is judged alone and fails."""
    original = [1 if random.Random(i).random() < 0.8 else 0 for i in range(IMAGES)]
    _save(predictions_path(tmp_path / "original", "evaluation"), original)
    second = str(tmp_path / "round-10" / "model-second")
    first_half, second_half = range(IMAGES // 2, IMAGES), range(IMAGES // 2)
    rows = [
        _half_build(tmp_path / "first", "onnxruntime-static", None, original, first_half, seed=1),
        _half_build(tmp_path / "second", "onnxruntime-static", second, original, second_half, seed=2),
    ]
    budget = Budget(max_drop_points=1.0)
    assert all(not budget(row.accuracy_drop_points, row.paired) for row in rows)  # each half alone, even as one try
    assert judge_together(rows, budget, tmp_path / "original") == 2
    assert not any(row.within_budget for row in rows) and all(row.cross_fitted is None for row in rows)

    assert judge_together(rows, budget, tmp_path / "original", {None: second}) == 1  # one try, not two
    joint = rows[0].cross_fitted
    assert joint is not None and joint.samples == IMAGES and round(joint.delta_points, 2) == -0.4
    assert rows[1].cross_fitted == joint and all(row.within_budget and row.budget_z == 1.0 for row in rows)
    from tools.deploy.choice import DeployChoice
    from tools.reporting.report import _deployment_lines

    lines = _deployment_lines(DeployChoice(chosen="onnxruntime-static", why="", candidates=rows).model_dump())
    assert sum("judged with the other student's build on every image: -0.40 [" in line for line in lines) == 2

    # a twin stopped early (or missing) covers too few images: each is judged alone again
    partial = rows[1].model_copy(update={"predictions": str(tmp_path / "absent.json")})
    judge_together([rows[0], partial], budget, tmp_path / "original", {None: second})
    assert rows[0].cross_fitted is None and not rows[0].within_budget


def test_the_twin_of_a_student_is_the_other_student_of_its_round() -> None:
    """The deployment pairs a distilled round's two students' builds (``agents.quantization.other_student``); a round
    not distilled, or any other model, has none."""
    from agents.quantization import other_student
    from tests.helpers import typed_state

    first, second, other = (
        "/run/rounds/round-10/model",
        "/run/rounds/round-10/model-second",
        "/run/rounds/round-02/model",
    )
    students = [{"artifact": first, "judged_on_half": 1}, {"artifact": second, "judged_on_half": 0}]
    state = typed_state(
        {
            "rounds": [
                {"round": 2, "metrics": {"artifact": other}},
                {"round": 10, "metrics": {"artifact": first}, "cross_fit": {"source_round": 2, "students": students}},
            ]
        }
    )
    assert other_student(state, Path(first)) == Path(second).resolve()
    assert other_student(state, Path(second)) == Path(first).resolve()
    assert other_student(state, Path(other)) is None
