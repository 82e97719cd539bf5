"""How many evaluation images the accuracy budget needs, and the note when the data has fewer."""

from __future__ import annotations

import pytest

from tools.stages.run_data import auto_eval_samples
from tools.stats import images_needed, resolution_note, resolution_points


def test_resolution_matches_the_paired_interval_of_a_five_percent_change_rate() -> None:
    assert resolution_points(500) == pytest.approx(1.96, abs=0.01)
    assert resolution_points(250) == pytest.approx(2.77, abs=0.01)
    assert images_needed(1.0) == 2000 and images_needed(0.5) == 8000 and images_needed(2.0) == 500


def test_small_data_is_said_in_one_line_and_enough_data_is_not() -> None:
    note = resolution_note(244, 1.0)
    assert note is not None and "\n" not in note
    assert note.startswith("244 evaluation images resolve about ±2.8 points") and "--max-accuracy-drop" in note
    assert resolution_note(2000, 1.0) is None and resolution_note(500, 2.0) is None


def test_automatic_evaluation_size_is_at_least_what_the_budget_needs() -> None:
    vit_b16_macs = 17_600_000_000
    assert auto_eval_samples(vit_b16_macs) == 2000
    assert auto_eval_samples(vit_b16_macs, budget_points=0.5) == 8000
    assert auto_eval_samples(50_000_000) == 5000  # small models: what ten seconds allow
    assert auto_eval_samples(None) == 2000


def test_unlabelled_images_resolve_an_agreement_budget_for_a_candidate_judged_alone() -> None:
    """Every choice judges a candidate alone (one standard error; the confirmation judges what ships): 186 unlabelled
    images resolve a 2 % agreement budget, 50 only roughly."""
    from tools.stats import agreement_images_needed, unlabelled_note

    assert agreement_images_needed(2.0) == 99
    assert unlabelled_note(186, 2.0).endswith("186 images resolve it")
    assert "only roughly" in unlabelled_note(50, 2.0)


def test_an_original_at_chance_adds_the_agreement_budget_unless_one_is_given() -> None:
    """At chance (untrained for these images, or labels that do not match) the accuracy budget passes anything: the
    share of answers changed holds besides, at --max-accuracy-drop's value; a --max-disagreement given wins, and an
    unlabelled run's budget is the agreement itself (no second one)."""
    from agents.common import disagreement_budget
    from agents.context import Context
    from tests.helpers import typed_state

    baseline = {"data_parts": {"evaluation": 400}, "at_chance": True}
    state = typed_state({"baseline": baseline})
    assert disagreement_budget(state, Context(max_accuracy_drop=2.0)) == 2.0
    assert disagreement_budget(state, Context(max_accuracy_drop=2.0, max_disagreement=0.5)) == 0.5
    assert disagreement_budget(typed_state({"baseline": {**baseline, "at_chance": False}}), Context()) is None
    unlabelled = typed_state({"baseline": baseline, "label_match": {"mapping": {}, "unlabelled": True}})
    assert disagreement_budget(unlabelled, Context()) is None
