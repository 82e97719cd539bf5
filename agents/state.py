"""The shared graph state: the project's pydantic records, kept in the checkpoints as their JSON form.

``InputState`` is what a caller gives, ``OutputState`` what a finished run returns (both plain JSON: what
``langgraph dev``, the SDK and ``graph.invoke({"model": ..., "dataset": ...})`` exchange); ``State`` is the whole
shared record the nodes read and write. Each node receives a validated :class:`State` (LangGraph validates the
channels' values into it), reads its records' attributes, and returns only the keys it changes, as records.

Every record channel keeps what it is given as ``model_dump()`` (:class:`JsonRecord`, :func:`merge_rounds`), and
``graph.builder`` hands LangGraph each node's update as JSON too (its pending writes): the checkpoints hold plain
JSON as they always did, so the serializer needs no registered types, and a checkpoint
written before the state was typed validates into :class:`State` as it is (:func:`state_of` says in one line which
field does not, and what to do). No ``nn.Module`` or tensor is ever stored here.

``rounds`` and ``notes`` have reducers: a node returns only its new round or notes, and re-running a node after a
resume replaces its round or repeats a note without duplicating either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypedDict, TypeVar

from langgraph.channels import LastValue
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from tools.deploy.choice import DeployChoice
from tools.deploy.speedup import SpeedupFactors
from tools.evaluation.confirm import Confirmation
from tools.evaluation.labels import LabelMatch
from tools.schemas import (
    AccuracyBudget,
    BaselineEntry,
    DeployedBuild,
    DeployedEntry,
    InputShape,
    Int8ProfileSummary,
    ModelInfo,
    NodeTime,
    PendingRound,
    PlanResult,
    ProfileSummary,
    PrunedEntry,
    Review,
    RoundResult,
    RunSummary,
    RuntimeReference,
)

T = TypeVar("T")


def as_json(value: object) -> object:
    """A record as its ``model_dump()``, and so each record in a list or dict; anything else (None, plain values, an
    old checkpoint's dict) as it is."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


class JsonRecord(LastValue[Any]):
    """The last value written, kept as its JSON form: a node returns a record, the checkpoint holds its dump."""

    def update(self, values: Sequence[Any]) -> bool:
        return super().update([as_json(v) for v in values])


Record = Annotated[T, JsonRecord]
"""A state field holding a record: validated into ``T`` when a node reads it, stored as JSON."""


def merge_rounds(
    existing: Sequence[RoundResult | Mapping[str, object]] | None,
    new: Sequence[RoundResult | Mapping[str, object]] | None,
) -> list[object]:
    """Rounds in order of their number, as JSON; a round returned again replaces the earlier record."""
    by_round: dict[int, RoundResult] = {}
    for r in [*(existing or []), *(new or [])]:
        record = RoundResult.model_validate(r)
        by_round[record.round] = record
    return [by_round[k].model_dump() for k in sorted(by_round)]


def add_notes(existing: list[str] | None, new: list[str] | None) -> list[str]:
    """Notes in the order they were first written, each once; empty notes are dropped."""
    notes = list(existing or [])
    for note in new or []:
        if note and note not in notes:
            notes.append(note)
    return notes


def add_times(
    existing: Sequence[NodeTime | Mapping[str, object]] | None, new: Sequence[NodeTime | Mapping[str, object]] | None
) -> list[object]:
    """Node times in the order the nodes ran, as JSON."""
    return [as_json(NodeTime.model_validate(t)) for t in [*(existing or []), *(new or [])]]


class InputState(TypedDict, total=False):
    model: str
    """Hugging Face hub id, save_pretrained directory, or built-in name (vit-b16, deit-b16, swin-b, resnet-101)."""
    model_options: dict[str, JsonValue] | None
    """For ``module.path:factory`` models: ``FactorySpec`` fields but ``factory`` (weights, labels, ...)."""
    dataset: str | None
    """Hub id, image folder, save_to_disk directory, or ``digits``; None only for untrained built-ins."""
    dataset_split: str | None
    started_at: float | None
    """When the run was started (unix seconds): the report's time table counts the start before the first node."""


class OutputState(TypedDict, total=False):
    report_path: str
    summary: RunSummary
    """The report's four model entries; a caller of ``graph.invoke`` receives its JSON form (``model_dump()``)."""


class State(BaseModel):
    """What the nodes share. A field is None (or empty) until the node that writes it has run."""

    model_config = ConfigDict(extra="ignore")

    # --- the input (InputState) ---
    model: str
    model_options: dict[str, JsonValue] | None = None
    dataset: str | None = None
    dataset_split: str | None = None
    started_at: float | None = None
    # --- the output (OutputState) ---
    report_path: str | None = None
    summary: Record[RunSummary | None] = None
    # --- written by the nodes ---
    run_dir: str | None = None
    model_info: Record[ModelInfo | None] = None
    """spec, source, family, model_class, untrained, num_labels, artifact (path of the saved original)."""
    input_shape: Record[InputShape | None] = None
    profile_path: str | None = None
    profile_summary: Record[ProfileSummary | None] = None
    label_match: Record[LabelMatch | None] = None
    baseline: Record[BaselineEntry | None] = None
    """The original model's metrics, with the data's parts (``data_parts``)."""
    int8_profile: Record[Int8ProfileSummary | None] = None
    """Summary of the per-block int8 sensitivity (``profile/int8_sensitivity.json``): blocks, flips, target kind."""
    original_deployment: Record[DeployChoice | None] = None
    """The original through every runtime and precision (int8 at full precision)."""
    accuracy_budget: Record[AccuracyBudget | None] = None
    """``--max-accuracy-drop`` split between pruning (the rounds' test) and int8."""
    plan: Record[PlanResult | None] = None
    """The analysis plan (plan, source, planner_state): the plan quantization follows."""
    next_plan: Record[PlanResult | None] = None
    """The plan the next ``prune_model`` applies (the analysis plan first, then each iteration's)."""
    pending_round: Record[PendingRound | None] = None
    rounds: Annotated[list[RoundResult], merge_rounds] = Field(default_factory=list)
    """Every evaluated round, in order."""
    pruned: Record[PrunedEntry | None] = None
    quantized: Record[DeployedEntry | DeployedBuild | None] = Field(default=None, union_mode="left_to_right")
    quantized_original: Record[DeployedEntry | DeployedBuild | None] = Field(default=None, union_mode="left_to_right")
    runtime_fp32_original: Record[RuntimeReference | None] = None
    """The original in the deployed runtime at FP32 (timed for the decomposed speed-up)."""
    speedup: Record[SpeedupFactors | None] = None
    """The deployed model's speed-up: runtime x precision x pruning, from one interleaved timing run."""
    deployment: Record[DeployChoice | None] = None
    """Every runtime and precision measured for deployment, the one chosen and why."""
    confirmation: Record[Confirmation | None] = None
    """The shipped build judged on the confirm part: the rule, the sequence declared before looking, each look."""
    review: Record[Review | None] = None
    """The last human decision: stage (analysis or round), round, action (approve, edit or reject)."""
    notes: Annotated[list[str], add_notes] = Field(default_factory=list)
    time_spent: Annotated[list[NodeTime], add_times] = Field(default_factory=list)
    """Every node's run, in order: its seconds and their kinds of work (added by the graph, not the nodes)."""


class StateError(ValueError):
    """Checkpointed values that do not validate into this version's :class:`State`."""


def state_of(values: Mapping[str, object]) -> State:
    """The checkpointed ``values`` as a :class:`State`; :class:`StateError` in one line naming the field that does
    not fit (a checkpoint written by a version whose records differ) and what to do."""
    try:
        return State.model_validate(dict(values))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "the state"
        raise StateError(
            f"the checkpoint's {field} does not fit this version's graph state ({first['msg']}): finish the run "
            "with the version that started it, or start it again with a new --run-dir"
        ) from None
