"""How reports word paired accuracy, the data split, the selection and the holdout (report.md, HTML, CLI).

Plain text (the HTML page escapes it), but for :func:`delta_ci_html`. A model's change is the candidate's
accuracy minus the original's on the same images, in points, with its 95 % interval (see
:mod:`tools.evaluation.paired`).
"""

from __future__ import annotations

from typing import Any

from tools.reporting.format import DASH, accuracy_pct, drop_as_change
from tools.schemas import PairedAccuracy, RunReport
from tools.stats import selection_z


def change_ci(drop_points: float | None, paired: PairedAccuracy | dict[str, float] | None, missing: str = DASH) -> str:
    """The accuracy change with its 95 % interval, ``-0.40 [-0.81, +0.01]``; the change alone without a pair."""
    if paired is None:
        text = drop_as_change(drop_points)
        return missing if text == DASH else text
    return f"{_signed(PairedAccuracy.model_validate(paired).delta_points)} {interval(paired)}"


def interval(paired: PairedAccuracy | dict[str, float] | None) -> str:
    """The 95 % interval of a paired change, ``[-0.81, +0.01]``; empty without a pair."""
    if paired is None:
        return ""
    p = PairedAccuracy.model_validate(paired)
    return f"[{_signed(p.ci95_low_points)}, {_signed(p.ci95_high_points)}]"


def delta_ci_html(drop_points: float | None, paired: PairedAccuracy | dict[str, float] | None) -> str:
    """The HTML cell of a change: coloured like :func:`~tools.reporting.html_parts.delta_html`, then the interval."""
    from tools.reporting.html_parts import delta_html, esc

    cell = delta_html(drop_points if paired is None else -PairedAccuracy.model_validate(paired).delta_points)
    return cell + (f' <span class="muted small">{esc(interval(paired))}</span>' if paired is not None else "")


def agreement(paired: PairedAccuracy | dict[str, float] | None, missing: str = DASH) -> str:
    """The share of images with the original's top-1 class: ``98.7%``."""
    if paired is None:
        return missing
    return f"{100 * PairedAccuracy.model_validate(paired).agreement:.1f}%"


def split_text(dataset: dict[str, Any]) -> str | None:
    """``calibration 256, evaluation 1000, holdout 0 images (disjoint, seeded)``; None without a dataset."""
    if not dataset.get("spec") or "evaluation_samples" not in dataset:
        return None
    sizes = ", ".join(
        f"{part} {dataset.get(f'{part}_samples', 0)}" for part in ("calibration", "evaluation", "holdout")
    )
    disjoint = {True: "disjoint, ", False: "OVERLAPPING, ", None: ""}[dataset.get("parts_disjoint")]
    return f"{sizes} images ({disjoint}seeded)"


def selection_text(report: RunReport) -> str:
    """How the best round was chosen: on which images, and by which budget test."""
    n = report.dataset.get("evaluation_samples")
    images = f" ({n} images)" if n else ""
    limit = report.settings.get("max_accuracy_drop")
    budget = f"{limit:g} point{'' if limit == 1 else 's'}" if isinstance(limit, int | float) else "the budget"
    return (
        f"The best round was chosen on the evaluation subset{images}. A round is within budget when its accuracy "
        f"drop against the original, plus one standard error of the paired difference, is at most {budget}."
    )


def holdout_text(report: RunReport) -> str | None:
    """The chosen model on the holdout images, against the original on the same images; None without one."""
    holdout = (report.pruned.model_extra or {}).get("holdout") if report.pruned is not None else None
    if not holdout:
        return None
    paired = holdout.get("paired")
    change = change_ci(holdout.get("accuracy_drop_points"), paired)
    agree = f", agreement {agreement(paired)}" if paired else ""
    return (
        f"Holdout ({holdout.get('samples', 0)} images used by neither calibration nor selection): best pruned "
        f"{accuracy_pct(holdout.get('accuracy'))} vs original {accuracy_pct(holdout.get('baseline_accuracy'))}, "
        f"change {change} points{agree}."
    )


def _signed(points: float) -> str:
    return f"{round(points, 2) + 0.0:+.2f}"


def float_twins_text(candidates: list[dict[str, Any]]) -> str | None:
    """One line naming the float runtimes that took their PyTorch model's answers (``answers_of``), None if none."""
    twins = [f"{c['backend']}: {c['answers_of']}" for c in candidates if c.get("answers_of")]
    if not twins:
        return None
    return f"Float runtimes checked by their outputs instead of run on every image ({'; '.join(twins)})."


def tries_text(candidates: list[dict[str, Any]]) -> str | None:
    """One line on the standard errors the deployment's candidates were held to as tries, None without them."""
    zs = [float(c["budget_z"]) for c in candidates if c.get("budget_z") is not None]
    if not zs:
        return None
    bonferroni = round(selection_z(len(zs)), 3)
    if min(zs) >= bonferroni:
        return f"Within budget: drop + {bonferroni:.2f} standard errors, as one of {len(zs)} tries (Bonferroni)."
    return (
        f"Within budget: drop + z standard errors, as one of {len(zs)} tries: z {max(zs):.2f} to {min(zs):.2f}, from "
        "a step-down simultaneous test resampling the evaluation images (builds of one model give nearly the same "
        "answers and count nearly as one try, and tries surely over the budget count for little; Bonferroni would hold "
        f"each to {bonferroni:.2f})."
    )


def stopped_text(
    rows: list[tuple[str, PairedAccuracy | dict[str, float] | None]], images: int, halves: set[int] | None = None
) -> str | None:
    """One line naming the candidates sequential evaluation stopped (fewer than ``images`` paired), None if none;
    ``halves``: the sizes a distilled round's students are judged on, which are not stops."""
    stopped = [
        f"{name} after {p.samples:,}"
        for name, raw in rows
        if raw is not None
        and (p := PairedAccuracy.model_validate(raw)).samples < images
        and p.samples not in (halves or set())
    ]
    if not stopped or images <= 0:
        return None
    return (
        f"Stopped early (sequential evaluation): {', '.join(stopped)} of {images:,} images, clearly over the "
        "accuracy budget (even the optimistic end of a 3-standard-error interval lost more)."
    )
