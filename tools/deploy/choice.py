"""The measured deployment choice: every runtime and precision the machine has, evaluated and timed side by side.

Each candidate is one backend of :data:`tools.deploy.registry.BACKENDS` applied to the best pruned model
(plus ``torch``: the float model as it is). All candidates are evaluated on the
evaluation images (paired with the original) and timed at batch 1 interleaved in one process, with the
original FP32 PyTorch model in the same comparison. :func:`choose` keeps the fastest candidate within the
accuracy budget, and never one that is not faster than the original FP32 model: then the float model is
deployed, and the reason says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.deploy.cpu import Int8Settings
from tools.deploy.registry import AUTO, BACKENDS, FLOAT, ONE_COMMAND_BUILDS, available
from tools.schemas import PairedAccuracy

__all__ = [
    "ALTERNATIVE_MARGIN",
    "RUNOFF_MARGIN",
    "TIE_MARGIN",
    "DecisionStep",
    "DeployCandidate",
    "DeployChoice",
    "Ships",
    "available_backends",
    "can_outrun_the_original",
    "candidate_backends",
    "choose",
    "dominates",
    "eligible",
    "faster_over_budget",
    "has_pruned_within",
    "is_mixed",
    "is_original",
    "is_usable",
    "luck_removed",
    "never_slower",
    "outrun_by",
    "own_source",
    "preferred",
    "runoff",
    "slower_than_the_original",
]

#: Candidates (the fastest of each backend and source) within this share of the fastest within budget are timed again
#: alone before one deploys (:func:`runoff`): the table times 30-40 models interleaved, and what runs between two calls
#: ranks runtimes differently from a model served alone. With one call each (cold caches; the table is timed in blocks
#: since, ``tools.evaluation.cost.SERVING_BLOCK``): ``cifar10-swin-tiny``'s distilled round ran ONNX Runtime dynamic
#: int8 at 1.72 ms and OpenVINO FP32 at 1.95 among 38 models, 1.44 and 1.18 alone; CIFAR ResNet-20's pruned round on an
#: AMD EPYC with AVX512-VNNI (no AMX) OpenVINO int8 at 0.42 ms and ONNX Runtime static int8 at 0.32, 0.19 and 0.23
#: alone, which a margin of 25 % left out.
RUNOFF_MARGIN = 0.5

#: Rows of one source timed within this share of each other are a tie, which the smaller artifact wins: timing alone
#: ranks them by noise (a trained 224-px EfficientNet-B0: OpenVINO int8 and bf16 4.85 and 4.88 ms in one run, 4.26 and
#: 4.24 in the next; the int8 model is 5.3 MB, the bf16 one 13.3 MB).
TIE_MARGIN = 0.03
#: Rows of a tie whose artifacts differ in size by less than this share are as small as each other: the more accurate
#: on the choose images wins, then the faster. CIFAR ResNet-20's original in OpenVINO int8 with and without NNCF's fast
#: bias correction (0.43 MB each; 81.48 % and 80.94 %) went by 0.36 against 0.37 ms alone to one run, and the other
#: way to the next, with the same rounds.
SIZE_TIE = 0.01

#: A candidate built from another source than the best model (a round with more headroom, the unpruned original)
#: is deployed only when it is at least this much faster than the best model's fastest within budget.
ALTERNATIVE_MARGIN = 0.05


class DeployCandidate(BaseModel):
    """One runtime and precision of the model to deploy, as measured."""

    backend: str
    runtime: str
    precision: str
    artifact: str | None = None
    accuracy: float | None = None
    paired: PairedAccuracy | None = None
    accuracy_drop_points: float | None = None
    within_budget: bool = False
    latency_s: float | None = Field(default=None, description="Batch 1, interleaved with every candidate.")
    alone_latency_s: float | None = Field(
        default=None,
        description="Batch 1, timed again alone with its closest rivals before one deploys (:func:`runoff`); None "
        "when it was not among them.",
    )
    throughput_ips: float | None = Field(default=None, description="Images per second at the evaluation batch.")
    memory_mb: float | None = None
    error: str | None = Field(default=None, description="Why this candidate could not be built or run.")
    skipped: str | None = Field(default=None, description="Why it was not built (a mixed candidate not needed).")
    float_layers: dict[str, str] = Field(
        default_factory=dict, description="Layers an int8 candidate kept in float (mixed precision): layer -> why."
    )
    source: str | None = Field(
        default=None, description="The model it was built from when not the best one (a round with more headroom)."
    )
    answers_of: str | None = Field(
        default=None,
        description="A float runtime whose logits matched the PyTorch model's on the first evaluation images takes "
        "that model's answers on the others: how closely it matched (None: evaluated on every image).",
    )
    half_luck_points: float | None = Field(
        default=None,
        description="Built from a distilled round's student, judged on half the evaluation images: how far the "
        "student's float model is above its round's cross-fitted estimate there (points), taken off for the budget "
        "test (:func:`luck_removed`).",
    )
    predictions: str | None = Field(
        default=None, description="Its per-image predictions on the images it was judged on (the budget test's)."
    )
    cross_fitted: PairedAccuracy | None = Field(
        default=None,
        description="Built from one of a distilled round's two students: its answers and those of the same build of "
        "the other student, each on the half of the evaluation images its student was not distilled on, paired with "
        "the original's on every image. The budget test judges both builds by it, as the search judged the round "
        "(:func:`tools.stages.judging.judge_together`; no half's luck taken off: both halves are in it).",
    )
    budget_z: float | None = Field(
        default=None,
        description="Standard errors its drop had to stay under the budget by on the choose images (one: "
        "tools.stats.CHOOSE_Z).",
    )

    @property
    def ran(self) -> bool:
        """Whether it was built and evaluated (not failed, not skipped)."""
        return self.error is None and self.skipped is None

    @property
    def key(self) -> str:
        """Unique in a choice: the backend, and where it was built from when that is not the best model."""
        return label(self.model_dump())


#: The models a deployment may ship, besides the kept round (``DeployChoice.ships``).
Ships = Literal["kept_round", "second_student", "headroom_round", "original"]


class DecisionStep(BaseModel):
    """One rule of the deployment's decision (``tools.deploy.decide.STEPS``) that changed what is chosen, and why."""

    name: str
    chosen: str
    source: str | None = None
    why: str


class DeployChoice(BaseModel):
    """The candidates and the one deployed, with why."""

    chosen: str
    why: str
    source: str | None = Field(
        default=None, description="The model the chosen candidate was built from, when not the best one."
    )
    original_latency_s: float | None = Field(default=None, description="The original FP32 PyTorch model, batch 1.")
    calibration: str = Field(default="", description="What the static int8 candidates were calibrated on.")
    int8: Int8Settings | None = Field(
        default=None, description="The CPU kind int8 was built for, its settings, and the CPU it was validated on."
    )
    accuracy_control: str | None = Field(
        default=None, description="What the mixed-precision candidates were judged on (images, budget)."
    )
    tries: int = Field(default=0, description="Candidates built and evaluated: what the budget test counted.")
    refused: str | None = Field(
        default=None, description="A backend --deploy asked for that was over the budget, and what deployed instead."
    )
    budget_z: float | None = Field(
        default=None,
        description="Standard errors the shipped candidate's drop had to stay under the budget by on the choose "
        "images.",
    )
    ships: Ships = Field(
        default="kept_round",
        description="Which model the chosen build is of: the kept round, its second student, the round with more "
        "headroom, or the unpruned original; the graph branches on it.",
    )
    steps: list[DecisionStep] = Field(
        default_factory=list, description="The rules that changed what is chosen, in the order they applied."
    )
    candidates: list[DeployCandidate] = Field(default_factory=list)


def available_backends(registered: list[str], importable: Callable[[str], bool]) -> list[str]:
    """Candidate backends in :data:`~tools.deploy.registry.BACKENDS` order: ``torch`` first, then every registered
    one that imports."""
    names = [FLOAT] + [n for n in BACKENDS if n in registered and importable(n)]
    return names + [n for n in registered if n not in names and importable(n)]


def candidate_backends(choice: str) -> list[str]:
    """The backends ``--deploy choice`` measures: all available for ``auto``, else ``torch`` and that one."""
    if choice != AUTO:
        full = BACKENDS[choice].mixed_of if choice in BACKENDS else None
        return [FLOAT] if choice == FLOAT else [FLOAT, *([full] if full else []), choice]
    return available_backends(list(BACKENDS), available)


def is_mixed(backend: str) -> bool:
    """Whether ``backend`` is a mixed-precision (accuracy-controlled) one."""
    return backend in BACKENDS and BACKENDS[backend].mixed_of is not None


def luck_removed(paired: PairedAccuracy | None, luck_points: float) -> PairedAccuracy | None:
    """``paired`` with ``luck_points`` taken off its change and interval, for the budget test (unchanged at 0).

    A distilled round's student is judged alone on the half of the evaluation images it was not distilled on. Where
    its float model did better there than the round's cross-fitted estimate on every image, each build of it shares
    that luck on the same images: CIFAR ResNet-44's first student was +0.67 points on its half against +0.30 for the
    round, its OpenVINO int8 −0.34 there (within a 1-point budget with one standard error) and −1.28 on 5,000 images
    no run saw. Only luck is taken off, never added: the test can only get stricter."""
    if paired is None or luck_points <= 0:
        return paired
    keys = ("delta_points", "ci95_low_points", "ci95_high_points")
    return paired.model_copy(update={k: round(getattr(paired, k) - luck_points, 4) for k in keys})


def choose(candidates: list[DeployCandidate], original_latency_s: float | None) -> tuple[str, str]:
    """(backend to deploy, why): the fastest candidate within budget, if it beats the original FP32 model."""
    usable = [c for c in candidates if c.ran and c.within_budget and c.latency_s is not None]
    if not usable:
        return FLOAT, "no runtime candidate ran within the accuracy budget: the float model is deployed"
    best = min(usable, key=lambda c: (c.latency_s, c.backend != FLOAT))
    reference = original_latency_s
    if best.backend != FLOAT and reference is not None and best.latency_s is not None and best.latency_s >= reference:
        return FLOAT, (
            f"the fastest candidate within budget ({best.key}, {1e3 * best.latency_s:.2f} ms) is not faster "
            f"than the original FP32 model ({1e3 * reference:.2f} ms): the float model is deployed"
        )
    parts = [f"{best.key} ({best.runtime}, {best.precision}) is the fastest within the accuracy budget"]
    if best.latency_s is not None:
        parts.append(f"{1e3 * best.latency_s:.2f} ms at batch 1")
        if reference:
            parts.append(f"{reference / best.latency_s:.2f}x the original FP32 model")
    others = sorted(
        (c for c in usable if c.key != best.key and c.latency_s is not None),
        key=lambda c: c.latency_s or 0.0,
    )
    if others and best.latency_s:
        runner = others[0]
        parts.append(f"next: {runner.key} at {1e3 * (runner.latency_s or 0.0):.2f} ms")
    rejected = [c.key for c in candidates if c.ran and not c.within_budget]
    if rejected:
        parts.append("over the accuracy budget: " + ", ".join(rejected))
    failed = [c.key for c in candidates if c.error is not None]
    if failed:
        parts.append("could not run: " + ", ".join(failed))
    return best.backend, "; ".join(parts)


def preferred(
    rows: Sequence[DeployCandidate], times: Mapping[str, float], preference: Sequence[str | None], margin: float
) -> DeployCandidate:
    """The row to deploy among ``rows`` timed together (``times`` by key). Sources count in the order of
    ``preference`` (the best model's first, then the alternatives in order; any other after them): a source's fastest
    row wins only when at least ``margin`` faster than every earlier source's. A distilled round's second student
    comes before a round with more headroom: Swin-tiny as timm builds it deployed round 0 (20 % fewer parameters)
    over the kept round's second student (48 %), both 0.37 ms, while its first student's ONNX Runtime dynamic int8
    (0.51 ms) stood as the best model's. Within the winning source, rows timed within :data:`TIE_MARGIN` of its
    fastest are a tie, which the one of least memory wins, and of those as small, the most accurate."""

    def rank(c: DeployCandidate) -> int:
        return preference.index(c.source) if c.source in preference else len(preference)

    fastest: dict[str | None, DeployCandidate] = {}
    for c in sorted(rows, key=lambda c: times[c.key]):
        fastest.setdefault(c.source, c)
    order = sorted(fastest.values(), key=lambda c: (rank(c), times[c.key]))
    winner, floor = order[0], times[order[0].key]
    for c in order[1:]:
        if times[c.key] <= (1.0 - margin) * floor:
            winner = c
        floor = min(floor, times[c.key])
    return _smallest_of_tie(winner, [c for c in rows if c.source == winner.source], times)


def _tie_won(winner: DeployCandidate, quicker: Sequence[DeployCandidate]) -> str:
    """Why ``winner`` deploys over the ``quicker`` rows it tied with (:func:`_smallest_of_tie`)."""
    if all((c.memory_mb or 0.0) > (1.0 + SIZE_TIE) * (winner.memory_mb or 0.0) for c in quicker):
        shown = ", ".join(f"{c.memory_mb or 0:.2f}" for c in quicker)
        return f"smaller: {winner.memory_mb or 0:.2f} MB against {shown}"
    shown = ", ".join(f"{100 * (c.accuracy or 0):.2f} %" for c in quicker)
    return f"as small, more accurate on the choose images: {100 * (winner.accuracy or 0):.2f} % against {shown}"


def _smallest_of_tie(
    fastest: DeployCandidate, rows: Sequence[DeployCandidate], times: Mapping[str, float]
) -> DeployCandidate:
    """Among ``rows`` (one source's) timed within :data:`TIE_MARGIN` of ``fastest``, the one of least memory; among
    those within :data:`SIZE_TIE` of it, the most accurate on the choose images, then the fastest."""
    tied = [c for c in rows if times[c.key] <= (1.0 + TIE_MARGIN) * times[fastest.key]]

    def memory(c: DeployCandidate) -> float:
        return c.memory_mb if c.memory_mb is not None else float("inf")

    least = min(memory(c) for c in tied)
    small = [c for c in tied if memory(c) <= (1.0 + SIZE_TIE) * least]
    return max(small, key=lambda c: (c.accuracy if c.accuracy is not None else -1.0, -times[c.key]))


def unconfirmed_alternative(
    pool: list[DeployCandidate],
    chosen: str,
    time_alone: Callable[[dict[str, Path]], dict[str, float]],
    own: str | None = None,
) -> str | None:
    """When the candidate deployed for ``chosen`` comes from another model than the best one (``own``), time it again
    with the best model's fastest within budget, the two alone (``time_alone``: artifact by name -> seconds,
    interleaved): why it does not stay (no longer :data:`ALTERNATIVE_MARGIN` faster), or None when it does (or when it
    is the best model's own)."""
    ready = [c for c in pool if is_usable(c) and c.artifact is not None]
    winners = [c for c in ready if c.backend == chosen]
    mains = [c for c in ready if c.source == own and c.backend != FLOAT]
    if not winners or not mains:
        return None
    winner = min(winners, key=lambda c: c.latency_s or 0.0)
    main = min(mains, key=lambda c: c.latency_s or 0.0)
    if winner.source == own:
        return None
    times = time_alone({"alternative": Path(str(winner.artifact)), "best": Path(str(main.artifact))})
    if times["alternative"] <= (1.0 - ALTERNATIVE_MARGIN) * times["best"]:
        return None
    return (
        f"{winner.key} timed {1e3 * times['alternative']:.2f} ms against {main.key}'s {1e3 * times['best']:.2f} ms "
        f"when the two were timed again alone: not {100 * ALTERNATIVE_MARGIN:.0f} % faster, so the best model deploys"
    )


def runoff(
    pool: list[DeployCandidate],
    chosen: str,
    why: str,
    time_alone: Callable[[dict[str, Path]], dict[str, float]],
    *,
    other_source_margin: float = 0.0,
    preference: Sequence[str | None] = (None,),
) -> tuple[str, str, DeployCandidate | None]:
    """The backend to deploy, why, and the row that won, after the candidates within :data:`RUNOFF_MARGIN` of
    ``chosen`` (the fastest row of each runtime backend and source, within budget) are timed again alone
    (``time_alone``: artifact by name -> seconds, interleaved, recorded as their ``alone_latency_s``): the fastest
    there deploys, as :func:`preferred` ranks the sources (``preference``, ``other_source_margin``). ``chosen`` and
    ``why`` unchanged, and no row, when it has no close rival (or is the float model)."""
    usable = sorted(
        (c for c in pool if c.ran and c.within_budget and c.latency_s and c.artifact and c.backend != FLOAT),
        key=lambda c: c.latency_s or 0.0,
    )
    fastest: dict[tuple[str, str | None], DeployCandidate] = {}
    for c in usable:
        fastest.setdefault((c.backend, c.source), c)
    lead = next((c for c in usable if c.backend == chosen), None)
    if lead is None:
        return chosen, why, None
    close = [c for c in fastest.values() if (c.latency_s or 0.0) <= (1.0 + RUNOFF_MARGIN) * (lead.latency_s or 0.0)]
    if len(close) < 2:
        return chosen, why, None
    times = time_alone({c.key: Path(str(c.artifact)) for c in close})
    for c in close:  # the rows keep what the runoff measured (``split_budget`` compares rivals by it)
        c.alone_latency_s = times[c.key]
    winner = preferred(close, times, preference, other_source_margin)
    shown = ", ".join(f"{c.key} {1e3 * times[c.key]:.2f} ms" for c in sorted(close, key=lambda c: times[c.key]))
    runoff_text = f"the {len(close)} within {100 * RUNOFF_MARGIN:.0f} % of the fastest, timed again alone: {shown}"
    quicker = [c for c in close if c.source == winner.source and times[c.key] < times[winner.key]]
    if winner.key == lead.key and not quicker:
        return winner.backend, f"{why}; {runoff_text}", winner
    within = f"within {100 * TIE_MARGIN:.0f} % of {', '.join(c.key for c in quicker)}"
    tie = f" ({within}, and {_tie_won(winner, quicker)})" if quicker else ""
    # the decision first: the runoff overrules the interleaved table, which the rest of the text describes
    decision = f"{winner.key} deploys{tie}, decided when {runoff_text}"
    return winner.backend, f"{decision}; in the interleaved table, {why}", winner


def as_rows(choice: DeployChoice) -> list[dict[str, Any]]:
    """The runtime table as plain rows (for reports)."""
    return [c.model_dump() | {"chosen": is_chosen(c.model_dump(), choice.model_dump())} for c in choice.candidates]


def is_chosen(candidate: dict[str, Any], choice: dict[str, Any]) -> bool:
    """Whether ``candidate`` (a row of ``choice["candidates"]``) is the deployed one."""
    return bool(candidate["backend"] == choice["chosen"] and candidate.get("source") == choice.get("source"))


def label(candidate: dict[str, Any]) -> str:
    """A candidate's name in tables: its backend, and what it was built from when not the best model (a round's
    directory, ``round-02``; ``original``)."""
    source = candidate.get("source")
    if not source:
        return str(candidate["backend"])
    path = Path(source)
    return f"{candidate['backend']} ({path.parent.name if path.name == 'model' else path.name})"


def is_original(candidate: DeployCandidate, original_dir: Path | None) -> bool:
    source = candidate.source
    return original_dir is not None and source is not None and Path(source).resolve() == Path(original_dir).resolve()


def is_usable(c: DeployCandidate) -> bool:
    return c.ran and c.within_budget and c.latency_s is not None


def has_pruned_within(candidates: list[DeployCandidate], original_dir: Path | None) -> bool:
    """Whether a candidate not built from the unpruned original (``original_dir``) ran within the budget."""
    return any(is_usable(c) and not is_original(c, original_dir) for c in candidates)


def own_source(candidates: list[DeployCandidate], preference: Sequence[str | None]) -> str | None:
    """The source counted as the best model's: the first of ``preference`` (None, the best model, then the
    alternatives in order) with a runtime candidate within budget. A distilled round's second student comes before
    a round with more headroom that runs 1 % faster (Swin-tiny: 48 % fewer parameters against 20 %)."""
    return next(
        (s for s in preference if any(c.source == s and is_usable(c) and c.backend != FLOAT for c in candidates)),
        None,
    )


def eligible(
    candidates: list[DeployCandidate], original_dir: Path | None = None, own: str | None = None
) -> list[DeployCandidate]:
    """The candidates the choice is made among: every one of the best model (``own``: :func:`own_source`), and
    those of another source only when at least :data:`ALTERNATIVE_MARGIN` faster than the best model's fastest
    within budget (or when it has none).
    The unpruned original's (``original_dir``'s) only when no pruned model has a candidate within budget, or when it
    is also no larger than the best model's fastest (:func:`dominates`): otherwise it gives back parameters pruning
    removed, which a faster runtime does not pay for in a compression tool (CIFAR ResNet-32 on an AMX CPU: the
    original in bf16 0.45 ms, the pruned rounds' 0.56 ms; their OpenVINO int8 0.60 ms, the original's 0.61 ms); the
    run's note on a pruned model that runs slower names the original's artifact."""

    main = [c for c in candidates if c.source == own and is_usable(c) and c.backend != FLOAT]
    lead = min(main, key=lambda c: c.latency_s or 0.0, default=None)
    fastest = (lead.latency_s or 0.0) if lead else float("inf")
    pruned_within = has_pruned_within(candidates, original_dir)
    return [
        c
        for c in candidates
        if c.source == own
        or not is_usable(c)
        or (
            (not (pruned_within and is_original(c, original_dir)) or dominates(c, lead))
            and (c.latency_s or 0.0) <= (1.0 - ALTERNATIVE_MARGIN) * fastest
        )
    ]


def dominates(candidate: DeployCandidate, lead: DeployCandidate | None) -> bool:
    """Whether ``candidate`` (the unpruned original's, within budget) is no larger in memory than ``lead``, the
    best model's fastest within budget: then, faster too, it is the better deployment on every count the budget
    leaves open, and pruning gave nothing to keep. CIFAR ResNet-20 on an AMD EPYC with AVX512-VNNI: the pruned
    round (3.4 % fewer parameters) needed a convolution kept in float in OpenVINO, 0.52 MB and 0.20 ms; the
    original's full OpenVINO int8, within the same budget, 0.43 MB and 0.18 ms."""
    if lead is None or candidate.memory_mb is None or lead.memory_mb is None:
        return False
    return candidate.memory_mb <= lead.memory_mb


def can_outrun_the_original(macs: int | None, original_macs: int | None, *, sheds_layers: bool = False) -> bool:
    """Whether a pruned model doing ``macs`` a batch-1 image can run :data:`TIE_MARGIN` faster than the original,
    which its deployment must to ship (:func:`never_slower`): not when it saves less than that share of the original's
    MACs, since at batch 1 latency falls by less than MACs do where every layer stays (each layer's fixed cost stays:
    halving a stage's inner width bought CIFAR ResNets and 224-px mobile CNNs 0.99-1.03x,
    ``benchmarks/channel_blocks.py``). True when either count is unknown, or the model ``sheds_layers`` (a block
    removed takes its layers' fixed cost with it: latency may fall by more than MACs)."""
    if not macs or not original_macs or sheds_layers:
        return True
    return macs <= (1.0 - TIE_MARGIN) * original_macs


def never_slower(
    candidates: list[DeployCandidate],
    chosen: str,
    source: str | None,
    original_dir: Path,
    time_alone: Callable[[dict[str, Path]], dict[str, float]],
) -> tuple[DeployCandidate | None, str]:
    """The original's fastest one-command build within budget (:data:`ONE_COMMAND_BUILDS`) and why it deploys, when
    the chosen row is not faster than it timed once more, the two alone, interleaved; ``(None, "")`` when it is
    faster, is the original's own, or no build of the original ran within budget. What a user gets from a runtime
    in one command is the floor: a run never ships something slower, and a tie (the chosen row less than
    :data:`TIE_MARGIN` faster, within the noise of a batch-1 timing) goes to the original."""
    row = next((c for c in candidates if c.backend == chosen and c.source == source and c.ran), None)
    if row is None or is_original(row, original_dir):
        return None, ""
    slower = outrun_by(row, candidates, original_dir, time_alone)
    if slower is None:
        return None, ""
    rival, why = slower
    return rival, f"{why}: the original in {rival.backend} deploys"


def outrun_by(
    row: DeployCandidate,
    candidates: Sequence[DeployCandidate],
    original_dir: Path,
    time_alone: Callable[[dict[str, Path]], dict[str, float]],
) -> tuple[DeployCandidate, str] | None:
    """The original's fastest one-command build within budget among ``candidates`` and a line saying so, when
    ``row`` (a build of another model) is not :data:`TIE_MARGIN` faster than it, the two timed alone, interleaved;
    None when it is, or there is nothing to time."""
    originals = [
        c for c in candidates if is_original(c, original_dir) and is_usable(c) and c.backend in ONE_COMMAND_BUILDS
    ]
    if row.artifact is None or not originals:
        return None
    rival = min(originals, key=lambda c: c.latency_s or 0.0)
    if rival.artifact is None:
        return None
    times = time_alone({"deployed": Path(str(row.artifact)), "original": Path(str(rival.artifact))})
    if times["deployed"] * (1.0 + TIE_MARGIN) <= times["original"]:
        return None
    return rival, (
        f"{row.key} ({1e3 * times['deployed']:.3f} ms) is not {100 * TIE_MARGIN:.0f} % faster than the original's "
        f"{rival.key} ({1e3 * times['original']:.3f} ms) timed alone together (a tie within timing noise goes to "
        "the original)"
    )


def slower_than_the_original(
    rows: Sequence[DeployCandidate],
    originals: Sequence[DeployCandidate],
    original_dir: Path,
    time_alone: Callable[[dict[str, Path]], dict[str, float]],
) -> dict[str, str]:
    """Backend -> why, for each of ``rows`` (full-int8 builds of another model over the budget) that is not
    :data:`TIE_MARGIN` faster than the original's fastest one-command build within budget, timed alone beside it
    (:func:`outrun_by`): keeping layers of it in float only slows it, so no mixed precision of it can ship.
    EfficientNet-Lite2's kept round (2.2 % fewer parameters) in OpenVINO int8: 6.96 ms beside the original's 6.67
    in the deployment's table; its two mixed builds cost 58 s of a 15-minute run and could not ship."""
    found = {r.backend: outrun_by(r, originals, original_dir, time_alone) for r in rows}
    return {backend: slower[1] for backend, slower in found.items() if slower is not None}


def faster_over_budget(candidates: list[DeployCandidate], chosen: str) -> list[str]:
    """Backends that ran faster than the chosen candidate (all, when none is within budget) but were over the
    accuracy budget."""
    usable = [c.latency_s for c in candidates if c.backend == chosen and c.within_budget and c.latency_s]
    limit = min(usable, default=None)
    return [
        c.backend
        for c in candidates
        if c.ran and not c.within_budget and c.latency_s and (limit is None or c.latency_s < limit)
    ]
