"""The confirmation: the build that ships, judged once on images nothing chose on.

A run's data has three disjoint parts, each with one job (``tools.stages.run_data``): *fit* images calibrate, recover
and distil; *choose* images decide every comparison (rounds, students, builds); *confirm* images judge the one build
that ships, once. The figure a report gives for what ships is its drop on the confirm part, paired with the original's
answers on the same images, with a 95 % interval.

**What the budget means.** "Within 1 point" is what users, the paper, NNCF's ``max_drop`` and Neural Compressor's
accuracy criterion mean by it: the drop measured on validation images is at most the budget. By default the
confirmed point estimate holds it (:class:`ConfirmRule` with no ``confidence``). With ``confidence`` P the bound of
the confirmed interval at level P holds it instead: one-sided, ``drop + z se <= budget``, where ``z`` accounts for
every candidate the sequence may test (Bonferroni over the tested steps declared before the first look).

**The sequence.** Before the confirm part is read, :func:`confirm_sequence` declares the order the builds are looked
at in: the chosen build; the original's fastest build within the budget on the choose part (where it is another);
last, the original's fastest float build, whose answers are the original's (up to float rounding), so it ships
untested when everything before it failed. Each look is recorded, and a second look is reported as such.
"""

from __future__ import annotations

from pathlib import Path
from statistics import NormalDist

from pydantic import BaseModel, Field

from tools.deploy.base import PRECISION_FP32
from tools.deploy.choice import DeployCandidate, DeployChoice, Ships, is_original, label
from tools.deploy.registry import DEPLOYMENTS, FLOAT
from tools.schemas import PartAccuracy
from tools.stats import standard_error_points, within_budget

__all__ = [
    "ConfirmLook",
    "ConfirmRule",
    "ConfirmStep",
    "Confirmation",
    "confirm_sequence",
    "fallback_choice",
]


class ConfirmRule(BaseModel):
    """What the confirmed figure must satisfy: the budget, on the point estimate or at a confidence."""

    max_drop_points: float
    max_disagreement_pct: float | None = None
    confidence: float | None = Field(
        default=None, description="None: the point estimate holds the budget; P: the bound at level P does."
    )
    looks: int = Field(default=1, ge=1, description="Tested steps of the declared sequence (what z accounts for).")

    @property
    def z(self) -> float:
        """Standard errors added to the drop: 0 for the point estimate; at a confidence, the one-sided quantile
        split over the tested steps."""
        if self.confidence is None:
            return 0.0
        return NormalDist().inv_cdf(1.0 - (1.0 - self.confidence) / self.looks)

    def bound_points(self, result: PartAccuracy) -> float | None:
        """The drop the budget is held against: the point estimate plus ``z`` standard errors."""
        if result.paired is None:
            return result.accuracy_drop_points
        return -result.paired.delta_points + self.z * standard_error_points(result.paired)

    def passes(self, result: PartAccuracy) -> bool:
        return within_budget(
            result.accuracy_drop_points, self.max_drop_points, result.paired, self.max_disagreement_pct, z=self.z
        )

    def describe(self) -> str:
        """``the point estimate`` or ``the bound at 95 % (z 1.96 over 2 tested builds)``."""
        if self.confidence is None:
            return "the point estimate holds the budget"
        tried = f", split over {self.looks} tested builds" if self.looks > 1 else ""
        return f"the {100 * self.confidence:g} % bound holds the budget (drop + {self.z:.2f} standard errors{tried})"


class ConfirmStep(BaseModel):
    """One build of the declared sequence."""

    backend: str
    source: str | None = Field(default=None, description="``DeployCandidate.source``: None for the chosen model.")
    ships: Ships = "kept_round"
    name: str = Field(description="Its name in tables (``openvino-int8 (original)``).")
    tested: bool = Field(
        default=True, description="False for the last step, the original's float build: it ships as the original does."
    )


class ConfirmLook(BaseModel):
    """One look at the confirm part: the build, its figure there, and whether it held the budget."""

    step: ConfirmStep
    result: PartAccuracy | None = None
    bound_points: float | None = None
    passed: bool


class Confirmation(BaseModel):
    """The rule, the sequence declared before the first look, and each look."""

    rule: ConfirmRule
    sequence: list[ConfirmStep]
    looks: list[ConfirmLook] = Field(default_factory=list)
    rows: int = Field(default=0, description="Rows of the confirm part (0: none; the shipped figure is unconfirmed).")

    @property
    def shipped(self) -> ConfirmLook | None:
        """The look whose build ships: the last, once it passed or the sequence ended."""
        return self.looks[-1] if self.done else None

    @property
    def done(self) -> bool:
        return bool(self.looks) and (self.looks[-1].passed or len(self.looks) >= len(self.sequence))

    def next_step(self) -> ConfirmStep | None:
        """The step to look at next (None once done)."""
        return None if self.done else self.sequence[len(self.looks)]


def _step(c: DeployCandidate, ships: Ships, tested: bool = True) -> ConfirmStep:
    return ConfirmStep(backend=c.backend, source=c.source, ships=ships, name=label(c.model_dump()), tested=tested)


def _original_float(candidates: list[DeployCandidate], original_dir: Path) -> DeployCandidate:
    """The original's fastest float build that ran (PyTorch's own model when none did)."""
    floats = [
        c
        for c in candidates
        if is_original(c, original_dir) and c.ran and c.precision == PRECISION_FP32 and c.latency_s is not None
    ]
    if floats:
        return min(floats, key=lambda c: c.latency_s or 0.0)
    described = DEPLOYMENTS[FLOAT]
    return DeployCandidate(
        backend=FLOAT,
        runtime=described.runtime,
        precision=described.precision,
        artifact=str(original_dir),
        source=str(original_dir),
    )


def confirm_sequence(choice: DeployChoice, original_dir: Path) -> tuple[list[ConfirmStep], DeployCandidate]:
    """The order the confirmation looks at builds in, declared from the choose part before the confirm part is read
    (see the module doc), and the original's float build (the last step: a row the choice may lack)."""
    chosen = next(
        (c for c in choice.candidates if c.backend == choice.chosen and c.source == choice.source),
        None,
    )
    if chosen is not None and is_original(chosen, original_dir) and chosen.precision == PRECISION_FP32:
        return [_step(chosen, choice.ships, tested=False)], chosen  # the original's answers: nothing to fall back to
    last = _original_float(choice.candidates, original_dir)
    steps = [
        _step(chosen, choice.ships)
        if chosen is not None
        else ConfirmStep(backend=choice.chosen, source=choice.source, ships=choice.ships, name=choice.chosen)
    ]
    within = [
        c
        for c in choice.candidates
        if is_original(c, original_dir)
        and c.ran
        and c.within_budget
        and c.latency_s is not None
        and c.precision != PRECISION_FP32
    ]
    fastest = min(within, key=lambda c: c.latency_s or 0.0, default=None)
    if fastest is not None and not any(s.backend == fastest.backend and s.source == fastest.source for s in steps):
        steps.append(_step(fastest, "original"))
    if not any(s.backend == last.backend and s.source == last.source for s in steps):
        steps.append(_step(last, "original", tested=False))
    return steps, last


def fallback_choice(choice: DeployChoice, step: ConfirmStep, row: DeployCandidate | None, why: str) -> DeployChoice:
    """``choice`` with ``step``'s build chosen instead (``row``: the candidate to add where the choice lacks it)."""
    candidates = list(choice.candidates)
    if row is not None and not any(c.backend == row.backend and c.source == row.source for c in candidates):
        candidates.append(row)
    return choice.model_copy(
        update={
            "chosen": step.backend,
            "source": step.source,
            "ships": step.ships,
            "why": f"{why}; chosen on the choose part: {choice.why}",
            "candidates": candidates,
        }
    )
