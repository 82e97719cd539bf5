"""Label matching: which model class each dataset class is, so that accuracy can be counted.

Dataset class names are matched to the model's ``id2label`` by name, substrings included (as in the
paper), with guards that keep it honest:

1. names are normalised (case, ``_``/``-``/punctuation -> space, apostrophes dropped, single-digit
   tokens spelled out) and synonym lists (``"tench, Tinca tinca"``, ``"T-shirt/top"``) give
   alternatives: the whole name and each part;
2. tiers, loosest last: ``exact`` (equal alternatives), ``variant`` (equal after singularising each
   word and dropping spaces: ``cats`` ~ ``cat``, ``t shirt`` ~ ``tshirt``), ``word`` (one name is
   a whole-word run inside the other: ``cat`` ~ ``tabby cat``), and ``substring`` (the shorter,
   >= 4 letters, ends where a word of the longer ends: ``plane`` ~ ``airplane``, but never
   ``cat`` ~ ``catamaran``);
3. a dataset class takes the first tier where it has any candidate, and only if that candidate is
   unique (within ``exact``/``variant``, a single candidate matched by its primary name wins);
   several candidates make it ambiguous, so it stays unmatched;
4. a model class serves at most one dataset class: classes matched in a tighter tier are taken
   first, and two dataset classes claiming the same model class in one tier both stay unmatched.

Real class lists repeat names: ImageNet-1k has ``crane`` twice (the bird and the machine) and ``maillot``
twice, and so do the ``id2label`` of Hugging Face ImageNet checkpoints. Names are duplicates when their
primary alternatives are equal. When the dataset's classes line up with the model's (same count, and the
names agree position by position, duplicates included), classes are matched by position (``position``).
Otherwise a dataset class whose only candidates are model classes sharing a name takes the first of them
still free, and the others count as the same class (``same_class``: a prediction of any of them counts as
the first); dataset classes sharing a name are one class. :meth:`LabelMatch.duplicates_note` says which
was done.

ImageNet's image folders are named by WordNet ID (``n01440764``): dataset classes so named are matched to a model
whose classes are ImageNet-1k's in its order (names agreeing at 99 % of the 1,000 positions, after a background class
where there is one) by their index in that order (``wordnet id``); otherwise by their WordNet names (``tench, Tinca
tinca``) under the rules above. :attr:`LabelMatch.wordnet_ids` says which.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from tools.evaluation.common import EvaluationError
from tools.evaluation.sources import UNLABELLED
from tools.evaluation.wordnet import IMAGENET_1K_CLASSES, imagenet_1k, is_wordnet_id
from tools.text import preview

logger = logging.getLogger(__name__)

__all__ = [
    "BY_POSITION",
    "BY_WORDNET_ID",
    "MATCH_TIERS",
    "MIN_SUBSTRING_LETTERS",
    "LabelMatch",
    "LabelMatchError",
    "label_alternatives",
    "match_labels",
    "normalise_label",
]

MATCH_TIERS: tuple[str, ...] = ("exact", "variant", "word", "substring")
#: The match kind of classes matched by position, when the dataset's classes line up with the model's.
BY_POSITION = "position"
#: The match kind of ImageNet WordNet IDs matched by their ImageNet-1k index.
BY_WORDNET_ID = "wordnet id"
#: The share of ImageNet-1k's 1,000 class names a model's must agree with, position by position, to be taken as its
#: classes in its order (torchvision's differ at one: the bird ``crane`` is its ``crane bird``).
IMAGENET_ORDER_AGREEMENT = 0.99
MIN_SUBSTRING_LETTERS = 4
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SYNONYM_SEPARATORS = re.compile(r"[,;/|]")
_GENERIC_LABEL = re.compile(r"^label[ _]?\d+$", re.IGNORECASE)


class LabelMatchError(EvaluationError):
    """No dataset class could be matched to a model class."""


class LabelMatch(BaseModel):
    """How dataset classes map onto model classes.

    ``mapping``: dataset label index -> model class index; ``unmatched``: dataset class names that
    match nothing (or several things); ``matched_names``: dataset name -> model name.
    """

    mapping: dict[int, int]
    unmatched: list[str] = Field(default_factory=list)
    matched_names: dict[str, str] = Field(default_factory=dict)
    match_kinds: dict[str, str] = Field(default_factory=dict, description="Dataset name -> matching tier.")
    ambiguous: dict[str, list[str]] = Field(
        default_factory=dict, description="Unmatched dataset name -> model names it could not choose from."
    )
    same_class: dict[int, int] = Field(
        default_factory=dict,
        description="Model class -> the model class of the same name its predictions count as (duplicates merged).",
    )
    duplicates: dict[str, list[int]] = Field(
        default_factory=dict, description="A name the model gives several classes -> their model class indices."
    )
    dataset_duplicates: dict[str, list[int]] = Field(
        default_factory=dict, description="A name the dataset gives several classes -> their dataset label indices."
    )
    duplicates_matched: str | None = Field(
        default=None, description="How duplicated names were matched: 'position' or 'merged' (None: none)."
    )
    wordnet_ids: str | None = Field(
        default=None, description="How dataset classes named by ImageNet WordNet ID were matched (None: none were)."
    )
    unlabelled: bool = Field(
        default=False,
        description="The dataset has no labels: every image's target is the original model's top-1 answer, so a "
        "model's 'accuracy' is its agreement with the original (the original's is 1).",
    )

    @property
    def matched_count(self) -> int:
        return len(self.mapping)

    def is_complete(self) -> bool:
        return not self.unmatched

    def counts_as(self, predicted: int) -> int:
        """The model class a prediction counts as: itself, or the first class of its duplicated name."""
        return self.same_class.get(int(predicted), int(predicted))

    def duplicates_note(self) -> str | None:
        """How duplicated class names were matched, for the report (None when no name repeats)."""
        if not self.duplicates and not self.dataset_duplicates:
            return None

        def named(groups: dict[str, list[int]], whose: str) -> list[str]:
            listed = ", ".join(f"{name!r} ({', '.join(str(i) for i in ids)})" for name, ids in groups.items())
            return [f"{whose} {listed}"] if groups else []

        names = "; ".join(named(self.duplicates, "model classes") + named(self.dataset_duplicates, "dataset classes"))
        if self.duplicates_matched == BY_POSITION:
            how = "matched by position, as the dataset's classes line up with the model's"
        else:
            how = "each name treated as one class: a prediction of any of its model classes counts for it"
        return f"class names given more than once ({names}): {how}"

    def notes(self) -> list[str]:
        """What the report should say about how the classes were matched (empty when nothing is worth saying)."""
        return [note for note in (self.wordnet_ids, self.duplicates_note()) if note]


def normalise_label(name: str) -> str:
    """Lower case; ``_``, ``-``, punctuation -> space; apostrophes dropped; single digits spelled out."""
    text = unicodedata.normalize("NFKC", str(name)).lower()
    text = re.sub(r"['’`]", "", text)
    text = re.sub(r"[^\w]+|_", " ", text)
    words = [_DIGIT_WORDS[int(w)] if len(w) == 1 and w.isdigit() else w for w in text.split()]
    return " ".join(words)


def label_alternatives(name: str) -> list[str]:
    """Normalised alternatives of a class name: the primary part first, then the others and the whole name."""
    parts = [normalise_label(p) for p in _SYNONYM_SEPARATORS.split(str(name))]
    whole = normalise_label(str(name))
    ordered: list[str] = []
    for alt in [*parts, whole]:
        if alt and alt not in ordered:
            ordered.append(alt)
    return ordered


def _singular(word: str) -> str:
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _stem(alt: str) -> str:
    return " ".join(_singular(w) for w in alt.split())


def _contains_words(outer: str, inner: str) -> bool:
    """``inner``'s words appear as a contiguous run of whole words in ``outer`` (and the two differ)."""
    return outer != inner and f" {inner} " in f" {outer} "


def _contains_word_end(outer: str, inner: str) -> bool:
    """``inner`` (>= MIN_SUBSTRING_LETTERS letters) occurs in ``outer``, ending where a word of it ends."""
    if outer == inner or len(inner.replace(" ", "")) < MIN_SUBSTRING_LETTERS:
        return False
    start = outer.find(inner)
    while start >= 0:
        end = start + len(inner)
        if end == len(outer) or outer[end] == " ":
            return True
        start = outer.find(inner, start + 1)
    return False


@dataclass(frozen=True)
class _Name:
    """A class name's normalised alternatives (primary first) and their singularised forms."""

    alts: tuple[str, ...]
    stems: tuple[str, ...]

    @classmethod
    def of(cls, name: str) -> _Name:
        alts = tuple(label_alternatives(name))
        return cls(alts, tuple(_stem(a) for a in alts))

    def keys(self, tier: str) -> tuple[str, ...]:
        """Lookup keys of the index-based tiers: the alternatives, or their stems with spaces removed."""
        return self.alts if tier == "exact" else tuple(s.replace(" ", "") for s in self.stems)


def _loose_hit(tier: str, d: _Name, m: _Name) -> bool:
    if tier == "word":
        return any(_contains_words(sm, sd) or _contains_words(sd, sm) for sm in m.stems for sd in d.stems)
    return any(_contains_word_end(am, ad) or _contains_word_end(ad, am) for am in m.alts for ad in d.alts)


def _candidates(tier: str, d: _Name, models: dict[int, _Name], index: dict[str, dict[int, bool]]) -> dict[int, bool]:
    """Model classes that ``d`` matches in ``tier`` -> whether the model's primary name took part."""
    if tier in ("exact", "variant"):
        hits: dict[int, bool] = {}
        for key in d.keys(tier):
            for m_index, primary in index.get(key, {}).items():
                hits[m_index] = hits.get(m_index, False) or primary
        if len(hits) > 1:
            primaries = [m for m, p in hits.items() if p]
            if len(primaries) == 1:
                return {primaries[0]: True}
        return hits
    return {m_index: False for m_index, m in models.items() if _loose_hit(tier, d, m)}


def _build_index(tier: str, models: dict[int, _Name]) -> dict[str, dict[int, bool]]:
    index: dict[str, dict[int, bool]] = {}
    if tier in ("exact", "variant"):
        for m_index, m in models.items():
            for position, key in enumerate(m.keys(tier)):
                slot = index.setdefault(key, {})
                slot[m_index] = slot.get(m_index, False) or position == 0
    return index


def _duplicate_groups(names: Mapping[int, str]) -> dict[int, list[int]]:
    """First index -> every index of a repeated (primary) name, for names given to several classes."""
    by_name: dict[str, list[int]] = {}
    for index, name in sorted(names.items()):
        alts = label_alternatives(name)
        if alts:
            by_name.setdefault(alts[0], []).append(index)
    return {group[0]: group for group in by_name.values() if len(group) > 1}


def _agree(dataset_name: str, model_name: str) -> bool:
    """Two class names that could be the same class: an alternative (or its singular form) in common."""
    d, m = _Name.of(dataset_name), _Name.of(model_name)
    return bool(set(d.alts) & set(m.alts) or set(d.keys("variant")) & set(m.keys("variant")))


def _lines_up(model_names: Mapping[int, str], dataset_labels: Sequence[str]) -> bool:
    """The dataset's classes are the model's, in the same order: same count, names agreeing by position."""
    return sorted(model_names) == list(range(len(dataset_labels))) and all(
        _agree(str(d), model_names[i]) for i, d in enumerate(dataset_labels)
    )


def _match_by_tiers(
    models: dict[int, _Name], wanted: list[_Name], skip: set[int]
) -> tuple[dict[int, int], dict[int, str], dict[int, list[int]], dict[int, str]]:
    """Rules 2-4 of the module docstring: (mapping, match kinds, ambiguous candidates, tier of each ambiguity)."""
    mapping: dict[int, int] = {}
    kinds: dict[int, str] = {}
    ambiguous: dict[int, list[int]] = {}
    ambiguous_in: dict[int, str] = {}
    for tier in MATCH_TIERS:
        claimed = set(mapping.values())
        free = {m_index: m for m_index, m in models.items() if m_index not in claimed}
        index = _build_index(tier, free)
        proposals: dict[int, int] = {}
        for d_index, d in enumerate(wanted):
            if d_index in mapping or d_index in ambiguous or d_index in skip or not d.alts:
                continue
            hits = _candidates(tier, d, free, index)
            if len(hits) == 1:
                proposals[d_index] = next(iter(hits))
            elif hits:
                ambiguous[d_index], ambiguous_in[d_index] = sorted(hits), tier
        taken: dict[int, list[int]] = {}
        for d_index, m_index in proposals.items():
            taken.setdefault(m_index, []).append(d_index)
        for m_index, d_indices in taken.items():
            if len(d_indices) == 1:
                mapping[d_indices[0]] = m_index
                kinds[d_indices[0]] = tier
            else:
                for d_index in d_indices:
                    ambiguous[d_index], ambiguous_in[d_index] = [m_index], tier
    return mapping, kinds, ambiguous, ambiguous_in


def _settle_duplicates(
    found: tuple[dict[int, int], dict[int, str], dict[int, list[int]], dict[int, str]],
    groups: dict[int, list[int]],
) -> dict[int, list[int]]:
    """Dataset classes ambiguous only between model classes of one repeated name take the first of them still
    free, and count the other free ones as the same class. Updates ``found``; returns the groups merged."""
    mapping, kinds, ambiguous, ambiguous_in = found
    merged: dict[int, list[int]] = {}
    for d_index in sorted(ambiguous):
        candidates = set(ambiguous[d_index])
        group = next((g for g in groups.values() if len(candidates) > 1 and candidates <= set(g)), None)
        free = [m for m in group or [] if m not in mapping.values()]
        if not free:
            continue
        mapping[d_index], kinds[d_index] = free[0], ambiguous_in[d_index]
        del ambiguous[d_index]
        if len(free) > 1:
            merged[free[0]] = free
    return merged


def _match_by_position(
    model_names: dict[int, str],
    dataset_labels: Sequence[str],
    model_groups: dict[int, list[int]],
    dataset_duplicates: dict[str, list[int]],
) -> LabelMatch:
    """Each dataset class matched to the model class at its position (the two line up, repeated names included)."""
    result = LabelMatch(
        mapping={i: i for i in range(len(dataset_labels))},
        matched_names={str(d): model_names[i] for i, d in enumerate(dataset_labels)},
        match_kinds={str(d): BY_POSITION for d in dataset_labels},
        duplicates={label_alternatives(model_names[first])[0]: group for first, group in model_groups.items()},
        dataset_duplicates=dataset_duplicates,
        duplicates_matched=BY_POSITION,
    )
    logger.info("%s", result.duplicates_note())
    return result


def _no_match_error(model_names: dict[int, str], dataset_labels: Sequence[str]) -> LabelMatchError:
    """The error when no dataset class matches a model class, with a hint when the model's labels are generic."""
    hint = ""
    if all(_GENERIC_LABEL.match(n) for n in model_names.values()):
        hint = " (the model's labels are generic LABEL_n: its config carries no class names)"
    return LabelMatchError(
        f"no dataset class ({preview(dataset_labels, 5, quote=True)}) matches a model class "
        f"({preview(list(model_names.values()), 5, quote=True)}){hint}: use a dataset of the model's classes"
    )


def _warn_unmatched(unmatched: list[str], total: int) -> None:
    """Warn that the ``unmatched`` dataset classes (of ``total``) are left out."""
    logger.warning(
        "%d/%d dataset classes match no model class and are left out: %s",
        len(unmatched),
        total,
        preview(unmatched, 5, quote=True),
    )


def match_labels(model_id2label: Mapping[int, str] | Mapping[str, str], dataset_labels: Sequence[str]) -> LabelMatch:
    """Match dataset class names to model classes (rules in the module docstring).

    Raises :class:`LabelMatchError` when no dataset class matches any model class.
    """
    if list(dataset_labels) == [UNLABELLED]:
        return LabelMatch(mapping={0: 0}, unlabelled=True)
    if not dataset_labels:
        raise LabelMatchError("the dataset has no class names: cannot match it to the model's classes")
    if not model_id2label:
        raise LabelMatchError("the model has no id2label: set config.id2label to its class names")
    model_names = {int(k): str(v) for k, v in model_id2label.items()}
    labels = [str(n).strip() for n in dataset_labels]
    if any(n in imagenet_1k() for n in labels) and not any(is_wordnet_id(n) for n in model_names.values()):
        return _match_wordnet_ids(model_names, labels)
    model_groups = _duplicate_groups(model_names)
    dataset_groups = _duplicate_groups(dict(enumerate(str(n) for n in dataset_labels)))
    dataset_duplicates = {
        label_alternatives(str(dataset_labels[first]))[0]: group for first, group in dataset_groups.items()
    }
    if (model_groups or dataset_groups) and _lines_up(model_names, dataset_labels):
        return _match_by_position(model_names, dataset_labels, model_groups, dataset_duplicates)
    models = {m_index: _Name.of(name) for m_index, name in model_names.items()}
    repeats = {index: first for first, group in dataset_groups.items() for index in group[1:]}
    found = _match_by_tiers(models, [_Name.of(str(n)) for n in dataset_labels], set(repeats))
    merged = _settle_duplicates(found, model_groups)
    mapping, kinds, ambiguous, _ = found
    for d_index, first in repeats.items():  # a repeated dataset name is the class of its first occurrence
        if first in mapping:
            mapping[d_index], kinds[d_index] = mapping[first], kinds[first]
        elif first in ambiguous:
            ambiguous[d_index] = ambiguous[first]

    if not mapping:
        raise _no_match_error(model_names, dataset_labels)
    result = LabelMatch(
        mapping=dict(sorted(mapping.items())),
        unmatched=[str(n) for i, n in enumerate(dataset_labels) if i not in mapping],
        matched_names={str(dataset_labels[d]): model_names[m] for d, m in sorted(mapping.items())},
        match_kinds={str(dataset_labels[d]): kinds[d] for d in sorted(mapping)},
        ambiguous={str(dataset_labels[d]): [model_names[m] for m in ms] for d, ms in sorted(ambiguous.items())},
        same_class={index: first for first, group in merged.items() for index in group[1:]},
        duplicates={label_alternatives(model_names[first])[0]: group for first, group in merged.items()},
        dataset_duplicates=dataset_duplicates,
        duplicates_matched="merged" if merged or dataset_duplicates else None,
    )
    if merged or dataset_duplicates:
        logger.info("%s", result.duplicates_note())
    if result.unmatched:
        _warn_unmatched(result.unmatched, len(dataset_labels))
    loose = {d: k for d, k in result.match_kinds.items() if k != "exact"}
    if loose:
        logger.info("label matches beyond exact names: %s", {d: result.matched_names[d] for d in loose})
    return result


def _imagenet_offset(model_names: Mapping[int, str]) -> tuple[int, int] | None:
    """Where a model holds ImageNet-1k's classes in its order: (index of its first class, 0 or 1 after a background
    class; positions whose names agree), when they agree at IMAGENET_ORDER_AGREEMENT of them; else None."""
    classes = list(imagenet_1k().values())
    for offset in (0, 1):
        if sorted(model_names) != list(range(IMAGENET_1K_CLASSES + offset)):
            continue
        agree = sum(_agree(c.name, model_names[c.index + offset]) for c in classes)
        if agree >= IMAGENET_ORDER_AGREEMENT * len(classes):
            return offset, agree
    return None


def _match_wordnet_ids(model_names: dict[int, str], labels: list[str]) -> LabelMatch:
    """Dataset classes named by ImageNet WordNet ID: by their ImageNet-1k index where the model's classes are
    ImageNet-1k's in order, else by their WordNet names."""
    table = imagenet_1k()
    ids = [n for n in labels if n in table]
    shown = f"{len(ids)} of them, e.g. {ids[0]} = {table[ids[0]].name!r}"
    placed = _imagenet_offset(model_names)
    if placed is not None:
        offset, agree = placed
        mapping = {d: table[n].index + offset for d, n in enumerate(labels) if n in table}
        after = ", after a background class" if offset else ""
        result = LabelMatch(
            mapping=mapping,
            unmatched=[n for d, n in enumerate(labels) if d not in mapping],
            matched_names={labels[d]: model_names[m] for d, m in mapping.items()},
            match_kinds={labels[d]: BY_WORDNET_ID for d in mapping},
            wordnet_ids=f"dataset classes are ImageNet WordNet IDs ({shown}): matched to the model's classes by their "
            f"ImageNet-1k index, as its class names are ImageNet-1k's in that order ({agree} of 1,000 agree{after})",
        )
    else:
        named = [table[n].name if n in table else n for n in labels]
        by_name = match_labels(model_names, named)
        wnid_of: dict[str, str] = {}
        for wnid, name in zip(labels, named, strict=True):
            wnid_of.setdefault(name, wnid)

        def keyed(names: dict[str, Any]) -> dict[str, Any]:
            return {wnid_of.get(k, k): v for k, v in names.items()}

        result = by_name.model_copy(
            update={
                "unmatched": [wnid_of.get(n, n) for n in by_name.unmatched],
                "matched_names": keyed(by_name.matched_names),
                "match_kinds": keyed(by_name.match_kinds),
                "ambiguous": keyed(by_name.ambiguous),
                "wordnet_ids": f"dataset classes are ImageNet WordNet IDs ({shown}): matched by their WordNet names, "
                "as the model's classes are not ImageNet-1k's in its order",
            }
        )
    logger.info("%s", result.wordnet_ids)
    if result.unmatched and placed is not None:
        _warn_unmatched(result.unmatched, len(labels))
    return result
