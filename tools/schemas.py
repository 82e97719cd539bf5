"""Pydantic structures that cross a boundary: plans, profiles, metrics, reports.

Everything here serialises with ``model_dump()`` to JSON-friendly values, so graph state,
reports and LLM structured output all speak the same schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PruningType = str
"""A unit kind's name: the key of ``tools.compression.units.UNIT_KINDS`` (channels, heads, head width, blocks)."""
QuantDType = Literal["qint8", "float16", "float32"]
"""A layer's deployed precision: int8, float16 (torch-ao-dynamic only), or float32 (kept in float: mixed precision)."""


class PruningRecommendation(BaseModel):
    """One pruning decision of the paper's schema: a regex over module names and a ratio."""

    model_config = ConfigDict(extra="forbid")

    justification: str = Field(default="", description="Why this layer group is pruned at this ratio.")
    layer: str = Field(description="Regular expression matched (re.search) against module names.")
    pruning_type: PruningType = Field(
        description="The unit kind that acts on the layers: what a ratio of them removes (the prompt lists the kinds)."
    )
    pruning_ratio: float = Field(
        ge=0.0,
        le=1.0,
        description="Fraction of the units' channels, heads or head dimensions removed; 1 for a kind removed whole.",
    )


class QuantizationRecommendation(BaseModel):
    """One quantization decision of the paper's schema."""

    model_config = ConfigDict(extra="forbid")

    justification: str = Field(default="", description="Why these layers are quantized with this dtype.")
    layer: str = Field(
        default="all",
        description="'all' for every layer the backend quantizes (nn.Linear; Conv too for static int8), or a regex "
        "over module names; a later recommendation overrides an earlier one for the layers both select.",
    )
    quantization_type: Literal["dynamic", "static"] = Field(
        default="dynamic",
        description="dynamic (activations quantized per call) or static (activation ranges calibrated); the "
        "deployment measures both kinds of backend either way.",
    )
    dtype: QuantDType = Field(default="qint8", description="qint8, float16, or float32 (the layers stay in float).")


class OptimizationPlan(BaseModel):
    """The analysis agent's output: layer-wise pruning and quantization recommendations."""

    model_config = ConfigDict(extra="forbid")

    pruning_recommendations: list[PruningRecommendation] = Field(default_factory=list)
    quantization_recommendations: list[QuantizationRecommendation] = Field(default_factory=list)


class PlanResult(BaseModel):
    """A plan, who wrote it (``rules``, ``llm``, ``llm-repaired``, ``rules-fallback``, ``human``) and the planner's
    own state, which later rounds read back from the history."""

    plan: OptimizationPlan
    source: str
    planner_state: dict[str, Any] = Field(default_factory=dict)


class ModelInfo(BaseModel):
    """The acquired model: where it came from and the saved original (``artifact``)."""

    spec: str
    source: str
    family: str
    model_class: str
    untrained: bool
    num_labels: int
    params: int
    artifact: str


class InputShape(BaseModel):
    channels: int = Field(ge=1)
    height: int = Field(ge=1)
    width: int = Field(ge=1)
    source: str = Field(default="config", description="Where the shape came from: config, processor, llm ...")
    channels_source: str | None = Field(
        default=None, description="Where the channels came from: '--channels', 'first convolution conv1', ..."
    )
    size_source: str | None = Field(
        default=None, description="Where height and width came from: '--image-size', 'processor.crop_size', ..."
    )

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)

    def describe(self) -> str:
        """``channels: 1 (first convolution conv1); image size: 28 × 28 (--image-size)``, or shape and source."""
        if self.channels_source is None and self.size_source is None:
            return f"{self.channels} × {self.height} × {self.width} (from {self.source})"
        return (
            f"channels: {self.channels} ({self.channels_source or self.source}); "
            f"image size: {self.height} × {self.width} ({self.size_source or self.source})"
        )


class LayerProfile(BaseModel):
    """Static and dynamic figures of one leaf module (Conv2d, Linear, LayerNorm, ...)."""

    name: str
    type: str
    params: int = 0
    macs: int = 0
    latency_s: float = 0.0
    latency_share: float = 0.0
    macs_share: float = 0.0
    params_share: float = 0.0
    output_shape: list[int] | None = None


class LayerGroupProfile(BaseModel):
    """Layers that repeat across blocks (e.g. every ``vit.layers.N.mlp.fc1``), aggregated.

    ``pattern`` is a regex that selects exactly the group's modules and can be used in a plan.
    """

    pattern: str
    type: str
    count: int
    params: int
    macs: int
    latency_s: float
    latency_share: float
    macs_share: float
    params_share: float


class OperatorProfile(BaseModel):
    """One row of torch.profiler's key averages."""

    name: str
    count: int
    self_cpu_time_s: float
    cpu_time_total_s: float
    self_cpu_memory_mb: float = 0.0
    cpu_memory_mb: float = 0.0
    self_device_time_s: float = 0.0
    device_time_total_s: float = 0.0
    input_shapes: str = ""


class SensitivityPoint(BaseModel):
    """One unit pruned alone at one ratio (then recovered), measured on the calibration images."""

    ratio: float
    params_saved: int = Field(description="Parameters removed from the whole model.")
    macs_saved: int = Field(default=0, description="MACs saved per image (profiled layer MACs x ratio).")
    latency_saved_s: float = Field(default=0.0, description="Profiled latency of the unit's layers x ratio.")
    agreement: float = Field(description="Fraction of calibration images with the original's top-1 class.")
    kl: float = Field(description="Mean KL(original || pruned) of the softmax outputs, nats.")
    accuracy_drop_points: float | None = Field(default=None, description="Where labels exist: points lost.")


class SensitivityUnit(BaseModel):
    """Something a plan addresses on its own: one attention module's heads, one MLP's hidden channels,
    one block-internal conv group. ``pattern`` selects it in a ``PruningRecommendation``."""

    pattern: str
    pruning_type: PruningType
    kind: str = Field(default="", description="Its kind, a name of tools.compression.units.UNIT_KINDS.")
    modules: list[str]
    members: list[str] = Field(
        default_factory=list,
        description="A coupled group's Conv2d/Linear layers whose output channels are pruned with modules[0].",
    )
    size: int = Field(description="Heads (head) or output channels (structured) of the unit.")
    step: int = Field(
        default=0, description="Kept counts are rounded to a multiple of this (0: any count); see reachable_ratio."
    )
    params: int = Field(default=0, description="Parameters of the unit's layers and their consumers.")
    points: list[SensitivityPoint] = Field(default_factory=list)


class SensitivityProfile(BaseModel):
    """Measured damage of pruning each unit alone, after recovery; what planners allocate ratios from."""

    samples: int = Field(description="Calibration images each probe is judged on (its repair was not fit on them).")
    fit_samples: int | None = Field(
        default=None,
        description="Calibration images each probe's importance and repair were fit on (None: profiles before "
        "probes were judged out of sample, on the images they were fit on).",
    )
    importance: str
    recovery: str
    ratios: list[float]
    seconds: float
    latency_runtime: str | None = Field(
        default=None,
        description="Where each point's latency saving was measured (--objective latency: the timing build that "
        "stands for the original's deployment, a name of tools.deploy.registry.TIMED; batch 1); None: the "
        "profile's per-layer latency times the ratio.",
    )
    units: list[SensitivityUnit] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)
    fixed_ridge: dict[str, int] = Field(
        default_factory=dict,
        description="Units whose probes refit their consumers (how many) at a fixed ridge strength, not one "
        "cross-validated: too costly for a probe, or past the profile's time for cross-validated refits.",
    )


class Int8GroupDamage(BaseModel):
    """What int8 does to the model when one block of layers alone is quantized (the rest kept in float)."""

    group: str = Field(description="The block: module names up to their last numbered part (vit.layers.3).")
    layers: list[str] = Field(description="Its layers with weights int8 quantizes (Conv, Linear).")
    kl: float = Field(description="Mean KL divergence of the int8 model's class probabilities from the float's (nats).")
    flips_pct: float = Field(description="Images whose top-1 class changes, % of the images measured.")


class Int8Sensitivity(BaseModel):
    """Measured per-block int8 sensitivity: static int8 in a real runtime on this CPU, on calibration images."""

    backend: str = Field(description="The runtime and backend measured (onnxruntime-static).")
    int8: dict[str, Any] = Field(description="The int8 settings used: target CPU kind, 7-bit weights, the CPU.")
    images: int
    full_kl: float = Field(description="KL divergence with every block int8.")
    full_flips_pct: float = Field(description="Top-1 flips with every block int8, %.")
    groups: list[Int8GroupDamage] = Field(default_factory=list, description="Most damaging first.")
    seconds: float


class ModelProfile(BaseModel):
    """What ``profile.json`` holds."""

    model_class: str
    family: str
    device: str
    input_shape: list[int]
    total_params: int
    total_macs: int
    grouped_conv_macs: int = Field(
        default=0, description="Of total_macs, those of grouped (depthwise) convolutions (twin.GROUPED_CONV_COST)."
    )
    attention: bool = Field(
        default=False, description="The model has attention modules (distill_budget.AUTO_DISTILL_LR_ATTENTION)."
    )
    latency_s: float = Field(description="Mean forward latency at batch size 1, seconds.")
    peak_memory_mb: float = 0.0
    layers: list[LayerProfile] = Field(default_factory=list)
    groups: list[LayerGroupProfile] = Field(default_factory=list)
    operators: list[OperatorProfile] = Field(default_factory=list)
    trace_path: str | None = None
    uncounted_macs: dict[str, int] = Field(
        default_factory=dict, description="Module type -> modules with weights whose MACs no rule counted."
    )
    sensitivity: SensitivityProfile | None = None
    int8_sensitivity: Int8Sensitivity | None = None
    int8_not_measured: str | None = Field(
        default=None, description="Why no per-block int8 sensitivity was measured, when the run said (no table)."
    )


class AccuracyBudget(BaseModel):
    """How ``--max-accuracy-drop`` is split between pruning and int8, from int8's damage to the original."""

    total_points: float
    int8_reserve_points: float = Field(description="Kept for int8: what the original's int8 deployment loses.")
    pruning_points: float = Field(description="What pruning rounds are held to: total less the int8 reserve.")
    measured_with: str | None = Field(default=None, description="The deployment of the original it was measured on.")
    why: str = Field(default="", description="One line for the report.")


class PairedAccuracy(BaseModel):
    """A candidate's accuracy against the original's on the same images, with a 95 % interval.

    ``delta_points`` = candidate - original (negative: a loss); the interval is the normal approximation
    of the mean paired difference of per-image correctness (each image counts +1, 0 or -1).
    """

    delta_points: float
    ci95_low_points: float
    ci95_high_points: float
    agreement: float = Field(description="Fraction of images with the original's top-1 class.")
    samples: int
    gained: int = Field(description="Images the candidate gets right and the original wrong.")
    lost: int = Field(description="Images the original gets right and the candidate wrong.")


class Metrics(BaseModel):
    """One evaluated model. ``accuracy`` is a fraction in [0, 1], or None when not meaningful."""

    accuracy: float | None = None
    params: int
    macs: int | None = None
    latency_s: float
    throughput_ips: float | None = Field(default=None, description="Images per second at the eval batch size.")
    memory_mb: float = Field(description="Size of the model as saved for deployment, in 10^6 bytes.")
    artifact: str | None = None
    samples: int = 0
    within_budget: bool | None = None
    paired: PairedAccuracy | None = Field(default=None, description="Against the original, same images.")
    deploy_latency_s: float | None = Field(
        default=None,
        description="--objective latency: batch-1 seconds in the build the original deploys in (deploy_backend), "
        "timed interleaved with the original's own build of it.",
    )
    deploy_backend: str | None = None
    deploy_speedup: float | None = Field(
        default=None, description="The original's latency in that build over this model's (higher: faster)."
    )


# --- records of a run: what the nodes write, and what the report, plots, CLI and bench read -----------


class PartAccuracy(BaseModel):
    """A model's accuracy on one part of the data (the confirm part), with the original's on the same images."""

    part: str
    accuracy: float | None
    samples: int
    baseline_accuracy: float | None = None
    accuracy_drop_points: float | None = Field(default=None, description="Points lost against the original.")
    paired: PairedAccuracy | None = None


class ModelEntry(Metrics):
    """A model the run produced (baseline, best pruned, quantized) with its metrics.

    Besides the metrics, an entry may carry where it came from: ``round``, ``plan`` and ``source`` for
    the best pruned model, ``source``, ``layers`` and ``backend`` for a quantized one.
    """

    model_config = ConfigDict(extra="allow")

    accuracy_drop_points: float | None = Field(default=None, description="Points lost against the baseline.")
    latency_measured: str | None = Field(default=None, description="'interleaved' once the final comparison ran.")
    latency_device: str | None = Field(default=None, description="Where latency_s was measured (cpu, cuda).")
    round: int | None = Field(default=None, description="Best pruned model: the round it comes from.")
    student: int | None = Field(
        default=None,
        description="Best pruned model of a round distilled after the search: 2 when its second student deploys "
        "(the first was over the budget on the half it was judged on).",
    )
    confirmed: PartAccuracy | None = Field(
        default=None,
        description="What ships, on the confirm part, which nothing chose on (paired with the original there); the "
        "entry's other figures are on the choose part.",
    )


class BaselineEntry(ModelEntry):
    """The original model's entry: its metrics, the rows each disjoint part of the data holds, and whether its
    accuracy is at chance level, or so near it that a candidate answering at random would pass the accuracy budget
    (untrained, or labels that do not match: ``tools.evaluation.accuracy.chance_note``)."""

    data_parts: dict[str, int] = Field(
        default_factory=dict, description="calibration, evaluation, confirm, finetune, total, unreadable."
    )
    at_chance: bool = False


class PrunedEntry(ModelEntry):
    """The best pruned model (the original's metrics, ``round`` None, where no round stayed within budget): its
    round's plan and planner."""

    plan: OptimizationPlan | None = None
    source: str | None = Field(default=None, description="Who wrote the round's plan (rules, llm, human ...).")
    selected_round: int | None = Field(
        default=None, description="The round selection kept, where a round with more headroom deploys instead."
    )


class DeployedBuild(BaseModel):
    """A deployed model as built (``quantized``, ``quantized_original``), before it is evaluated."""

    artifact: str
    source: str = Field(description="The float model it was built from.")
    backend: str
    runtime: str
    precision: str


class DeployedEntry(ModelEntry):
    """A deployed model as evaluated: its build and its metrics."""

    source: str | None = Field(default=None, description="The float model it was built from.")
    backend: str | None = None
    runtime: str | None = None
    precision: str | None = None


class RuntimeReference(BaseModel):
    """The original in the deployed runtime at FP32: timed with the others to split the deployed speed-up."""

    artifact: str
    backend: str


class TopGroup(BaseModel):
    pattern: str
    latency_share: float
    macs_share: float


class SensitivitySummary(BaseModel):
    units: int
    samples: int
    seconds: float


class ProfileSummary(BaseModel):
    """The profile in brief (``profile.json`` holds it all): totals, the five slowest layer groups and, once
    measured, the sensitivity profile's size."""

    total_params: int
    total_macs: int
    grouped_conv_macs: int = Field(default=0, description="Of total_macs, those of grouped (depthwise) convolutions.")
    attention: bool = Field(default=False, description="The model has attention modules.")
    latency_s: float
    peak_memory_mb: float = 0.0
    trace_path: str | None = None
    top_groups: list[TopGroup] = Field(default_factory=list)
    sensitivity: SensitivitySummary | None = None

    @classmethod
    def of(cls, profile: ModelProfile, groups: int = 5) -> ProfileSummary:
        """``profile`` in brief: its totals and its ``groups`` slowest layer groups."""
        top = [TopGroup.model_validate(g, from_attributes=True) for g in profile.groups[:groups]]
        totals = profile.model_dump(include=set(cls.model_fields) - {"top_groups", "sensitivity"})
        return cls.model_validate(totals | {"top_groups": top})


class Int8ProfileSummary(BaseModel):
    """The per-block int8 sensitivity in brief (``profile/int8_sensitivity.json`` holds it all)."""

    path: str
    blocks: int
    full_flips_pct: float
    seconds: float
    int8_target: str | None = Field(default=None, description="The CPU kind the int8 settings target.")


class PendingRound(BaseModel):
    """A round pruned and not yet evaluated: what ``prune_model`` hands ``evaluate_model``."""

    round: int
    plan: OptimizationPlan
    source: str
    planner_state: dict[str, Any] = Field(default_factory=dict)
    prune_report: dict[str, Any] = Field(default_factory=dict)
    artifact: str


class Review(BaseModel):
    """The last human decision on a plan."""

    stage: Literal["analysis", "round"]
    round: int
    action: Literal["approve", "edit", "reject"]


class RunSummary(BaseModel):
    """What a finished run returns besides its report's path: the report's four model entries."""

    baseline: ModelEntry | None = None
    pruned: ModelEntry | None = None
    quantized: ModelEntry | None = None
    quantized_original: ModelEntry | None = None


class CrossFitStudent(BaseModel):
    """One of a cross-fitted round's two students: distilled on one half of the evaluation images, judged on the
    other (``judged_on_half``), paired with the original there; or a round's only student, distilled on no
    evaluation image and judged on all of them (``judged_on_half`` None: the run's extra images trained it)."""

    artifact: str
    judged_on_half: int | None
    accuracy: float | None = None
    samples: int = 0
    paired: PairedAccuracy | None = None
    distilled: dict[str, Any] = Field(default_factory=dict, description="DistillReport: steps, images, seconds.")


class CrossFit(BaseModel):
    """How a round distilled after the search was judged: two students of ``source_round``'s model, each distilled
    on the calibration images plus one half of the evaluation images and judged on the other half; their answers
    together give the round's paired result on every evaluation image. The first student is the round's model,
    judged alone only on the half it did not see (``judged_on_half``): the deployment judges it there too. Where the
    run has extra images enough (``tools.stages.cross_fit.solo``), one student, distilled on the calibration and extra
    images only and judged on every evaluation image (``judged_on_half`` None), is the round's model."""

    source_round: int
    judged_on_half: int | None
    images_per_student: int
    students: list[CrossFitStudent]
    started_from_round: int | None = Field(
        default=None,
        description="The distilled round whose students these started from, each from the one of the same half, "
        "with the further blocks removed (a depth ladder's step); None: from source_round's model.",
    )


class RoundResult(BaseModel):
    """One evaluated pruning round: its plan, who wrote it, what pruning did, and its metrics."""

    round: int
    plan: OptimizationPlan
    source: str
    planner_state: dict[str, Any] = Field(default_factory=dict)
    prune_report: dict[str, Any] | None = None
    metrics: Metrics
    accuracy_drop_points: float | None = None
    within_budget: bool
    cross_fit: CrossFit | None = Field(
        default=None, description="A round distilled after the search from an over-budget one, and how it was judged."
    )


class PlanRecord(BaseModel):
    """The analysis plan as reported: the plan's fields plus who wrote it and the planner's state."""

    model_config = ConfigDict(extra="allow")

    source: str | None = None
    pruning_recommendations: list[PruningRecommendation] = Field(default_factory=list)
    quantization_recommendations: list[QuantizationRecommendation] = Field(default_factory=list)
    planner_state: dict[str, Any] | None = None


class NodeTime(BaseModel):
    """One run of a graph node: when it started (unix seconds), how long it took, and its seconds by kind of work
    (:data:`tools.clock.WORK_KINDS`; what no kind covers is the node's own)."""

    node: str
    started_at: float
    seconds: float
    work: dict[str, float] = Field(default_factory=dict)


class TimeRow(BaseModel):
    """A line of the report's time table: a node (every run of it together), or the time between them."""

    name: str
    runs: int = 1
    seconds: float
    work: dict[str, float] = Field(default_factory=dict)


class TimeSpent(BaseModel):
    """Where the run's time went: seconds by node and by kind of work; ``total_s`` is the run's wall clock less any
    pause (a wait for approval, a resume later) longer than ``tools.reporting.time_table.PAUSE_S``."""

    rows: list[TimeRow] = Field(default_factory=list)
    by_kind: dict[str, float] = Field(default_factory=dict)
    total_s: float = 0.0
    paused_s: float = 0.0


class RunReport(BaseModel):
    """``report.json``: everything a finished run measured, read by report.md/html, plots, CLI and bench."""

    model_config = ConfigDict(extra="allow")

    model: dict[str, Any]
    dataset: dict[str, Any]
    baseline: ModelEntry | None = None
    pruned: ModelEntry | None = None
    quantized: ModelEntry | None = None
    quantized_original: ModelEntry | None = None
    deployment: dict[str, Any] | None = Field(
        default=None, description="DeployChoice: each runtime and precision measured, the one deployed and why."
    )
    speedup: dict[str, Any] | None = Field(
        default=None, description="SpeedupFactors: the deployed model's speed-up as runtime x precision x pruning."
    )
    original_deployment: dict[str, Any] | None = Field(
        default=None, description="DeployChoice of the original, every int8 in full precision (before pruning)."
    )
    confirmation: dict[str, Any] | None = Field(
        default=None,
        description="Confirmation: the shipped build judged on the confirm part (the rule, the declared sequence, "
        "each look).",
    )
    accuracy_budget: AccuracyBudget | None = Field(
        default=None, description="How --max-accuracy-drop was split between pruning and int8."
    )
    rounds: list[RoundResult] = Field(default_factory=list)
    plan: PlanRecord = Field(default_factory=PlanRecord)
    profile: dict[str, Any] = Field(default_factory=dict)
    untrained: bool = False
    notes: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    time_spent: TimeSpent | None = Field(default=None, description="Seconds by node and by kind of work.")
