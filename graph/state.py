"""The shared graph state: JSON-friendly values only (paths, metrics, plans as ``model_dump()``).

``InputState`` is what a caller gives, ``OutputState`` what a finished run returns; ``State`` is the
whole shared record the nodes read and write. No ``nn.Module`` or tensor is ever stored here.
"""

from __future__ import annotations

from typing import Any, TypedDict


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
    plan: dict[str, Any]
    plan_source: str
    plan_planner_state: dict[str, Any]
    current_plan: dict[str, Any]
    current_source: str
    current_planner_state: dict[str, Any]
    pending_round: dict[str, Any] | None
    rounds: list[dict[str, Any]]
    pruned: dict[str, Any] | None
    quantized: dict[str, Any] | None
    quantized_original: dict[str, Any] | None
    review: dict[str, Any] | None
    """The last human decision: stage (analysis or round), round, action (approve, edit or reject)."""
    notes: list[str]
