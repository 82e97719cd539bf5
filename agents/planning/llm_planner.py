"""The LLM planner of the paper: an LLM reads the profile and writes the plan; in the iterative loop it
reads the earlier plans and their results and writes the next one.

Flow of :meth:`LLMPlanner.analyze` / :meth:`LLMPlanner.next_plan`: build the prompt
(:mod:`agents.planning.prompts`) → :func:`tools.llm.structured.invoke_structured` with the plan's field-name
normaliser (:mod:`agents.planning.normalize`) → :func:`agents.planning.validation.validate_plan` → if the
answer does not parse or the plan is invalid, send the reasons back as a follow-up message and ask again,
up to ``max_attempts`` → otherwise, or at once when the endpoint fails (HTTP error, timeout, connection),
use the fallback planner (the rules planner). It never raises for what the model or the server does;
every request is recorded as an :class:`~tools.llm.structured.LLMExchange`.

``PlanResult.source`` is ``llm`` (valid at the first attempt), ``llm-repaired`` (valid after follow-ups)
or ``rules-fallback``. ``planner_state`` records the attempts and the rejected plans with their reasons;
after a fallback it also holds the fallback's own state, and its ``level`` at the top level, so that the
rules planner's level search goes on in later rounds.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agents.planning.base import Planner, PlanningContext, PlanResult
from agents.planning.llm_settings import settings_from_options
from agents.planning.normalize import normalize_payload
from agents.planning.prompts import (
    analysis_messages,
    input_shape_messages,
    iteration_messages,
    next_round,
    retry_message,
)
from agents.planning.rules import SEARCH_KEYS, RulesPlanner
from agents.planning.validation import validate_plan
from tools.llm.client import LLMSettings, make_chat_model
from tools.llm.structured import LLMExchange, ResponseFormatMode, invoke_structured
from tools.schemas import InputShape, OptimizationPlan

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

logger = logging.getLogger(__name__)

__all__ = [
    "ExchangeSink",
    "JsonlExchangeLog",
    "LLMPlanner",
    "Purpose",
    "llm_planner_for_run",
    "resolve_input_shape_with_llm",
    "shape_metadata",
]

ExchangeSink = Callable[[LLMExchange], None] | list[LLMExchange]
#: What an exchange of this package is for (its ``purpose`` label).
Purpose = Literal["input_shape", "analysis", "iteration"]

#: Plausible input shapes (an answer outside is rejected).
MAX_CHANNELS = 16
MIN_SIDE, MAX_SIDE = 4, 8192
_RAW_KEPT = 600  # characters of an unparsable answer kept in planner_state


class JsonlExchangeLog:
    """Appends every exchange as one JSON line to ``path`` (e.g. ``RUN/llm/exchanges.jsonl``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, exchange: LLMExchange) -> None:
        line = json.dumps(exchange.model_dump(mode="json"), ensure_ascii=False)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def read(self) -> list[LLMExchange]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [LLMExchange.model_validate_json(line) for line in lines if line.strip()]


def _emit(sink: ExchangeSink | None, exchange: LLMExchange) -> None:
    if sink is None:
        return
    try:
        if isinstance(sink, list):
            sink.append(exchange)
        else:
            sink(exchange)
    except Exception:  # a full disk must not cost the plan
        logger.warning("could not record an LLM exchange", exc_info=True)


def _add_usage(total: Counter[str], exchange: LLMExchange) -> None:
    for key, value in exchange.token_usage.items():
        total[key] += value


class LLMPlanner:
    """Planner protocol on a chat model, with validation, follow-ups and a rules fallback."""

    name = "llm"

    def __init__(
        self,
        settings: LLMSettings | None = None,
        *,
        chat: BaseChatModel | None = None,
        max_attempts: int = 3,
        fallback: Planner | None = None,
        exchange_log: ExchangeSink | None = None,
        response_format: ResponseFormatMode = "auto",
        model_layer_names: list[str] | None = None,
    ) -> None:
        """``settings`` (default: :meth:`LLMSettings.from_env` at first use) or a ready ``chat`` model.

        ``exchange_log``: a list, or a callable such as :class:`JsonlExchangeLog`, receiving every exchange.
        ``model_layer_names``: module names for the quantization-regex check (default: the profile's).
        """
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.settings = settings
        self._chat = chat
        self.max_attempts = max_attempts
        self.fallback: Planner = fallback if fallback is not None else RulesPlanner()
        self.exchange_log = exchange_log
        self.response_format: ResponseFormatMode = response_format
        self.model_layer_names = model_layer_names

    @property
    def chat(self) -> BaseChatModel:
        """The chat model, created at first use (raises ``LLMConfigError`` when nothing is configured)."""
        if self._chat is None:
            settings = self.settings if self.settings is not None else LLMSettings.from_env()
            self.settings = settings
            self._chat = make_chat_model(settings)
        return self._chat

    # --- Planner protocol -----------------------------------------------------------------------

    def analyze(self, ctx: PlanningContext) -> PlanResult:
        return self._plan(ctx, "analysis")

    def next_plan(self, ctx: PlanningContext) -> PlanResult:
        return self._plan(ctx, "iteration")

    # --- internals --------------------------------------------------------------------------------

    def _carry_quantization(self, plan: OptimizationPlan, ctx: PlanningContext) -> OptimizationPlan:
        """The loop only prunes: keep the latest quantization recommendations when the answer has none."""
        if plan.quantization_recommendations:
            return plan
        for record in sorted(ctx.history, key=lambda r: r.round, reverse=True):
            if record.plan.quantization_recommendations:
                return plan.model_copy(
                    update={"quantization_recommendations": record.plan.quantization_recommendations}
                )
        default = self.fallback.analyze(ctx).plan.quantization_recommendations
        return plan.model_copy(update={"quantization_recommendations": default})

    def _fallback(self, ctx: PlanningContext, purpose: Purpose) -> PlanResult:
        if purpose == "iteration":
            # the rules search reads its own levels; LLM rounds have none
            own = [r for r in ctx.history if any(k in r.planner_state for k in SEARCH_KEYS)]
            if own:
                return self.fallback.next_plan(replace(ctx, history=own))
        return self.fallback.analyze(ctx)

    def _plan(self, ctx: PlanningContext, purpose: Purpose) -> PlanResult:
        chat = self.chat  # configuration errors are the caller's to report
        iteration = purpose == "iteration"
        round_no = next_round(ctx) if iteration else None
        messages = iteration_messages(ctx) if iteration else analysis_messages(ctx)
        rejected: list[dict[str, Any]] = []
        usage: Counter[str] = Counter()
        attempts = 0
        reason = ""
        model = ""
        try:
            for attempt in range(1, self.max_attempts + 1):
                attempts = attempt
                plan, exchange = invoke_structured(
                    chat,
                    messages,
                    OptimizationPlan,
                    purpose=purpose,
                    normalize=normalize_payload,
                    attempt=attempt,
                    round=round_no,
                    response_format=self.response_format,
                )
                model = exchange.model
                if self.response_format == "auto" and any("refused response_format" in n for n in exchange.notes):
                    self.response_format = "none"  # do not ask again for what this server refuses
                if plan is not None:
                    if iteration:
                        plan = self._carry_quantization(plan, ctx)
                        exchange.parsed = plan.model_dump(mode="json")
                    errors = validate_plan(plan, ctx, self.model_layer_names, require_pruning=True)
                    if errors:
                        exchange.reject(errors)
                _emit(self.exchange_log, exchange)
                _add_usage(usage, exchange)
                if plan is not None and exchange.ok:
                    source = "llm" if attempt == 1 else "llm-repaired"
                    logger.info("LLM %s plan accepted at attempt %d (%s)", purpose, attempt, source)
                    state = self._state(model, attempts, rejected, usage, exchange)
                    return PlanResult(plan=plan, source=source, planner_state=state)
                entry: dict[str, Any] = {
                    "attempt": attempt,
                    "failure": exchange.failure,
                    "reasons": list(exchange.errors),
                    "plan": exchange.parsed,
                }
                if exchange.parsed is None and exchange.raw_response:
                    entry["raw"] = exchange.raw_response[:_RAW_KEPT]
                rejected.append(entry)
                logger.warning(
                    "LLM %s attempt %d/%d rejected (%s): %s",
                    purpose,
                    attempt,
                    self.max_attempts,
                    exchange.failure,
                    "; ".join(exchange.errors[:3]),
                )
                if exchange.transport_failed:
                    detail = exchange.errors[-1] if exchange.errors else ""
                    reason = f"the LLM endpoint failed ({exchange.failure}): {detail}"
                    break
                messages = [
                    *messages,
                    {"role": "assistant", "content": exchange.raw_response or "(empty answer)"},
                    {"role": "user", "content": retry_message(exchange.errors)},
                ]
            else:
                reason = f"no valid plan after {self.max_attempts} attempts"
        except Exception as exc:  # a bug here must not cost the run: the rules planner still plans
            logger.exception("LLM planner failed")
            reason = f"LLM planner error: {type(exc).__name__}: {exc}"
        return self._fallback_result(ctx, purpose, model, attempts, rejected, usage, reason)

    def _state(
        self,
        model: str,
        attempts: int,
        rejected: list[dict[str, Any]],
        usage: Counter[str],
        exchange: LLMExchange | None,
    ) -> dict[str, Any]:
        state: dict[str, Any] = {
            "planner": self.name,
            "model": model,
            "attempts": attempts,
            "rejected": rejected,
            "token_usage": dict(usage),
        }
        if exchange is not None:
            state["response_format"] = exchange.response_format
            if exchange.notes:
                state["notes"] = list(exchange.notes)
        return state

    def _fallback_result(
        self,
        ctx: PlanningContext,
        purpose: Purpose,
        model: str,
        attempts: int,
        rejected: list[dict[str, Any]],
        usage: Counter[str],
        reason: str,
    ) -> PlanResult:
        result = self._fallback(ctx, purpose)
        logger.warning("LLM %s: %s; using the %s planner's plan", purpose, reason, result.source)
        state = self._state(model, attempts, rejected, usage, None)
        state.update(
            {
                "fallback_reason": reason,
                "fallback_planner": result.source,
                "fallback_state": dict(result.planner_state),
            }
        )
        for key in SEARCH_KEYS:
            if key in result.planner_state:
                state[key] = result.planner_state[key]
        return PlanResult(plan=result.plan, source="rules-fallback", planner_state=state)


def llm_planner_for_run(
    run_dir: Path | str,
    *,
    model: str | None = None,
    base_url: str | None = None,
    timeout_s: float | None = None,
    max_attempts: int = 3,
) -> LLMPlanner:
    """The LLM planner of one run: settings from the environment (non-None arguments win), every exchange
    appended to ``RUN/llm/exchanges.jsonl``. Raises ``LLMConfigError`` when nothing is configured."""
    settings = settings_from_options(model, base_url, timeout_s)
    log = JsonlExchangeLog(Path(run_dir) / "llm" / "exchanges.jsonl")
    return LLMPlanner(settings, max_attempts=max_attempts, exchange_log=log)


# --------------------------------------------------------------------------------------------------
# Input shape
# --------------------------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def shape_metadata(model: Any, processor: Any = None) -> dict[str, Any]:
    """Architectural metadata for :func:`resolve_input_shape_with_llm`: model class, config, processor."""
    data: dict[str, Any] = {"model_class": type(model).__name__}
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        data["config"] = _json_safe(config.to_dict())
    if processor is not None:
        data["processor"] = _json_safe(processor.to_dict() if hasattr(processor, "to_dict") else vars(processor))
    return data


def _shape_problems(shape: InputShape) -> list[str]:
    problems = []
    if shape.channels > MAX_CHANNELS:
        problems.append(f"channels {shape.channels} is implausible for an image (at most {MAX_CHANNELS})")
    for side, value in (("height", shape.height), ("width", shape.width)):
        if not MIN_SIDE <= value <= MAX_SIDE:
            problems.append(f"{side} {value} is outside [{MIN_SIDE}, {MAX_SIDE}]")
    return problems


def resolve_input_shape_with_llm(
    chat: BaseChatModel,
    metadata: dict[str, Any],
    *,
    exchange_log: ExchangeSink | None = None,
) -> tuple[InputShape | None, LLMExchange]:
    """Ask the LLM for (channels, height, width) from ``metadata`` (see :func:`shape_metadata`).

    Returns ``(InputShape(source="llm"), exchange)``, or ``(None, exchange)`` when the answer is missing,
    unparsable or implausible. The caller must still prove the shape with a dry forward pass.
    """
    shape, exchange = invoke_structured(
        chat, input_shape_messages(metadata), InputShape, purpose="input_shape", normalize=normalize_payload
    )
    if shape is not None:
        shape = shape.model_copy(update={"source": "llm"})
        problems = _shape_problems(shape)
        if problems:
            exchange.reject(problems)
            shape = None
        else:
            exchange.parsed = shape.model_dump(mode="json")
    _emit(exchange_log, exchange)
    return shape, exchange
