"""Dataset class names -> model classes: normalisation, synonyms, tiers, uniqueness, errors."""

from __future__ import annotations

import pytest

from tools.evaluation.accuracy import accuracy_from_predictions
from tools.evaluation.labels import LabelMatch, LabelMatchError, label_alternatives, match_labels, normalise_label

CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def test_identical_names_map_one_to_one() -> None:
    match = match_labels(dict(enumerate(CIFAR10)), CIFAR10)
    assert match.mapping == {i: i for i in range(10)}
    assert match.unmatched == []
    assert match.matched_names["cat"] == "cat"
    assert set(match.match_kinds.values()) == {"exact"}
    assert match.is_complete()


def test_order_may_differ_and_keys_may_be_strings() -> None:
    model = {"0": "dog", "1": "cat", "2": "bird"}  # as read from config.json
    match = match_labels(model, ["bird", "cat", "dog"])
    assert match.mapping == {0: 2, 1: 1, 2: 0}


def test_case_underscores_hyphens_spaces_normalised() -> None:
    model = {0: "Sports_Car", 1: "golden-retriever", 2: "ICE  CREAM", 3: "jack-o'-lantern"}
    match = match_labels(model, ["sports car", "Golden Retriever", "ice_cream", "jack o lantern"])
    assert match.mapping == {0: 0, 1: 1, 2: 2, 3: 3}
    assert set(match.match_kinds.values()) == {"exact"}
    assert normalise_label("  Golden--Retriever_ ") == "golden retriever"


def test_synonym_lists_split_into_alternatives() -> None:
    assert label_alternatives("tench, Tinca tinca") == ["tench", "tinca tinca", "tench tinca tinca"]
    model = {0: "tench, Tinca tinca", 1: "goldfish, Carassius auratus", 2: "T-shirt/top"}
    match = match_labels(model, ["Carassius auratus", "tench", "t-shirt"])
    assert match.mapping == {0: 1, 1: 0, 2: 2}
    assert match.matched_names["tench"] == "tench, Tinca tinca"


def test_plural_and_spacing_variants() -> None:
    match = match_labels({0: "cats", 1: "dog", 2: "tshirt"}, ["cat", "dogs", "T-shirt"])
    assert match.mapping == {0: 0, 1: 1, 2: 2}
    assert set(match.match_kinds.values()) == {"variant"}


def test_digits_match_number_words() -> None:
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    match = match_labels({i: str(i) for i in range(10)}, words)
    assert match.mapping == {i: i for i in range(10)}


def test_whole_word_beats_substring_cat_vs_catamaran() -> None:
    match = match_labels({0: "catamaran", 1: "tabby cat", 2: "dog"}, ["cat", "dog"])
    assert match.mapping == {0: 1, 1: 2}
    assert match.match_kinds["cat"] == "word"


def test_cat_never_matches_catamaran_alone() -> None:
    match = match_labels({0: "catamaran", 1: "dog"}, ["cat", "dog"])
    assert match.mapping == {1: 1}
    assert match.unmatched == ["cat"]


def test_several_whole_word_candidates_are_ambiguous() -> None:
    model = {0: "tabby, tabby cat", 1: "tiger cat", 2: "Persian cat", 3: "catamaran", 4: "dog"}
    match = match_labels(model, ["cat", "dog"])
    assert match.unmatched == ["cat"]
    assert sorted(match.ambiguous["cat"]) == ["Persian cat", "tabby, tabby cat", "tiger cat"]
    assert match.mapping == {1: 4}


def test_exact_match_wins_over_looser_ones() -> None:
    match = match_labels({0: "tabby cat", 1: "cat", 2: "catamaran"}, ["cat"])
    assert match.mapping == {0: 1}


def test_duplicate_model_names_are_one_class() -> None:
    # ImageNet-1k names 134 (the bird) and 517 (the machine) both "crane"; a dataset with one "crane" class
    match = match_labels({134: "crane", 517: "crane", 1: "goldfish"}, ["crane", "goldfish"])
    assert match.unmatched == [] and match.mapping == {0: 134, 1: 1}
    assert match.same_class == {517: 134} and match.duplicates == {"crane": [134, 517]}
    assert match.duplicates_matched == "merged"
    assert match.counts_as(517) == 134 and match.counts_as(1) == 1
    note = match.duplicates_note()
    assert note is not None and "'crane' (134, 517)" in note and "one class" in note
    # a prediction of either crane counts for the dataset's crane; other classes are unaffected
    assert accuracy_from_predictions([134, 517, 1, 517], [0, 0, 1, 1], match) == (0.75, 4)


def test_duplicate_primary_names_with_synonyms_are_one_class() -> None:
    # as in Hugging Face ImageNet checkpoints: 638 "maillot", 639 "maillot, tank suit"
    model = {638: "maillot", 639: "maillot, tank suit", 1: "goldfish"}
    match = match_labels(model, ["maillot", "goldfish"])
    assert match.duplicates == {"maillot": [638, 639]} and match.same_class == {639: 638}
    assert match.mapping == {0: 638, 1: 1} and match.match_kinds["maillot"] == "exact"
    # a dataset naming both: "tank suit" is 639 alone, so "maillot" is the other one, and nothing is merged
    both = match_labels(model, ["maillot", "tank suit", "goldfish"])
    assert both.mapping == {0: 638, 1: 639, 2: 1}
    assert both.same_class == {} and both.duplicates_note() is None


def test_classes_lining_up_with_duplicates_match_by_position() -> None:
    names = ["tench", "crane", "goldfish", "crane", "maillot", "maillot, tank suit"]
    match = match_labels(dict(enumerate(names)), ["tench", "crane", "goldfish", "crane", "maillot", "maillot"])
    assert match.mapping == {i: i for i in range(6)}
    assert match.same_class == {} and match.duplicates_matched == "position"
    assert set(match.match_kinds.values()) == {"position"}
    assert match.duplicates == {"crane": [1, 3], "maillot": [4, 5]}
    assert match.dataset_duplicates == {"crane": [1, 3], "maillot": [4, 5]}
    note = match.duplicates_note()
    assert note is not None and "by position" in note
    assert accuracy_from_predictions([3, 1], [1, 3], match) == (0.0, 2)  # by position, the two cranes differ


def test_classes_out_of_order_fall_back_to_merging() -> None:
    names = ["crane", "goldfish", "crane"]
    match = match_labels(dict(enumerate(names)), ["goldfish", "crane"])  # not the model's order or count
    assert match.duplicates_matched == "merged" and match.mapping == {0: 1, 1: 0}
    assert match.same_class == {2: 0}


def test_duplicates_the_dataset_does_not_use_are_not_noted() -> None:
    match = match_labels({0: "crane", 1: "goldfish", 2: "crane"}, ["goldfish"])
    assert match.mapping == {0: 1} and match.duplicates_note() is None and match.same_class == {}


def test_repeated_dataset_names_share_their_model_class() -> None:
    match = match_labels({0: "crane", 1: "goldfish"}, ["crane", "goldfish", "crane"])
    assert match.mapping == {0: 0, 1: 1, 2: 0}
    assert match.dataset_duplicates == {"crane": [0, 2]} and match.duplicates == {}
    assert match.unmatched == []


def test_no_duplicates_no_note() -> None:
    match = match_labels(dict(enumerate(CIFAR10)), CIFAR10)
    assert match.duplicates_note() is None and match.duplicates_matched is None and match.same_class == {}


def test_primary_name_breaks_exact_ties() -> None:
    # "maillot" is the primary name of 638 and a synonym of 639 only
    match = match_labels({638: "maillot", 639: "tank suit, maillot"}, ["maillot"])
    assert match.mapping == {0: 638}


def test_substring_at_word_end_with_min_length() -> None:
    match = match_labels({0: "airplane", 1: "elephant"}, ["plane", "ant"])
    assert match.mapping == {0: 0}
    assert match.match_kinds["plane"] == "substring"
    assert match.unmatched == ["ant"]  # too short, even though "elephant" ends with it


def test_model_class_serves_one_dataset_class() -> None:
    # "tabby cat" is taken by the exact match, so "cat" finds no free whole-word candidate
    match = match_labels({0: "tabby cat", 1: "dog"}, ["tabby cat", "cat", "dog"])
    assert match.mapping == {0: 0, 2: 1}
    assert match.unmatched == ["cat"]


def test_prediction_space_is_not_restricted() -> None:
    # the mapping only says which model class is correct; all 1000-style classes stay in play
    model = {i: f"class {i}" for i in range(20)} | {20: "cat", 21: "dog"}
    match = match_labels(model, ["dog", "cat"])
    assert match.mapping == {0: 21, 1: 20}


def test_partial_match_lists_unmatched() -> None:
    match = match_labels(dict(enumerate(["cat", "dog"])), ["cat", "dog", "unicorn", "dragon"])
    assert match.mapping == {0: 0, 1: 1}
    assert match.unmatched == ["unicorn", "dragon"]
    assert match.matched_count == 2
    assert not match.is_complete()


def test_no_match_raises() -> None:
    with pytest.raises(LabelMatchError, match="no dataset class"):
        match_labels({0: "cat", 1: "dog"}, ["car", "truck"])


def test_generic_labels_hint() -> None:
    with pytest.raises(LabelMatchError, match="generic LABEL_n"):
        match_labels({0: "LABEL_0", 1: "LABEL_1"}, ["cat", "dog"])


def test_empty_inputs_raise() -> None:
    with pytest.raises(LabelMatchError):
        match_labels({}, ["cat"])
    with pytest.raises(LabelMatchError):
        match_labels({0: "cat"}, [])


def test_label_match_round_trips_json() -> None:
    match = match_labels({0: "cat", 1: "dog"}, ["dog", "cat", "emu"])
    again = LabelMatch.model_validate_json(match.model_dump_json())
    assert again == match
    assert again.mapping == {0: 1, 1: 0}
