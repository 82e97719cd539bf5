"""The deployment's decision: one pure function of the measured candidates and the rules.

:func:`decide` applies the rules as an ordered list of named steps (:data:`STEPS`), each of which may change what is
chosen and says why; the choice records every step that did. It builds, evaluates and times nothing: where a step
compares candidates timed again alone (the runoff, an alternative's margin, the floor of the original's one-command
builds), it reads those timings from ``alone`` and, when they are not there yet, raises :class:`NeedTimes` naming the
artifacts to time together; the caller (``tools.stages.deployment.deploy``) times them and decides again. So the same
candidates, rules and timings always give the same choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, Field

from tools.deploy.choice import (
    ALTERNATIVE_MARGIN,
    TIE_MARGIN,
    DecisionStep,
    DeployCandidate,
    Ships,
    choose,
    eligible,
    never_slower,
    own_source,
    preferred,
    runoff,
    unconfirmed_alternative,
)
from tools.deploy.registry import FLOAT, runtime_and_precision

__all__ = ["STEPS", "Decision", "DecisionRules", "DecisionStep", "NeedTimes", "decide"]

#: Timings of artifacts timed together alone: the set of their paths -> path -> seconds.
AloneTimes = Mapping[frozenset[str], Mapping[str, float]]
TimeAlone = Callable[[dict[str, Path]], dict[str, float]]


class NeedTimes(Exception):
    """A step needs these artifacts (name -> path) timed together alone before it can decide."""

    def __init__(self, models: dict[str, Path]) -> None:
        super().__init__(", ".join(models))
        self.models = models


class DecisionRules(BaseModel):
    """What the decision needs besides the candidates: where the original is, the other models in order of
    preference, what ``--deploy`` asked for, and which model each source is."""

    original_dir: str
    original_latency_s: float | None = None
    alternatives: list[str] = Field(default_factory=list, description="Other sources, in order of preference.")
    forced: str | None = Field(default=None, description="``--deploy NAME``: the backend asked for.")
    allow_over_budget: bool = False
    original_builds: dict[str, str] = Field(
        default_factory=dict, description="The original's one-command builds made before: backend -> artifact."
    )
    ships: dict[str, Ships] = Field(
        default_factory=dict, description="The model each source is (key: the source; '' for the best model)."
    )


class Decision(BaseModel):
    """What ships (backend and source), why, a refusal of ``--deploy``, and the steps that led there."""

    chosen: str
    source: str | None = None
    why: str
    ships: Ships = "kept_round"
    refused: str | None = None
    steps: list[DecisionStep] = Field(default_factory=list)
    candidates: list[DeployCandidate] = Field(default_factory=list)


@dataclass
class _Pick:
    """What is chosen so far, with what the later steps need: the pool it was chosen from and the sources' order."""

    chosen: str
    why: str
    source: str | None = None
    pool: list[DeployCandidate] = field(default_factory=list)
    order: list[str | None] = field(default_factory=lambda: [None])
    runoff_winner: DeployCandidate | None = None
    refused: str | None = None


Step = Callable[[list[DeployCandidate], DecisionRules, _Pick, TimeAlone], _Pick | None]


def _fastest(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """The fastest candidate within the budget, beating the original FP32 model: among the best model's builds, and
    those of another source only when at least :data:`ALTERNATIVE_MARGIN` faster (:func:`eligible`)."""
    if not rules.alternatives or rules.forced:
        pool = [c for c in rows if c.source is None]
        chosen, why = choose(pool, rules.original_latency_s)
        return replace(pick, chosen=chosen, why=why, pool=pool)
    sources: list[str | None] = [None, *rules.alternatives]
    own = own_source(rows, sources)
    pool = eligible(rows, Path(rules.original_dir), own)
    chosen, why = choose(pool, rules.original_latency_s)
    return _Pick(chosen=chosen, why=why, pool=pool, order=[own, *(s for s in sources if s != own)])


def _alternative_confirmed(
    rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone
) -> _Pick | None:
    """A build of another model stays only when, timed again alone beside the best model's fastest, it is still
    :data:`ALTERNATIVE_MARGIN` faster; otherwise the best model's fastest deploys."""
    if not rules.alternatives or rules.forced:
        return None
    own = pick.order[0]
    doubt = unconfirmed_alternative(pick.pool, pick.chosen, time, own)
    if not doubt:
        return None
    pool = [c for c in rows if c.source == own]
    chosen, why = choose(pool, rules.original_latency_s)
    return replace(pick, chosen=chosen, why=f"{why}; {doubt}", pool=pool)


def _runoff(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """The candidates close to the chosen one are timed again alone; the fastest there deploys (:func:`runoff`)."""
    if rules.forced:
        return None
    chosen, why, winner = runoff(
        pick.pool, pick.chosen, pick.why, time, other_source_margin=ALTERNATIVE_MARGIN, preference=pick.order
    )
    return replace(pick, chosen=chosen, why=why, runoff_winner=winner) if winner is not None else None


def _forced(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """``--deploy NAME`` deploys that backend when it ran within the budget on the choose images (or over it with
    ``--allow-over-budget``), whatever its name, ``torch`` included; over the budget it is refused in one line."""
    if rules.forced is None:
        return None
    wanted = next(c for c in rows if c.backend == rules.forced and c.source is None)
    if wanted.ran and (wanted.within_budget or rules.allow_over_budget):
        over = "" if wanted.within_budget else ", over the accuracy budget (--allow-over-budget)"
        return replace(pick, chosen=wanted.backend, why=f"--deploy {wanted.backend} forces it{over} ({pick.why})")
    if wanted.ran:
        refused = (
            f"--deploy {wanted.backend} refused: over the {wanted.accuracy_drop_points or 0.0:.2f}-point drop it "
            "measured on the choose images the accuracy budget allows; the fastest build within the budget deploys "
            "instead (add --allow-over-budget to deploy it anyway)"
        )
        return replace(pick, why=f"{refused}; {pick.why}", refused=refused)
    reason = f"could not run: {wanted.error}" if wanted.error else f"was not built: {wanted.skipped}"
    return replace(pick, why=f"--deploy {wanted.backend} {reason}; {pick.why}")


def _source(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """Which model's build of the chosen backend deploys: the runoff's winner, else the preferred source's."""
    if pick.runoff_winner is not None and pick.runoff_winner.backend == pick.chosen:
        source = pick.runoff_winner.source
    else:
        usable = [c for c in pick.pool if c.backend == pick.chosen and c.ran and c.within_budget and c.latency_s]
        if not usable or rules.forced:
            return None
        times = {c.key: c.latency_s or 0.0 for c in usable}
        source = preferred(usable, times, pick.order, ALTERNATIVE_MARGIN).source
    return replace(pick, source=source) if source != pick.source else None


def _never_slower(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """Never slower than the original's fastest one-command build, timed alone against it (:func:`never_slower`)."""
    if rules.forced:
        return None
    rival, slower = never_slower(rows, pick.chosen, pick.source, Path(rules.original_dir), time)
    if rival is None:
        return None
    return replace(pick, chosen=rival.backend, source=rival.source, why=f"{slower}; {pick.why}")


def _within_budget(rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone) -> _Pick | None:
    """What ships is within the budget by construction: where no build is (or a forced one failed), the original as
    it is, whose answers are the original's (a row for it joins the candidates)."""
    shipped = next((c for c in rows if c.backend == pick.chosen and c.source == pick.source and c.ran), None)
    if shipped is not None and (shipped.within_budget or (rules.forced and rules.allow_over_budget)):
        return None
    original = rules.original_dir
    if not any(c.backend == FLOAT and c.source == original for c in rows):
        runtime, precision = runtime_and_precision(FLOAT)
        rows.append(
            DeployCandidate(
                backend=FLOAT,
                runtime=runtime,
                precision=precision,
                artifact=original,
                source=original,
                accuracy_drop_points=0.0,
                within_budget=True,
            )
        )
    why = f"no build within the accuracy budget: the original deploys as it is; {pick.why}"
    return replace(pick, chosen=FLOAT, source=original, why=why)


def _forced_against_the_original(
    rows: list[DeployCandidate], rules: DecisionRules, pick: _Pick, time: TimeAlone
) -> _Pick | None:
    """A forced build of the model, timed alone beside the original's one-command builds (those the int8 profile
    made): a note when one of them runs faster (it still deploys: it was asked for)."""
    row = next((c for c in rows if c.backend == pick.chosen and c.source == pick.source), None)
    if rules.forced is None or row is None or row.source is not None or row.artifact is None:
        return None
    builds = {b: Path(path) for b, path in rules.original_builds.items()}
    if not builds:
        return None
    times = time({"forced": Path(row.artifact), **builds})
    rival = min(builds, key=lambda b: times[b])
    if times["forced"] * (1.0 + TIE_MARGIN) <= times[rival]:
        return None
    note = (
        f"the forced build ({1e3 * times['forced']:.3f} ms) is not {100 * TIE_MARGIN:.0f} % faster than the "
        f"original's {rival} ({1e3 * times[rival]:.3f} ms), timed alone together"
    )
    return replace(pick, why=f"{pick.why}; {note}")


#: The rules, in the order they apply: each may change what is chosen, and says why.
STEPS: tuple[tuple[str, Step], ...] = (
    ("fastest within the budget", _fastest),
    ("another model's build confirmed alone", _alternative_confirmed),
    ("runoff of the close candidates, timed alone", _runoff),
    ("--deploy forces a backend", _forced),
    ("the source of the chosen build", _source),
    ("never slower than the original's one-command builds", _never_slower),
    ("within the budget by construction", _within_budget),
    ("a forced build against the original's", _forced_against_the_original),
)


def _lookup(alone: AloneTimes) -> TimeAlone:
    """``time_alone`` answered from timings made before; :class:`NeedTimes` for a set not timed yet."""

    def time(models: dict[str, Path]) -> dict[str, float]:
        key = frozenset(str(path) for path in models.values())
        if key not in alone:
            raise NeedTimes(models)
        return {name: alone[key][str(path)] for name, path in models.items()}

    return time


def decide(candidates: Sequence[DeployCandidate], rules: DecisionRules, alone: AloneTimes) -> Decision:
    """What ships among ``candidates`` (built, judged and timed), by :data:`STEPS` in order; ``alone``: the timings
    made alone so far (:class:`NeedTimes` when a step needs another)."""
    rows = [c.model_copy(deep=True) for c in candidates]
    pick = _Pick(chosen=FLOAT, why="")
    steps: list[DecisionStep] = []
    time = _lookup(alone)
    for name, step in STEPS:
        changed = step(rows, rules, pick, time)
        if changed is not None:
            pick = changed
            steps.append(DecisionStep(name=name, chosen=pick.chosen, source=pick.source, why=pick.why))
    ships = rules.ships.get(pick.source or "", "original" if pick.source == rules.original_dir else "kept_round")
    return Decision(
        chosen=pick.chosen,
        source=pick.source,
        why=pick.why,
        ships=ships,
        refused=pick.refused,
        steps=steps,
        candidates=rows,
    )
