"""The deployment's budget test over every try: a step-down simultaneous test on the candidates' per-image answers
(tools.evaluation.simultaneous), instead of Bonferroni over tries that are the same model in other runtimes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from agents.evaluation import round_files
from agents.planning.selection import kept_round, passes_as_one_of
from tests.helpers import round_result
from tools.deploy.choice import DeployCandidate
from tools.evaluation.paired import ImagePredictions, predictions_path, save_predictions
from tools.evaluation.simultaneous import budget_zs, stepdown_z
from tools.judging import judge_together
from tools.reporting.paired_text import tries_text
from tools.schemas import RoundResult
from tools.stats import Budget, paired_accuracy, selection_z, within_budget

IMAGES = 2000


def _changed(start: list[int], lost: int, gained: int, seed: int) -> list[int]:
    """``start`` with ``lost`` right answers made wrong and ``gained`` wrong ones made right, at random."""
    rng = random.Random(seed)
    right = [i for i, c in enumerate(start) if c]
    wrong = [i for i, c in enumerate(start) if not c]
    correct = list(start)
    for i in rng.sample(right, lost) + rng.sample(wrong, gained):
        correct[i] = 1 - correct[i]
    return correct


def _save(path: Path, correct: list[int]) -> None:
    key = {"indices": list(range(IMAGES)), "part": "evaluation"}
    save_predictions(path, ImagePredictions(key=key, predictions=correct, correct=correct))


def _candidate(root: Path, name: str, original: list[int], correct: list[int]) -> DeployCandidate:
    artifact = root / name
    _save(predictions_path(artifact, "evaluation"), correct)
    paired = paired_accuracy(original, correct, original, correct)
    return DeployCandidate(
        backend=name,
        runtime="openvino",
        precision="int8",
        artifact=str(artifact),
        paired=paired,
        accuracy_drop_points=-paired.delta_points,
        predictions=str(predictions_path(artifact, "evaluation")),
    )


def test_builds_of_one_model_count_as_about_one_try_not_twelve(tmp_path: Path) -> None:
    """Twelve builds of one pruned model (its float answers, each int8 build a few answers off them): Bonferroni held
    each to 2.24 standard errors as one of twelve and refused every one (the shared Swin-tiny's 33 builds: 2.59, and
    the original shipped); resampling the images together, they are nearly one try, and a build within the budget
    by more than one standard error passes. A budget in changed answers keeps Bonferroni."""
    original = [1 if random.Random(i).random() < 0.8 else 0 for i in range(IMAGES)]
    pruned = _changed(original, 43, 37, seed=1)  # 0.3 points lost, one standard error about 0.45
    rows = [_candidate(tmp_path, f"build-{i}", original, _changed(pruned, 2, 2, seed=100 + i)) for i in range(12)]
    _save(predictions_path(tmp_path / "original", "evaluation"), original)
    for row in rows:
        assert within_budget(row.accuracy_drop_points, 1.0, row.paired)  # each alone
        assert not within_budget(row.accuracy_drop_points, 1.0, row.paired, z=selection_z(12))  # as one of twelve
    assert judge_together(rows, Budget(max_drop_points=1.0), tmp_path / "original") == 12
    assert all(row.within_budget for row in rows)
    assert all(1.0 <= (row.budget_z or 0.0) < 1.5 for row in rows), [row.budget_z for row in rows]
    text = tries_text([row.model_dump() for row in rows]) or ""
    assert "as one of 12 tries" in text and "step-down" in text and "Bonferroni would hold each to 2.22" in text
    judge_together(rows, Budget(max_drop_points=1.0, max_disagreement_pct=50.0), tmp_path / "original")
    assert not any(row.within_budget for row in rows) and {row.budget_z for row in rows} == {round(selection_z(12), 3)}
    missing = [rows[0], rows[1].model_copy(update={"predictions": None})]
    judge_together(missing, Budget(max_drop_points=1.0), tmp_path / "original")
    assert {row.budget_z for row in missing} == {round(selection_z(2), 3)}


def test_unrelated_candidates_are_held_near_bonferroni_and_a_clear_pass_leaves_the_family() -> None:
    """Eight candidates whose changed answers share nothing are as many tries: the first step's critical value is
    near Bonferroni's (never above it). One that passes clearly leaves the family, and the others are judged again
    among themselves with less."""
    rng = np.random.default_rng(0)
    drops = np.zeros((8, IMAGES), dtype=np.float32)
    for row in drops:
        changed = rng.choice(IMAGES, 120, replace=False)
        row[changed] = rng.choice([1.0, -1.0], size=120)
    judged = np.ones_like(drops, dtype=bool)
    nobody = stepdown_z(drops, judged, lambda i, z: False)
    assert len(set(nobody)) == 1 and selection_z(8) - 0.3 < nobody[0] <= selection_z(8)
    first = stepdown_z(drops, judged, lambda i, z: i == 0)
    assert first[0] == nobody[0] and all(z < first[0] for z in first[1:])


def _round(root: Path, i: int, original: list[int], correct: list[int], halves: bool = False) -> RoundResult:
    """Round ``i`` with its answers saved where the run keeps them: its model's, or two students' on halves."""
    paired = paired_accuracy(original, correct, original, correct)
    values: dict[str, Any] = {
        "round": i,
        "within_budget": within_budget(-paired.delta_points, 1.0, paired),
        "accuracy_drop_points": -paired.delta_points,
        "metrics": {"params": 1000 - i, "paired": paired.model_dump(), "artifact": str(root / f"round-{i}" / "model")},
    }
    if not halves:
        _save(predictions_path(root / f"round-{i}" / "model", "evaluation"), correct)
        return round_result(values)
    students = []
    for half, rows in enumerate((range(0, IMAGES, 2), range(1, IMAGES, 2))):
        artifact = root / f"round-{i}" / f"student-{half}"
        key = {"indices": list(rows), "part": f"evaluation-half{half}"}
        answers = [correct[r] for r in rows]
        save_predictions(
            predictions_path(artifact, f"evaluation-half{half}"),
            ImagePredictions(key=key, predictions=answers, correct=answers),
        )
        students.append({"artifact": str(artifact), "judged_on_half": half})
    values["cross_fit"] = {"source_round": 0, "judged_on_half": 0, "images_per_student": 0, "students": students}
    return round_result(values)


def test_the_kept_round_is_judged_as_one_of_the_rounds_by_the_step_down_test(tmp_path: Path) -> None:
    """Rounds that change few answers pass clearly and leave the family; a distilled round (its two students, each
    on the half of the images it did not see) that Bonferroni refused as one of six is then kept (CIFAR ResNet-56's
    latency run: a distilled block round 1.24x faster, refused by 0.03 points as one of eleven)."""
    original = [1 if random.Random(i).random() < 0.8 else 0 for i in range(IMAGES)]
    _save(predictions_path(tmp_path / "original", "evaluation"), original)
    rounds = [_round(tmp_path, i, original, _changed(original, 3, 3, seed=i)) for i in range(3)]
    rounds += [_round(tmp_path, i, original, _changed(original, 80, 20, seed=i)) for i in (3, 4)]  # 3 points lost
    rounds.append(_round(tmp_path, 5, original, _changed(original, 42, 38, seed=5), halves=True))
    assert round_files(rounds[5]) == [
        predictions_path(tmp_path / "round-5" / f"student-{h}", f"evaluation-half{h}") for h in (0, 1)
    ]
    fewest = rounds[5]
    assert fewest.within_budget and not passes_as_one_of(fewest, 1.0, selection_z(6))
    before, _ = kept_round(rounds, "smallest-within-budget", 1.0)
    assert before is not None and before.round != 5
    zs = budget_zs(
        predictions_path(tmp_path / "original", "evaluation"),
        [round_files(r) for r in rounds],
        lambda i, z: passes_as_one_of(rounds[i], 1.0, z),
    )
    now, _ = kept_round(rounds, "smallest-within-budget", 1.0, zs={r.round: z for r, z in zip(rounds, zs, strict=True)})
    assert now is not None and now.round == 5, zs
    assert max(zs) <= round(selection_z(6), 3)
