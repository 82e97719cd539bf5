"""Confirmation agent: the build that ships, judged once on the confirm part, which nothing chose on.

``confirm_deployment`` runs after the deployed build is evaluated. On its first call it declares the sequence of
builds it may look at (``tools.evaluation.confirm.confirm_sequence``, from the choose part only), then judges the
shipped build on the confirm images. When the build fails the budget there, the next build of the sequence is
chosen instead (the graph builds and evaluates it, and comes back here): what ships is within the budget by
construction, the original's float build at the last, and the notes say what failed and by how much.
"""

from __future__ import annotations

from pathlib import Path

from langgraph.runtime import Runtime

from agents.common import budget_points, disagreement_budget, need, paths, settings, shape_of
from agents.context import Context
from agents.evaluation import eval_spec
from agents.state import State
from tools.deploy.choice import DeployCandidate
from tools.deploy.registry import FLOAT
from tools.evaluation.confirm import (
    Confirmation,
    ConfirmLook,
    ConfirmRule,
    ConfirmStep,
    confirm_sequence,
    fallback_choice,
)
from tools.reporting.paired_text import change_ci
from tools.schemas import PartAccuracy, PrunedEntry
from tools.stages import ops
from tools.stages.run_data import confirming


def _declared(state: State, ctx: Context) -> tuple[Confirmation, DeployCandidate]:
    """The confirmation so far, or a new one with its rule and sequence declared before any look."""
    choice = need(state.deployment, "deployment")
    sequence, last = confirm_sequence(choice, paths(state).original)
    if state.confirmation is not None:
        return state.confirmation, last
    rows = int(need(state.baseline, "baseline").data_parts.get("confirm", 0))
    return Confirmation(rule=_rule(state, ctx, sequence), sequence=sequence, rows=rows), last


def _rule(state: State, ctx: Context, sequence: list[ConfirmStep]) -> ConfirmRule:
    return ConfirmRule(
        max_drop_points=budget_points(state, ctx),
        max_disagreement_pct=disagreement_budget(state, ctx),
        confidence=ctx.confidence,
        looks=max(1, sum(step.tested for step in sequence)),
    )


def _confirmed_on(state: State, ctx: Context, artifact: Path, rows: int) -> PartAccuracy | None:
    """``artifact``'s figure on the confirm part (None without one): the one place the run reads it."""
    if rows <= 0:
        return None
    with confirming():
        spec = eval_spec(state, ctx)
        return ops.evaluate_accuracy_on(artifact, paths(state).original, shape_of(state), spec, "confirm")


def _confirm_float(state: State, ctx: Context) -> dict[str, object]:
    """``--no-quantize``: what ships is the kept round's float model, judged on the confirm part the same way; when
    it fails, the original ships (``pruned`` reports it, as when no round was within the budget)."""
    pruned = state.pruned
    if pruned is None or pruned.round is None or not pruned.artifact or state.confirmation is not None:
        return {}  # the original ships as it is: nothing to confirm
    original = str(paths(state).original)
    sequence = [
        ConfirmStep(backend=FLOAT, name=f"round {pruned.round} (float)"),
        ConfirmStep(backend=FLOAT, source=original, ships="original", name="the original", tested=False),
    ]
    rows = int(need(state.baseline, "baseline").data_parts.get("confirm", 0))
    confirmation = Confirmation(rule=_rule(state, ctx, sequence), sequence=sequence, rows=rows)
    result = _confirmed_on(state, ctx, Path(pruned.artifact), rows)
    rule = confirmation.rule
    passed = result is None or rule.passes(result)
    bound = rule.bound_points(result) if result is not None else None
    looks = [ConfirmLook(step=sequence[0], result=result, bound_points=bound, passed=passed)]
    confirmation = confirmation.model_copy(update={"looks": looks})
    update: dict[str, object] = {"notes": [_look_note(confirmation, looks[0])]}
    if passed:
        return {**update, "confirmation": confirmation, "pruned": pruned.model_copy(update={"confirmed": result})}
    baseline = need(state.baseline, "baseline").model_dump(exclude={"data_parts"})
    original_entry = PrunedEntry.model_validate(
        {**baseline, "round": None, "within_budget": False, "accuracy_drop_points": 0.0}
    )
    confirmation.looks.append(ConfirmLook(step=sequence[1], passed=True))
    return {**update, "confirmation": confirmation, "pruned": original_entry}


def confirm_deployment(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    """Judge the shipped build on the confirm part; on a failure, choose the next build of the declared sequence
    (with ``--no-quantize``, the kept round's float model, else the original)."""
    ctx = settings(runtime)
    if state.deployment is None:
        return _confirm_float(state, ctx)
    confirmation, last = _declared(state, ctx)
    step = confirmation.next_step()
    quantized = state.quantized
    artifact = need(quantized.artifact if quantized is not None else None, "quantized model's artifact")
    if step is None:  # a resumed run that had finished confirming
        return {}
    result = _confirmed_on(state, ctx, Path(artifact), confirmation.rows)
    rule = confirmation.rule
    passed = not step.tested or result is None or rule.passes(result)
    bound = rule.bound_points(result) if result is not None else None
    look = ConfirmLook(step=step, result=result, bound_points=bound, passed=passed)
    confirmation = confirmation.model_copy(update={"looks": [*confirmation.looks, look]})
    update: dict[str, object] = {"confirmation": confirmation}
    if result is not None and quantized is not None:
        update["quantized"] = quantized.model_copy(update={"confirmed": result})
    notes = [_look_note(confirmation, look)]
    following = confirmation.next_step()
    if following is not None:
        why = f"confirmation: {step.name} failed the budget on the confirm part; {following.name} ships instead"
        row = last if (last.backend, last.source) == (following.backend, following.source) else None
        update["deployment"] = fallback_choice(need(state.deployment, "deployment"), following, row, why)
    update["notes"] = notes
    return update


def _look_note(confirmation: Confirmation, look: ConfirmLook) -> str:
    """What one look found, in one line."""
    rule, result = confirmation.rule, look.result
    nth = len(confirmation.looks)
    which = "" if nth == 1 else f" (look {nth} at the confirm part: the builds before it failed)"
    if result is None:
        return (
            f"confirmation: no confirm images (the split left none, or no labels): {look.step.name} ships on the "
            "figure of the images that chose it"
        )
    figure = f"Δ {change_ci(result.accuracy_drop_points, result.paired)} points on {result.samples:,} confirm images"
    if not look.step.tested:
        return f"confirmation: {look.step.name}, the original's float build, ships untested{which}: {figure}"
    verdict = "holds" if look.passed else "fails"
    return (
        f"confirmation: {look.step.name} {verdict} the {rule.max_drop_points:g}-point budget{which}: {figure} "
        f"({rule.describe()}; tested drop {look.bound_points or 0.0:.2f})"
    )
