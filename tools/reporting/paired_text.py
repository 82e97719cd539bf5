"""How reports word paired accuracy, the data split, the selection and the confirmation (report.md, HTML, CLI).

Plain text (the HTML page escapes it), but for :func:`delta_ci_html`. A model's change is the candidate's
accuracy minus the original's on the same images, in points, with its 95 % interval (see
:mod:`tools.evaluation.paired`).
"""

from __future__ import annotations

from typing import Any

from tools.reporting.format import DASH, accuracy_pct, drop_as_change
from tools.schemas import PairedAccuracy, RunReport


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


#: How the report names each role's reads overlapping another's (``DataReads.overlaps``).
OVERLAP_TEXT = {
    "choose&fit": "{n:,} choose images also trained the distilled students (each judged on the half it did not "
    "train on)",
}


def split_text(dataset: dict[str, Any]) -> str | None:
    """``fit 256, choose 1,000, confirm 400 images (seeded; as read: disjoint)``; None without a dataset. Whether
    the parts stayed apart is what each role recorded reading (``DataReads``), not what was planned."""
    if not dataset.get("spec") or "evaluation_samples" not in dataset:
        return None
    fit = f"fit {dataset.get('calibration_samples', 0):,}"
    if dataset.get("finetune_samples"):
        fit += f" (+{dataset['finetune_samples']:,} for distillation)"
    if dataset.get("extra_images"):
        fit += f" (+{dataset['extra_images']:,} extra images, for distillation only)"
    elif dataset.get("extra_images_given"):
        fit += " (the extra images given were not used: no distillation ran)"
    misread = [role for role in dataset.get("extra_read_by") or [] if role != "fit"]
    if misread:
        fit += f" (the extra images were ALSO read by {', '.join(misread)})"
    confirm = dataset.get("confirm_samples", dataset.get("holdout_samples", 0))
    sizes = f"{fit}, choose {dataset.get('evaluation_samples', 0):,}, confirm {confirm:,} images"
    overlaps = dataset.get("overlaps") or {}
    if dataset.get("parts_disjoint") is None:
        return f"{sizes} (seeded)"
    if not overlaps:
        return f"{sizes} (seeded; as read: disjoint)"
    shared = "; ".join(
        OVERLAP_TEXT.get(pair, "{n:,} images read as both " + pair.replace("&", " and ")).format(n=n)
        for pair, n in overlaps.items()
    )
    untouched = "; the confirm images read by nothing else" if dataset.get("confirm_untouched") else ""
    return f"{sizes} (seeded; as read: {shared}{untouched})"


def selection_text(report: RunReport) -> str:
    """How the best round was chosen: on which images, and by which budget test."""
    n = report.dataset.get("evaluation_samples")
    images = f" ({n} images)" if n else ""
    limit = report.settings.get("max_accuracy_drop")
    budget = f"{limit:g} point{'' if limit == 1 else 's'}" if isinstance(limit, int | float) else "the budget"
    return (
        f"The best round was chosen on the choose images{images}. A round is within budget there when its accuracy "
        f"drop against the original, plus one standard error of the paired difference, is at most {budget}; the "
        "build that ships is then judged once on the confirm images."
    )


def confirmed_text(report: RunReport) -> str | None:
    """What ships, judged on the confirm images nothing chose on: its figure, the rule, and each look; None for a
    run that did not confirm (no deployment)."""
    confirmation = report.confirmation
    if not confirmation or not confirmation.get("looks"):
        return None
    looks = confirmation["looks"]
    last = looks[-1]
    result, step, rule = last.get("result"), last["step"], confirmation.get("rule") or {}
    if result is None:
        return (
            f"Not confirmed: no confirm images (the split left none, or no labels). {step['name']} ships on the "
            "figure of the images that chose it."
        )
    budget = f"{float(rule.get('max_drop_points', 0.0)):g}-point budget"
    how = (
        "the point estimate holds it"
        if rule.get("confidence") is None
        else f"its {100 * float(rule['confidence']):g} % one-sided bound holds it, counting "
        f"{_builds(int(rule.get('looks', 1)))} the sequence may test"
    )
    verdict = "within the" if last["passed"] and step.get("tested", True) else "shipped under the"
    if not step.get("tested", True):
        verdict, how = "ships under the", "the original's answers, untested"
    failed = [f"{look['step']['name']} {_look_change(look)}" for look in looks[:-1]]
    before = f" Failed first: {'; '.join(failed)} (look {len(looks)} at the confirm part)." if failed else ""
    return (
        f"Confirmed on {result.get('samples', 0):,} images nothing chose on: {step['name']} "
        f"{accuracy_pct(result.get('accuracy'))} vs original {accuracy_pct(result.get('baseline_accuracy'))}, "
        f"change {change_ci(result.get('accuracy_drop_points'), result.get('paired'))} points, "
        f"{verdict} {budget} ({how}).{before}"
    )


def _builds(count: int) -> str:
    return "the one build" if count == 1 else f"the {count} builds"


def _look_change(look: dict[str, Any]) -> str:
    result = look.get("result") or {}
    return change_ci(result.get("accuracy_drop_points"), result.get("paired"))


def _signed(points: float) -> str:
    return f"{round(points, 2) + 0.0:+.2f}"


def float_twins_text(candidates: list[dict[str, Any]]) -> str | None:
    """One line naming the float runtimes that took their PyTorch model's answers (``answers_of``), None if none."""
    twins = [f"{c['backend']}: {c['answers_of']}" for c in candidates if c.get("answers_of")]
    if not twins:
        return None
    return f"Float runtimes checked by their outputs instead of run on every image ({'; '.join(twins)})."


def tries_text(deployment: dict[str, Any]) -> str | None:
    """One line on the test the deployment's candidates were held to on the choose images, None without them. A build
    of a distilled round's two students judged together counts once, as the test counted it (``tries``)."""
    zs = {round(float(c["budget_z"]), 3) for c in deployment.get("candidates") or [] if c.get("budget_z") is not None}
    tries = int(deployment.get("tries") or 0)
    if not zs or not tries:
        return None
    z = "one standard error" if zs == {1.0} else f"{min(zs):.2f} to {max(zs):.2f} standard errors"
    return (
        f"Within budget on the choose images: drop + {z}, each of the {tries} builds judged "
        "(the two students' builds of a distilled round together, as one); the one that ships is then confirmed."
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
