"""The shared graph state: JSON-friendly values only (paths, metrics, plans as ``model_dump()``).

``InputState`` is what a caller gives, ``OutputState`` what a finished run returns; ``State`` is the
whole shared record the nodes read and write. No ``nn.Module`` or tensor is ever stored here.
``rounds`` and ``notes`` have reducers: a node returns only its new round or notes, and re-running a
node after a resume replaces its round or repeats a note without duplicating either.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict


def merge_rounds(existing: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Rounds in order of their number; a round returned again replaces the earlier record."""
    by_round = {r["round"]: r for r in existing or []}
    by_round.update({r["round"]: r for r in new or []})
    return [by_round[k] for k in sorted(by_round)]


def add_notes(existing: list[str] | None, new: list[str] | None) -> list[str]:
    """Notes in the order they were first written, each once; empty notes are dropped."""
    notes = list(existing or [])
    for note in new or []:
        if note and note not in notes:
            notes.append(note)
    return notes


class InputState(TypedDict, total=False):
    model: str
    """Hugging Face hub id, save_pretrained directory, or built-in name (vit-b16, deit-b16, swin-b, resnet-101)."""
    model_options: dict[str, Any] | None
    """For ``module.path:factory`` models: ``FactorySpec`` fields but ``factory`` (weights, labels, ...)."""
    dataset: str | None
    """Hub id, image folder, save_to_disk directory, or ``digits``; None only for untrained built-ins."""
    dataset_split: str | None


class OutputState(TypedDict, total=False):
    report_path: str
    summary: dict[str, Any]


class State(InputState, OutputState, total=False):
    run_dir: str
    model_info: dict[str, Any]
    """spec, source, family, model_class, untrained, num_labels, artifact (path of the saved original)."""
    input_shape: dict[str, Any]
    profile_path: str
    profile_summary: dict[str, Any]
    label_match: dict[str, Any] | None
    baseline: dict[str, Any]
    """``ModelEntry`` of the original model."""
    int8_profile: dict[str, Any] | None
    """Summary of the per-block int8 sensitivity (``profile/int8_sensitivity.json``): blocks, flips, target kind."""
    original_deployment: dict[str, Any] | None
    """``DeployChoice`` of the original through every runtime and precision (int8 at full precision)."""
    accuracy_budget: dict[str, Any] | None
    """``AccuracyBudget``: ``--max-accuracy-drop`` split between pruning (the rounds' test) and int8."""
    plan: dict[str, Any]
    """``PlanResult`` of the analysis (plan, source, planner_state): the plan quantization follows."""
    next_plan: dict[str, Any]
    """``PlanResult`` that the next ``prune_model`` applies (the analysis plan first, then each iteration's)."""
    pending_round: dict[str, Any] | None
    rounds: Annotated[list[dict[str, Any]], merge_rounds]
    """``RoundResult`` of every evaluated round, in order."""
    pruned: dict[str, Any] | None
    quantized: dict[str, Any] | None
    quantized_original: dict[str, Any] | None
    runtime_fp32_original: dict[str, Any] | None
    """``{artifact, backend}``: the original in the deployed runtime at FP32 (timed for the decomposed speed-up)."""
    speedup: dict[str, Any] | None
    """``SpeedupFactors`` of the deployed model: runtime x precision x pruning, from one interleaved timing run."""
    deployment: dict[str, Any] | None
    """``DeployChoice``: every runtime and precision measured for deployment, the one chosen and why."""
    review: dict[str, Any] | None
    """The last human decision: stage (analysis or round), round, action (approve, edit or reject)."""
    notes: Annotated[list[str], add_notes]
