"""Run settings: a kw-only dataclass whose fields have descriptions and environment fallbacks.

Settings are not graph state: they are passed as the run's ``context`` and written to
``<run_dir>/settings.json`` so that ``resume`` continues with exactly the same ones.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Selection = Literal["accuracy", "smallest-within-budget"]


def _env(name: str, default: Any, kind: type = str) -> Any:
    def factory() -> Any:
        raw = os.environ.get(f"PROFILING_AGENT_{name}")
        if raw is None:
            return default
        if kind is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        return kind(raw)

    return field(default_factory=factory, metadata={"env": f"PROFILING_AGENT_{name}"})


def _described(description: str, spec: Any) -> Any:
    spec.metadata = {**spec.metadata, "description": description}
    return spec


@dataclass(kw_only=True)
class Context:
    """Everything that configures a run. Each field falls back to ``PROFILING_AGENT_<NAME>``."""

    run_dir: str = _described(
        "Directory for checkpoints, artifacts and reports. Empty: runs/<thread id>.", _env("RUN_DIR", "")
    )
    iterations: int = _described("Iterative pruning rounds T after the first plan.", _env("ITERATIONS", 5, int))
    eval_samples: int = _described("Evaluation samples (seeded random subset).", _env("EVAL_SAMPLES", 500, int))
    batch_size: int = _described("Evaluation batch size.", _env("BATCH_SIZE", 32, int))
    seed: int = _described("Seed for subsets, random importance and built-in weights.", _env("SEED", 0, int))
    threads: int = _described("torch CPU threads; 0 keeps torch's default.", _env("THREADS", 0, int))
    device: str = _described("cpu, cuda or auto.", _env("DEVICE", "cpu"))
    planner: str = _described("Planner that writes plans: rules (offline).", _env("PLANNER", "rules"))
    max_accuracy_drop: float = _described(
        "Accuracy budget in points: a candidate losing more is never selected.", _env("MAX_ACCURACY_DROP", 1.0, float)
    )
    selection: Selection = _described(
        "accuracy (accuracy, then params, then latency) or smallest-within-budget.",
        _env("SELECTION", "accuracy"),
    )
    importance: str = _described("Channel/head importance: l1, l2 or random.", _env("IMPORTANCE", "l1"))
    round_to: int = _described("Round kept channel counts to a multiple of this (0: off).", _env("ROUND_TO", 0, int))
    max_pruning_ratio: float = _described(
        "Highest per-layer pruning ratio a planner may use.", _env("MAX_PRUNING_RATIO", 0.6, float)
    )
    prune: bool = _described("Run structured/head pruning.", _env("PRUNE", True, bool))
    iterate: bool = _described("Run the iterative pruning rounds.", _env("ITERATE", True, bool))
    quantize: bool = _described("Run dynamic quantization.", _env("QUANTIZE", True, bool))
    quant_backend: str = _described("Quantization backend.", _env("QUANT_BACKEND", "torch-ao-dynamic"))
    latency_repeats: int = _described("Repetitions of the final interleaved latency comparison.",
                                      _env("LATENCY_REPEATS", 20, int))
    progress: bool = _described("Show progress bars.", _env("PROGRESS", True, bool))

    def __post_init__(self) -> None:
        errors = []
        if self.iterations < 0:
            errors.append("--iterations must be 0 or more")
        if self.eval_samples < 1:
            errors.append("--eval-samples must be at least 1")
        if self.batch_size < 1:
            errors.append("--batch-size must be at least 1")
        if not 0 <= self.max_accuracy_drop <= 100:
            errors.append("--max-accuracy-drop must be between 0 and 100 points")
        if not 0 < self.max_pruning_ratio < 1:
            errors.append("--max-pruning-ratio must be in (0, 1)")
        if self.selection not in ("accuracy", "smallest-within-budget"):
            errors.append("--selection must be accuracy or smallest-within-budget")
        if errors:
            raise ValueError("; ".join(errors))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Context:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def describe(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("description", "") for f in fields(cls)}
