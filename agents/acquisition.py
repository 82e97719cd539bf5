"""Acquisition agent: load the model from its source and save it as the run's original artifact.

With a dataset, it also decodes the parts of the data the run uses (images that cannot be read are left out and
named in a note; too many stop the run) and matches the dataset's classes to the model's.
"""

from __future__ import annotations

from pathlib import Path

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from agents.common import resolve_run_dir, settings
from agents.context import Context
from agents.evaluation import eval_spec
from agents.state import State
from tools.evaluation.labels import LabelMatch
from tools.stages import ops
from tools.stages.run_data import preprocessing_note
from tools.store.run_paths import RunPaths


def acquire_model(state: State, runtime: Runtime[Context], config: RunnableConfig) -> dict[str, object]:
    ctx = settings(runtime)
    run_dir = resolve_run_dir(ctx, config)
    info = ops.acquire(state.model, RunPaths(run_dir).original, device=ctx.device, factory_options=state.model_options)
    if not info.untrained and not state.dataset:
        raise ValueError(
            f"a dataset is needed to measure the accuracy of {info.spec!r}: pass --dataset "
            "(only the untrained built-ins may omit it)"
        )
    notes = []
    label_match: LabelMatch | None = None
    spec = eval_spec(state, ctx)
    if spec.dataset is not None:  # fail fast on data that cannot be read
        unreadable = ops.check_data(spec).note()
        ops.check_extra_images(spec)
        notes += [unreadable] if unreadable else []
    described = preprocessing_note(Path(info.artifact))
    notes += [described] if described else []
    if spec.dataset is not None and not info.untrained:  # fail fast on a dataset that cannot be evaluated
        label_match = LabelMatch.model_validate(
            ops.match_dataset_labels(
                Path(info.artifact),
                spec.dataset,
                spec.split,
                spec.samples,
                spec.seed,
                spec.sizes(),
                spec.spare_to_evaluation,
            )
        )
        notes += label_match.notes()
        if label_match.unlabelled and ctx.max_disagreement is None:
            notes.append(
                f"{spec.dataset} has no class sub-folders, so no labels: the run's budget is the share of answers "
                "changed against the original, --max-disagreement, here --max-accuracy-drop's "
                f"{ctx.max_accuracy_drop:g}"
            )
        if label_match.unmatched:
            notes.append(
                "dataset classes that match no model label (their samples are left out): "
                + ", ".join(label_match.unmatched)
            )
    if info.untrained:
        notes.append(
            f"{info.spec} is UNTRAINED (random weights from its published configuration): accuracy is "
            "reported as null; use it for profiling, latency and memory studies only."
        )
    return {"run_dir": str(run_dir), "model_info": info, "label_match": label_match, "notes": notes}
