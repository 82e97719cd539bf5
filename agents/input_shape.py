"""Input shape resolver: (channels, height, width) from the flags, the processor, the config and the
model's layers (first convolution, position embeddings, first Linear) and the dataset's images, each
candidate proven by a dry forward pass (:mod:`tools.models.input_shape`); the shape records where each
number came from, and the report shows it.

With ``--planner llm`` the LLM is asked first, from the model's architectural metadata; its answer is
used only if a dry forward pass proves it, otherwise the resolved shape is, and the report says which
one was used and why.
"""

from __future__ import annotations

from langgraph.runtime import Runtime

from agents.common import paths, settings
from agents.context import Context
from agents.state import State
from tools.models.input_shape import ImageHints, image_hints
from tools.schemas import InputShape
from tools.stages import ops
from tools.store.run_paths import RunPaths

#: Images of the evaluation part looked at for their mode and size.
HINT_IMAGES = 64


def _ask_llm(run: RunPaths, ctx: Context) -> tuple[InputShape | None, str]:
    """The LLM's shape if it is plausible and runs the model, else None and why not."""
    from agents.planning.llm_planner import JsonlExchangeLog, resolve_input_shape_with_llm, shape_metadata
    from agents.planning.llm_settings import llm_settings
    from tools.artifacts.io import load_original
    from tools.llm.client import make_chat_model

    llm = llm_settings(ctx)
    loaded = load_original(run.original)
    shape, exchange = resolve_input_shape_with_llm(
        make_chat_model(llm),
        shape_metadata(loaded.model, loaded.processor),
        exchange_log=JsonlExchangeLog(run.root / "llm" / "exchanges.jsonl"),
    )
    if shape is None:
        return None, "; ".join(exchange.errors) or "no usable answer"
    shape = shape.model_copy(update={"channels_source": None, "size_source": None})  # "llm", not its words
    problem = ops.shape_problem(run.original, shape, device=ctx.device)
    if problem is not None:
        return None, f"the LLM's shape {shape.as_tuple()} failed the dry forward pass: {problem}"
    return shape, ""


def _dataset_hints(state: State, ctx: Context) -> ImageHints | None:
    """Mode and size of the evaluation images (loaded once per process; the evaluation reuses them)."""
    if not state.dataset:
        return None
    from agents.evaluation import eval_spec

    images = list(eval_spec(state, ctx).part("evaluation").images[:HINT_IMAGES])
    return image_hints(images)


def _mode_note(shape: InputShape, hints: ImageHints | None) -> list[str]:
    if hints is None or hints.channels is None or hints.channels == shape.channels:
        return []
    kind, mode = ("greyscale", "RGB") if hints.channels == 1 else ("colour", "greyscale")
    return [
        f"input shape: the dataset's images are {kind} but the model takes {shape.channels} channel"
        f"{'s' if shape.channels != 1 else ''} ({shape.channels_source or shape.source}): they are converted to {mode}"
    ]


def resolve_input_shape(state: State, runtime: Runtime[Context]) -> dict[str, object]:
    ctx = settings(runtime)
    run = paths(state)
    notes: list[str] = []
    if ctx.planner == "llm":
        shape, why = _ask_llm(run, ctx)
        if shape is not None:
            return {"input_shape": shape}
        notes.append(f"input shape: the LLM answer was not used ({why}); using the resolved shape")
    hints = _dataset_hints(state, ctx)
    shape = ops.resolve_input_shape(run.original, device=ctx.device, hints=hints)
    return {"input_shape": shape, "notes": notes + _mode_note(shape, hints)}
