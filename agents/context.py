"""Run settings: a kw-only dataclass whose fields have descriptions and environment fallbacks.

Settings are not graph state: they are passed as the run's ``context`` and written to
``<run_dir>/settings.json`` so that ``resume`` continues with exactly the same ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from tools.compression.recipes import PruningConfig, RecoveryConfig
    from tools.deploy.config import QuantizationConfig

Selection = Literal["accuracy", "smallest-within-budget"]
#: ``--objective``: what ranks rounds tied on accuracy (and what the planner aims at).
Objective = Literal["params", "latency"]
#: ``finetune_steps`` of automatic distillation (``--finetune-steps auto``).
AUTO_STEPS = -1
#: ``--distill-precision`` values: ``auto`` picks bf16 where the CPU computes it natively.
DISTILL_PRECISIONS = ("auto", "fp32", "bf16")


def parse_steps(raw: str) -> int:
    """``auto`` (:data:`AUTO_STEPS`) or a step count, as ``--finetune-steps`` and its variable take it."""
    return AUTO_STEPS if raw.strip().lower() == "auto" else int(raw)


@dataclass(frozen=True)
class Option:
    """How a setting reads on the command line (``graph.options`` builds every ``run`` flag from the settings): its
    flags (default ``--field-name``; a setting on by default is switched off by ``--no-field-name``), the value's
    name in the help, and where its choices come from (a function: the registries load on first use)."""

    flags: tuple[str, ...] = ()
    metavar: str | None = None
    choices: Callable[[], Sequence[str]] | None = None
    #: For a comma-separated list: where the names its items may take come from (the help lists them).
    items: Callable[[], Sequence[str]] | None = None


def _registry(module: str, name: str) -> Callable[[], list[str]]:
    """The names a registry (``module.name``: a mapping, a sequence, or a function returning one) offers, read when
    asked for."""

    def names() -> list[str]:
        import importlib

        found = getattr(importlib.import_module(module), name)
        return list(found() if callable(found) else found)

    return names


def _setting(
    description: str, name: str, default: Any, kind: Callable[[str], Any] = str, option: Option | None = None
) -> Any:
    """A field whose default comes from ``PROFILING_AGENT_<name>`` when set, else ``default``; ``description`` is
    its help everywhere (the command line's included), ``kind`` parses its text, ``option`` says how its flag reads
    where not as ``--field-name``."""
    env = f"PROFILING_AGENT_{name}"

    def factory() -> Any:
        raw = os.environ.get(env)
        if raw is None:
            return default
        if kind is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        return kind(raw)

    metadata = {"env": env, "description": description, "kind": kind, "default": default, "option": option or Option()}
    return field(default_factory=factory, metadata=metadata)


@dataclass(kw_only=True)
class Context:
    """Everything that configures a run. Each field falls back to ``PROFILING_AGENT_<NAME>``."""

    run_dir: str = _setting("Directory for checkpoints, artifacts and reports. Empty: runs/<thread id>.", "RUN_DIR", "")
    iterations: int = _setting("Iterative pruning rounds T after the first plan.", "ITERATIONS", 5, int)
    eval_samples: int = _setting(
        "Choose images: every comparison that decides (rounds, students, builds) is made on them (seeded, disjoint "
        "from the fit and confirm images). 0: automatic, from the model's MACs (1,000 to 5,000), at most what the "
        "other parts leave.",
        "EVAL_SAMPLES",
        0,
        int,
    )
    calibration_samples: int = _setting(
        "Calibration images (seeded, disjoint from evaluation) for importance, sensitivity and recovery.",
        "CALIBRATION_SAMPLES",
        256,
        int,
    )
    confirm_samples: int = _setting(
        "Confirm images: nothing chooses on them; the build that ships is judged on them once, and the budget holds "
        "on that figure. -1: automatic (a quarter of the rows calibration leaves, at most 2,000; none under 100); "
        "0: none (the shipped figure is then the one that chose it).",
        "CONFIRM_SAMPLES",
        -1,
        int,
        Option(flags=("--confirm-samples", "--holdout-samples")),
    )
    confidence: float | None = _setting(
        "With a value P (e.g. 0.95): the confirmed interval's one-sided bound at level P must hold the budget, "
        "counting every build the confirmation may look at; default: the confirmed point estimate holds it.",
        "CONFIDENCE",
        None,
        float,
        Option(metavar="P"),
    )
    batch_size: int = _setting("Images per batch of every evaluation (default 32).", "BATCH_SIZE", 32, int)
    seed: int = _setting("Seed for subsets, random importance and built-in weights.", "SEED", 0, int)
    threads: int = _setting("torch CPU threads; 0 keeps torch's default.", "THREADS", 0, int)
    device: str = _setting(
        "Where profiling, evaluation and distillation run: cpu (default), cuda, or auto (cuda where there is one).",
        "DEVICE",
        "cpu",
        option=Option(choices=lambda: ("cpu", "cuda", "auto")),
    )
    planner: str = _setting(
        "Planner that writes plans: rules (offline, deterministic; default) or llm (an OpenAI-compatible chat model).",
        "PLANNER",
        "rules",
        option=Option(choices=_registry("agents.planning.registry", "planner_names")),
    )
    llm_model: str = _setting("Chat model name for --planner llm (default gpt-4o-mini).", "LLM_MODEL", "")
    llm_base_url: str = _setting(
        "OpenAI-compatible endpoint for --planner llm, e.g. http://127.0.0.1:8000/v1 (vLLM, Ollama, llama.cpp, "
        "LiteLLM); empty: OpenAI.",
        "LLM_BASE_URL",
        "",
    )
    llm_timeout: float = _setting("Seconds before an LLM request is abandoned.", "LLM_TIMEOUT", 60.0, float)
    llm_max_attempts: int = _setting(
        "LLM attempts per plan (invalid plans go back with their errors) before the rules fallback.",
        "LLM_MAX_ATTEMPTS",
        3,
        int,
    )
    llm_context_tokens: int = _setting(
        "Tokens an LLM prompt is kept within (estimated at 3.5 characters a token; at least 2000); longer prompts "
        "show only the most important layer groups, sensitivity units and rounds. The default suits 8k-token models.",
        "LLM_CONTEXT_TOKENS",
        6000,
        int,
    )
    max_accuracy_drop: float = _setting(
        "Accuracy budget in points (default 1.0): the shipped build's drop on the confirm images is at most this, and "
        "a candidate losing more on the choose images is never selected.",
        "MAX_ACCURACY_DROP",
        1.0,
        float,
    )
    max_disagreement: float | None = _setting(
        "Agreement budget in percent: at most this share of the images may change their top-1 answer against the "
        "original (tested like the accuracy budget, drop + one standard error). It bounds the accuracy drop on any "
        "labels and needs none: the budget of an unlabelled dataset (a folder with the images directly in it; "
        "without it, --max-accuracy-drop's value); with labels, both budgets must hold. None: no agreement budget.",
        "MAX_DISAGREEMENT",
        None,
        float,
        Option(metavar="PCT"),
    )
    objective: Objective = _setting(  # noqa: RUF009
        "What ranks rounds tied on accuracy and what the planner's steps aim at: params (the paper's order: accuracy, "
        "then parameters, then latency) or latency (accuracy, then batch-1 latency in the runtime the original "
        "deploys to, measured; the planner aims at each unit's measured latency there).",
        "OBJECTIVE",
        "params",
        option=Option(choices=lambda: get_args(Objective)),
    )
    target_speedup: float = _setting(
        "With --objective latency: stop the search once a round within the budget runs this many times faster than "
        "the original's fastest build (0: off).",
        "TARGET_SPEEDUP",
        0.0,
        float,
        Option(metavar="X"),
    )
    allow_over_budget: bool = _setting(
        "With --deploy NAME: deploy that backend even where it is over the accuracy budget (the report says so).",
        "ALLOW_OVER_BUDGET",
        False,
        bool,
    )
    unit_kinds: str = _setting(
        "The unit kinds plans may use, comma-separated (tools.compression.units.UNIT_KINDS); empty: every one.",
        "UNIT_KINDS",
        "",
        option=Option(metavar="KINDS", items=_registry("tools.compression.units", "UNIT_KINDS")),
    )
    selection: Selection = _setting(  # noqa: RUF009
        "Which round within the budget is kept: accuracy (the most accurate, then the fewest parameters, then the "
        "fastest; default) or smallest-within-budget (the fewest parameters).",
        "SELECTION",
        "accuracy",
        option=Option(choices=lambda: get_args(Selection)),
    )
    importance: str = _setting(
        "Channel/head importance: act (activation-aware, default), taylor (needs labels), l1, l2 or random.",
        "IMPORTANCE",
        "act",
        option=Option(choices=_registry("tools.compression.importance", "IMPORTANCE")),
    )
    recovery: str = _setting(
        "Training-free recovery after every prune: reconstruct (least-squares refit of the next layer and BatchNorm "
        "statistics, judged on held-out images; default), bn (BatchNorm statistics only) or none.",
        "RECOVERY",
        "reconstruct",
        option=Option(choices=_registry("tools.compression.recovery", "RECOVERY_METHODS")),
    )
    sensitivity: bool = _setting(
        "Measure each prunable unit's sensitivity on the calibration images before planning (off: planning is "
        "blinder).",
        "SENSITIVITY",
        True,
        bool,
    )
    sensitivity_samples: int = _setting(
        "Calibration images the sensitivity profile probes with (0: automatic, about two minutes in all).",
        "SENSITIVITY_SAMPLES",
        0,
        int,
    )
    finetune_steps: int = _setting(
        "Knowledge-distillation steps after each prune and recovery (0: off; -1: automatic, as many as take about "
        "150 s a round at a measured training rate, 300 to 1,000; off for models whose 300 take over 600 s, or "
        "where fewer than 1,024 images are left for it).",
        "FINETUNE_STEPS",
        0,
        parse_steps,
    )
    finetune_samples: int = _setting(
        "Unlabelled images for distillation, the calibration images included (0: the calibration images only, or "
        "up to 4,096 with automatic steps).",
        "FINETUNE_SAMPLES",
        0,
        int,
    )
    extra_images: str = _setting(
        "A folder of unlabelled images (class folders, if any, ignored; e.g. your training images) that distillation "
        "trains on besides the calibration images: fit only, never choosing or confirming, and apart from the "
        "dataset's folder. At most 2 GiB of them once preprocessed (a seeded subset beyond). Empty: none.",
        "EXTRA_IMAGES",
        "",
        option=Option(metavar="DIR"),
    )
    distill_rescues: int = _setting(
        "Distillations after the search (each: two students, each distilled on one half of the evaluation images and "
        "judged on the other) of rounds over the accuracy budget, when --finetune-steps is 0 and distillation is "
        "affordable (automatic steps): the round nearest the budget among those smaller than the kept one first, "
        "then, while distillations are left, rounds the search plans on from them; -1: automatic, as many as take "
        "about 20 minutes at the measured training rate (on a CPU its CPU time, which other jobs do not lengthen), "
        "at most 5; 0: none.",
        "DISTILL_RESCUES",
        AUTO_STEPS,
        parse_steps,
    )
    distill_precision: str = _setting(
        "Precision of distillation's forward passes (weights and optimizer stay FP32): auto (bf16 on a GPU with "
        "bf16 tensor cores; on a CPU with AMX-BF16 or AVX512-BF16 whichever of bf16 and fp32 a few timed steps find "
        "faster for the model; else fp32), fp32 or bf16.",
        "DISTILL_PRECISION",
        "auto",
        option=Option(choices=lambda: DISTILL_PRECISIONS),
    )
    # Kernel-friendly sizes, measured (int8, batch 1, 1 thread, interleaved): cifar10-resnet-tiny with every
    # block's first conv pruned by 0.3 ran 1.16x the unpruned in ONNX Runtime static int8 at 24/48/88/176
    # channels, 1.09x at 22/45/90/179 (OpenVINO 1.06x vs 1.03x); cifar10-vit-tiny's heads of 24 narrowed to 16
    # ran 1.16x in QAttention, to 17 1.06x, to 20 1.04x (OpenVINO 1.07x at 16, 1.00x at 17 and 20).
    round_to: int = _setting(
        "Round kept channel counts to a multiple of this (0: off; 8 runs fastest in ONNX Runtime and OpenVINO).",
        "ROUND_TO",
        8,
        int,
    )
    head_round_to: int = _setting(
        "Round narrowed head widths to a multiple of this (0: off; 8 runs fastest in ONNX Runtime and OpenVINO).",
        "HEAD_ROUND_TO",
        8,
        int,
    )
    max_pruning_ratio: float = _setting(
        "Highest per-unit pruning ratio a plan may use, in (0, 1) (default 0.9).", "MAX_PRUNING_RATIO", 0.9, float
    )
    approve_plan: bool = _setting(
        "Pause after analysis for a human to approve, edit or reject the plan.", "APPROVE_PLAN", False, bool
    )
    approve_rounds: bool = _setting(
        "With --approve-plan: also pause before every iterative round.", "APPROVE_ROUNDS", False, bool
    )
    prune: bool = _setting("Prune (channels, heads, head widths, blocks).", "PRUNE", True, bool)
    iterate: bool = _setting("Run the iterative pruning rounds after the first plan.", "ITERATE", True, bool)
    quantize: bool = _setting(
        "Build and judge the deployment in every runtime and precision (int8 included).", "QUANTIZE", True, bool
    )
    quant_backend: str = _setting(
        "--deploy: auto (measure every runtime and precision, deploy the fastest within budget), torch (the float "
        "model), or one backend.",
        "QUANT_BACKEND",
        "auto",
        option=Option(
            flags=("--deploy", "--quant-backend"), choices=_registry("tools.deploy.registry", "DEPLOY_CHOICES")
        ),
    )
    int8_cpu: str = _setting(
        "The CPU kind int8 models are built for: auto (this machine's), vnni (full 8-bit weights), no-vnni (7-bit "
        "weights and NNCF's overflow fix: holds accuracy on every x86 CPU). tools.deploy.cpu.",
        "INT8_CPU",
        "auto",
        option=Option(choices=_registry("tools.deploy.cpu", "INT8_TARGETS")),
    )
    latency_repeats: int = _setting(
        "Repetitions of the final interleaved latency comparison (default 20).", "LATENCY_REPEATS", 20, int
    )
    progress: bool = _setting("Show progress bars.", "PROGRESS", True, bool)

    def __post_init__(self) -> None:
        errors = []
        if self.iterations < 0:
            errors.append("--iterations must be 0 or more")
        if self.eval_samples < 0:
            errors.append("--eval-samples must be 0 (automatic) or more")
        if self.batch_size < 1:
            errors.append("--batch-size must be at least 1")
        if self.calibration_samples < 0:
            errors.append("--calibration-samples must be 0 or more")
        if self.confirm_samples < -1:
            errors.append("--confirm-samples must be -1 (automatic), 0 (none) or more")
        if self.confidence is not None and not 0.5 <= self.confidence < 1:
            errors.append("--confidence must be at least 0.5 and below 1 (e.g. 0.95)")
        if self.sensitivity_samples < 0:
            errors.append("--sensitivity-samples must be 0 (automatic) or more")
        if self.finetune_steps < AUTO_STEPS:
            errors.append("--finetune-steps must be auto or 0 or more")
        if self.distill_precision not in DISTILL_PRECISIONS:
            errors.append(f"--distill-precision must be one of {', '.join(DISTILL_PRECISIONS)}")
        if self.finetune_samples < 0:
            errors.append("--finetune-samples must be 0 or more")
        if self.distill_rescues < AUTO_STEPS:
            errors.append("--distill-rescues must be auto or 0 or more")
        if not 0 <= self.max_accuracy_drop <= 100:
            errors.append("--max-accuracy-drop must be between 0 and 100 points")
        from tools.compression.units import UNIT_KINDS

        unknown = [k for k in self.pruning_config().kinds if k not in UNIT_KINDS]
        if unknown:
            errors.append(f"--unit-kinds: unknown {', '.join(unknown)}: choose among {', '.join(UNIT_KINDS)}")
        if self.objective not in get_args(Objective):
            errors.append(f"--objective must be one of {', '.join(get_args(Objective))}")
        if self.target_speedup < 0 or (self.target_speedup and self.objective != "latency"):
            errors.append("--target-speedup must be positive, and goes with --objective latency")
        if self.max_disagreement is not None and not 0 <= self.max_disagreement <= 100:
            errors.append("--max-disagreement must be between 0 and 100 percent")
        errors += self._recipe_errors()
        if self.planner not in ("rules", "llm"):
            errors.append("--planner must be rules or llm")
        if self.llm_max_attempts < 1:
            errors.append("--llm-max-attempts must be at least 1")
        if self.llm_context_tokens < 2000:
            errors.append("--llm-context-tokens must be at least 2000")
        if self.selection not in get_args(Selection):
            errors.append("--selection must be accuracy or smallest-within-budget")
        if errors:
            raise ValueError("; ".join(errors))

    def pruning_config(self) -> PruningConfig:
        """How this run applies pruning recommendations (importance, rounding, seed, max_ratio)."""
        from tools.compression.recipes import PruningConfig

        return PruningConfig(
            importance=self.importance,
            round_to=self.round_to,
            head_round_to=self.head_round_to,
            seed=self.seed,
            max_ratio=self.max_pruning_ratio,
            kinds=tuple(k.strip() for k in self.unit_kinds.split(",") if k.strip()),
        )

    def recovery_config(self) -> RecoveryConfig:
        """How this run repairs each pruned model without training (none, bn or reconstruct)."""
        from tools.compression.recipes import RecoveryConfig

        return RecoveryConfig(method=self.recovery)  # type: ignore[arg-type]

    def quantization_config(self) -> QuantizationConfig:
        """How this run quantizes (the backend and the CPU kind int8 is built for; per-layer dtypes are the plan's)."""
        from tools.deploy.config import QuantizationConfig

        return QuantizationConfig(backend=self.quant_backend, int8_cpu=self.int8_cpu)

    def _recipe_errors(self) -> list[str]:
        """Build both recipes; each field they refuse as its command-line option's message."""
        from pydantic import ValidationError

        from tools.compression.importance import IMPORTANCE
        from tools.deploy.cpu import INT8_TARGETS
        from tools.deploy.registry import DEPLOY_CHOICES

        messages = {
            "importance": f"--importance must be one of {', '.join(IMPORTANCE)}",
            "round_to": "--round-to must be 0 or more",
            "head_round_to": "--head-round-to must be 0 or more",
            "seed": "--seed must be an integer",
            "max_ratio": "--max-pruning-ratio must be in (0, 1)",
            "method": "--recovery must be one of none, bn, reconstruct",
            "backend": f"--deploy must be one of {', '.join(DEPLOY_CHOICES)}",
            "int8_cpu": f"--int8-cpu must be one of {', '.join(INT8_TARGETS)}",
        }
        errors: list[str] = []
        builds: tuple[Any, ...] = (self.pruning_config, self.recovery_config, self.quantization_config)
        for build in builds:
            try:
                build()
            except ValidationError as exc:
                errors += [messages.get(str(e["loc"][0]) if e["loc"] else "", e["msg"]) for e in exc.errors()]
        return errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Context:
        known = {f.name for f in fields(cls)}
        if "holdout_samples" in data and "confirm_samples" not in data:  # settings of a run made before the confirm
            data = {**data, "confirm_samples": data["holdout_samples"]}  # part: its holdout, or none, as it was
        return cls(**{k: v for k, v in data.items() if k in known})


def context_of(runtime: Any) -> Context:
    """The run's Context from a node's or router's runtime (a dict from the dev server is accepted too).

    Pure: it changes nothing (nodes that run torch code apply the thread count themselves).
    """
    raw = getattr(runtime, "context", None)
    if isinstance(raw, Context):
        return raw
    return Context.from_dict(raw) if isinstance(raw, dict) else Context()
