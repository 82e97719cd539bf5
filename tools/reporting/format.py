"""How reports name and print things: the named models and small number formatters.

Shared by ``report.md``, ``report.html``, the CLI summary and the benchmark tables. Text tables write a
missing value as ``-`` (:data:`DASH`), the HTML page as an en dash (:data:`EN_DASH`): formatters that can
meet a missing value take it as ``missing``.
"""

from __future__ import annotations

from typing import Any

from tools.schemas import ModelEntry, RunReport

DASH = "-"
EN_DASH = "–"

#: The report's named models, in table order: (key in report.json, label for people). The deployed model
#: (``quantized``) and the original in its build (``quantized_original``) are named by the runtime and precision they
#: hold where the entry records them (:func:`named_entries`).
NAMED_MODELS = (
    ("baseline", "original"),
    ("pruned", "best pruned"),
    ("quantized", "deployed"),
    ("quantized_original", "original quantized"),
)


#: The deployed model's label when the deployment chose the unpruned original (no pruned model within the budget in
#: any runtime, or one faster and no larger than the pruned model's) and the entry does not say its build.
ORIGINAL_DEPLOYED = "original quantized (deployed)"


def build_text(entry: ModelEntry) -> str | None:
    """``openvino int8 static (NNCF)``: the runtime and precision an entry records; None when it records neither."""
    runtime, precision = getattr(entry, "runtime", None), getattr(entry, "precision", None)
    return " ".join(str(part) for part in (runtime, precision) if part) or None


def named_entries(report: RunReport) -> list[tuple[str, str, ModelEntry]]:
    """``(key, label, entry)`` of every named model the report holds, in table order: the deployed model is
    ``deployed: pruned, <runtime> <precision>`` (or ``original``), the original's build ``original, <runtime>
    <precision>`` -- what shipped by what it is, a float build never called quantized."""
    entries = (report.baseline, report.pruned, report.quantized, report.quantized_original)
    original = report.baseline.artifact if report.baseline is not None else None
    out = []
    for (key, label), e in zip(NAMED_MODELS, entries, strict=True):
        if e is None:
            continue
        build = build_text(e)
        if key == "quantized":
            which = "original" if original and getattr(e, "source", None) == original else "pruned"
            label = f"deployed: {which}, {build}" if build else (ORIGINAL_DEPLOYED if which == "original" else label)
        elif key == "quantized_original" and build:
            label = f"original, {build}"
        out.append((key, label, e))
    return out


def deployed_original(label: str) -> bool:
    """Whether a :func:`named_entries` label is the deployed model being the unpruned original."""
    return label.startswith("deployed: original") or label == ORIGINAL_DEPLOYED


def accuracy_pct(fraction: float | None, missing: str = "n/a") -> str:
    """An accuracy fraction as a percentage: 0.984 -> ``98.40%``."""
    return missing if fraction is None else f"{100 * fraction:.2f}%"


def millis(seconds: float | None, missing: str = DASH, unit: str = " ms") -> str:
    """Seconds as milliseconds: 0.00147 -> ``1.47 ms``."""
    return missing if seconds is None else f"{1000 * seconds:.2f}{unit}"


def millions(count: float | None, digits: int = 3, unit: str = " M", missing: str = DASH) -> str:
    """A count (parameters, MACs) in millions: 250314 -> ``0.250 M``."""
    return missing if count is None else f"{count / 1e6:.{digits}f}{unit}"


def times(base: float, other: float) -> str:
    """How many times ``other`` goes into ``base`` (a speed-up when both are latencies): ``1.33x``."""
    return f"{base / other:.2f}x"


def speedup(base: float | None, other: float | None, missing: str = DASH) -> str:
    """:func:`times`, or ``missing`` when either value is missing or zero."""
    return missing if not base or not other else times(base, other)


def percent_less(value: float, base: float | None, missing: str = DASH) -> str:
    """How much smaller ``value`` is than ``base``, in percent: 0.8 of 1.0 -> ``20.0%``."""
    return f"{100 * (1 - value / base):.1f}%" if base else missing


def signed_points(points: float | None, missing: str = "n/a") -> str:
    """A change in points with its sign: ``+0.50``, ``-1.25``."""
    return missing if points is None else f"{points:+.2f}"


def drop_as_change(drop_points: float | None) -> str:
    """An accuracy drop in points as a signed change: 0.5 -> ``-0.50``, 0 -> ``+0.00`` (never ``-0.00``)."""
    return DASH if drop_points is None else signed_points(round(-drop_points, 2) or 0.0)


def damage_text(planner_state: dict[str, Any] | None, paired: Any, missing: str = DASH) -> str:
    """A round's damage, predicted by the plan's damage model and measured: the share of answers changed against the
    original, ``predicted -> measured``."""
    predicted = (planner_state or {}).get("predicted_damage")
    agreement_value = getattr(paired, "agreement", None) if paired is not None else None
    if predicted is None and agreement_value is None:
        return missing
    left = missing if predicted is None else f"{100 * float(predicted):.1f} %"
    right = missing if agreement_value is None else f"{100 * (1 - float(agreement_value)):.1f} %"
    return f"{left} → {right}"


def recovery_text(prune_report: dict[str, Any] | None) -> str:
    """What repaired a round's model, with its time: recovery (layers refitted) and distillation, if any."""
    report = prune_report or {}
    recovery = report.get("recovery") or {}
    text = str(recovery.get("method", "none"))
    if recovery.get("requested") and recovery["requested"] != text:
        text += f" (not {recovery['requested']}: further from the original on held-out images)"
    layers = recovery.get("layers") or []
    if recovery.get("reconstructed"):
        kept = sum(1 for layer in layers if layer.get("choice") == "kept")
        bias = sum(1 for layer in layers if layer.get("choice") == "bias")
        text += f" ({len(recovery['reconstructed']) - kept} layers refitted"
        text += f" ({bias} bias only)" if bias else ""
        text += f", {kept} kept as pruned" if kept else ""
        text += f", {recovery['batchnorm_layers']} BatchNorm" if recovery.get("batchnorm_layers") else ""
        text += f", {recovery.get('seconds', 0):.1f} s)"
    judged = {j.get("method"): j for j in recovery.get("judged") or []}
    if judged.get("none") and judged.get(recovery.get("method")) and recovery.get("method") != "none":
        mine, plain = judged[recovery["method"]], judged["none"]
        text += (
            "; on held-out calibration images KL "
            f"{mine['kl']:.4f} against {plain['kl']:.4f} unrepaired, agreement {100 * mine['agreement']:.1f} % "
            f"against {100 * plain['agreement']:.1f} %"
        )
    tuned = report.get("finetune") or {}
    if tuned.get("steps"):
        bf16 = " in bf16" if tuned.get("precision") == "bf16" else ""
        cached = f", {tuned['views']} cached views after {tuned['cached_from']}" if tuned.get("views") else ""
        text += (
            f" + distillation {tuned['steps']} steps ({tuned.get('seconds', 0):.0f} s on {tuned.get('device')}{bf16}"
            f"{cached})"
        )
        if tuned.get("cross_fitted_from_round") is not None:  # agents.distillation: after the search, two students
            text += f" after the search, of round {tuned['cross_fitted_from_round']}"
            if tuned.get("started_from_round") is not None:
                text += f" from round {tuned['started_from_round']}'s students"
            text += ", once, on the fit images" if tuned.get("solo") else ", cross-fitted (x2)"
    return text
