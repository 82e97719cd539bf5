"""Tiny models for tests, built from configs with seeded random weights (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from agents.planning.base import PlanningContext
    from agents.state import State
    from tools.deploy.choice import DeployCandidate
    from tools.schemas import RoundResult

DIGIT_LABELS = {
    i: n for i, n in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
}


def tiny_vit(num_labels: int = 10, *, hidden_size: int = 32, layers: int = 2) -> nn.Module:
    """A 16x16 ViT with 4 heads (of ``hidden_size / 4`` dimensions each)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=num_labels,
        id2label=DIGIT_LABELS,
        label2id={v: k for k, v in DIGIT_LABELS.items()},
    )
    return ViTForImageClassification(config).eval()


def tiny_resnet(num_labels: int = 10) -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        num_labels=num_labels,
        id2label=DIGIT_LABELS,
        label2id={v: k for k, v in DIGIT_LABELS.items()},
    )
    return ResNetForImageClassification(config).eval()


def save_tiny(model: nn.Module, out: Path, size: int) -> Path:
    """save_pretrained a tiny model with a matching image processor."""
    from transformers import ViTImageProcessor

    model.save_pretrained(out)
    ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        out
    )
    return out


def planning_context(model: nn.Module, size: int, max_accuracy_drop: float = 1.0) -> PlanningContext:
    """What a planner sees of a tiny real model: its profile and prunable layers, a 0.9 baseline."""
    from agents.planning.base import PlanningContext
    from tools.compression.pruning import prunable_layers
    from tools.profiling.profile import profile_model

    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    return PlanningContext(
        profile=profile_model(model, x, family="test", warmup=0, iters=1),
        prunable=prunable_layers(model, x).model_dump(),
        baseline_accuracy=0.9,
        max_accuracy_drop=max_accuracy_drop,
        max_ratio=0.6,
    )


def digits_vit_report(run_dir: Path, **settings: Any) -> dict[str, Any]:
    """A full run of the bundled digits ViT on the digits, unquantized, with a budget every round meets (50 points),
    and its report.json; ``settings`` add to (or replace) those of the run's Context."""
    import json

    from langgraph.checkpoint.memory import InMemorySaver

    from graph import Context, build_graph
    from tools.models.builtin import DEMO_MODELS

    if not (DEMO_MODELS["digits-vit"] / "model.safetensors").is_file():
        raise AssertionError("the demo model is missing: run scripts/train_demo_models.py")
    base: dict[str, Any] = {"max_accuracy_drop": 50.0, "latency_repeats": 2, "quantize": False, "progress": False}
    ctx = Context(run_dir=str(run_dir), **{**base, **settings})
    graph = build_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    graph.invoke({"model": "digits-vit", "dataset": "digits"}, config, context=ctx, durability="sync")
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    return report


# --- hand-built graph state ------------------------------------------------------------------------------

_METRICS = {"params": 0, "latency_s": 0.0, "memory_mb": 0.0}


def _filled(defaults: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if given is None else {**defaults, **given}


def round_result(values: dict[str, Any]) -> RoundResult:
    """A ``RoundResult`` from the fields a test cares about: the plan, source, metrics and verdict it leaves out
    take neutral values (empty plan, ``rules``, no parameters, over budget)."""
    from tools.schemas import RoundResult

    cross_fit = _filled(
        {"source_round": 0, "judged_on_half": 0, "images_per_student": 0, "students": []}, values.get("cross_fit")
    )
    return RoundResult.model_validate(
        {
            "plan": {},
            "source": "rules",
            "within_budget": False,
            **values,
            "metrics": _filled(_METRICS, values.get("metrics") or {}),
            "cross_fit": cross_fit,
        }
    )


def typed_state(values: Any) -> State:
    """The graph ``State`` a hand-built dict of the fields a test cares about stands for (a ``State`` as it is):
    rounds, baseline and profile summary completed with neutral values."""
    from agents.state import State

    if isinstance(values, State):
        return values
    data = dict(values)
    data.setdefault("model", "test-model")
    data["rounds"] = [round_result(r) if isinstance(r, dict) else r for r in data.get("rounds") or []]
    if isinstance(data.get("baseline"), dict):
        data["baseline"] = _filled(_METRICS, data["baseline"])
    if isinstance(data.get("profile_summary"), dict):
        data["profile_summary"] = _filled(
            {"total_params": 0, "total_macs": 0, "latency_s": 0.0}, data["profile_summary"]
        )
    if isinstance(data.get("review"), dict):
        data["review"] = _filled({"stage": "round", "round": 0}, data["review"])
    return State.model_validate(data)


def deploy_row(
    backend: str, ms: float, source: str | None = None, ok: bool = True, precision: str = "int8"
) -> DeployCandidate:
    """A measured deployment candidate: ``backend`` built from ``source`` (None: the kept model), ``ms`` at batch 1,
    within the budget (0.2 points down) or not (3 points)."""
    from tools.deploy.choice import DeployCandidate

    return DeployCandidate(
        backend=backend,
        runtime=backend.split("-")[0],
        precision=precision,
        artifact=f"{source or '/run/pruned'}/{backend}",
        source=source,
        within_budget=ok,
        latency_s=ms / 1e3,
        accuracy_drop_points=0.2 if ok else 3.0,
        memory_mb=1.0,
    )
