"""The LLM planner of the paper: an LLM reads the profile and writes the plan; in the iterative loop it
reads the earlier plans and their results and writes the next one.

Flow of :meth:`LLMPlanner.analyze` / :meth:`LLMPlanner.next_plan`: build the prompt
(:mod:`agents.planning.prompts`) → :func:`tools.llm.structured.invoke_structured` with the plan's field-name
normaliser (:mod:`agents.planning.normalize`) → :func:`agents.planning.validation.validate_plan` → if the
answer does not parse or the plan is invalid, send the reasons back as a follow-up message and ask again,
up to ``max_attempts`` → otherwise, or at once when the endpoint fails (HTTP error, timeout, connection),
use the fallback planner (the rules planner). It never raises for what the model or the server does;
every request is recorded as an :class:`~tools.llm.structured.LLMExchange`.

Real servers differ (:mod:`tools.llm.response_format`): the response format each endpoint accepts is
learned from its refusals and remembered in ``RUN/llm/response_format.json`` for the rest of the run and
its resumes. Prompts are kept within ``context_tokens`` (``--llm-context-tokens``, estimated from
characters): when the full prompt is longer, the profile, the sensitivity table and the history are cut
to their most important entries (:mod:`agents.planning.prompt_budget`) and the exchange says what was cut.

``PlanResult.source`` is ``llm`` (valid at the first attempt), ``llm-repaired`` (valid after follow-ups)
or ``rules-fallback``. ``planner_state`` records the attempts and the rejected plans with their reasons;
after a fallback it also holds the fallback's own state, and its ``level`` at the top level, so that the
rules planner's level search goes on in later rounds. ``planner_state["report_notes"]`` holds what the
run's report should say (a shortened prompt, a learned response format); the same text every time, so
that the nodes can add each note once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from agents.planning.base import Planner, PlanningContext, PlanResult
from agents.planning.llm_settings import settings_from_options
from agents.planning.normalize import normalize_payload
from agents.planning.prompt_budget import LEVELS, PromptDetail, cuts
from agents.planning.prompts import (
    SHAPE_LEVELS,
    analysis_messages,
    input_shape_messages,
    iteration_messages,
    next_round,
    retry_message,
)
from agents.planning.rules import SEARCH_KEYS, RulesPlanner
from agents.planning.validation import validate_plan
from tools.llm.budget import (
    CHARS_PER_TOKEN,
    DEFAULT_CONTEXT_TOKENS,
    MIN_CONTEXT_TOKENS,
    FittedMessages,
    estimate_prompt_tokens,
    fit_messages,
)
from tools.llm.client import LLMSettings, make_chat_model, shorten
from tools.llm.response_format import FORMAT_MEMORY_FILE, ResponseFormatMemory
from tools.llm.structured import Failure, LLMExchange, ResponseFormatMode, endpoint_of, invoke_structured
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
_ECHO_CHARS = 3000  # characters of a rejected answer sent back in a follow-up (at most 1/8 of the budget)
_ECHO_ERRORS = 8  # rejection reasons sent back in a follow-up
_ECHO_ERROR_CHARS = 300  # characters of each
PromptBuilder = Callable[[PromptDetail], list[dict[str, str]]]


class RejectedAttempt(TypedDict):
    """One rejected LLM answer in ``planner_state["rejected"]``: why, and what it said."""

    attempt: int
    failure: Failure | None
    reasons: list[str]
    plan: dict[str, Any] | None
    """The answer's JSON object after normalisation; None when it could not be parsed."""
    raw: NotRequired[str]
    """The start of an answer that could not be parsed (``_RAW_KEPT`` characters)."""


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

    def format_memory(self) -> ResponseFormatMemory:
        """The response formats learned for this log's run, kept next to it (``response_format.json``)."""
        return ResponseFormatMemory(self.path.with_name(FORMAT_MEMORY_FILE))


def _memory_for(sink: ExchangeSink | None) -> ResponseFormatMemory:
    """A run's memory when ``sink`` is its log, else one for this process."""
    return sink.format_memory() if isinstance(sink, JsonlExchangeLog) else ResponseFormatMemory()


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
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        format_memory: ResponseFormatMemory | None = None,
    ) -> None:
        """``settings`` (default: :meth:`LLMSettings.from_env` at first use) or a ready ``chat`` model.

        ``exchange_log``: a list, or a callable such as :class:`JsonlExchangeLog`, receiving every exchange.
        ``model_layer_names``: module names for the quantization-regex check (default: the profile's).
        ``context_tokens``: the estimated size a prompt is kept within (follow-ups included).
        ``format_memory``: where learned response formats are kept (default: next to a
        :class:`JsonlExchangeLog`, else in memory).
        """
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if context_tokens < MIN_CONTEXT_TOKENS:
            raise ValueError(f"--llm-context-tokens must be at least {MIN_CONTEXT_TOKENS} (got {context_tokens})")
        self.settings = settings
        self._chat = chat
        self.max_attempts = max_attempts
        self.fallback: Planner = fallback if fallback is not None else RulesPlanner()
        self.exchange_log = exchange_log
        self.response_format: ResponseFormatMode = response_format
        self.model_layer_names = model_layer_names
        self.context_tokens = context_tokens
        self._echo_chars = min(_ECHO_CHARS, int(context_tokens * CHARS_PER_TOKEN / 8))
        self.format_memory = format_memory if format_memory is not None else _memory_for(exchange_log)

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

    def _fit(self, build: PromptBuilder, followups: list[dict[str, str]]) -> tuple[FittedMessages[PromptDetail], int]:
        """The prompt at the most detail that fits with the follow-ups, and how many follow-ups are kept (the
        oldest rejected answers are dropped, down to the last one, when even the shortest prompt is too long)."""
        kept = len(followups)
        while True:
            reserved = estimate_prompt_tokens(followups[len(followups) - kept :]) if kept else 0
            fitted = fit_messages(LEVELS, build, self.context_tokens, reserved)
            if not fitted.over_budget or kept <= 2:
                return fitted, kept
            kept -= 2

    def _prompt_notes(self, fitted: FittedMessages[PromptDetail], ctx: PlanningContext) -> tuple[str | None, str]:
        """(the exchange's note, the report's note) when the prompt was shortened or is still too long."""
        if not fitted.shortened and not fitted.over_budget:
            return None, ""
        budget = f"--llm-context-tokens {self.context_tokens:,}"
        note = f"prompt shortened to fit {budget} (estimated {fitted.tokens:,} tokens, {fitted.full_tokens:,} in full)"
        if fitted.shortened:
            text = "\n".join(m["content"] for m in fitted.messages)
            note += ": " + "; ".join(cuts(fitted.level, ctx, text))
        if fitted.over_budget:
            note += "; still over the budget at its shortest"
            return note, (
                f"LLM prompts were over {budget} even at their shortest (llm/exchanges.jsonl has their sizes): a "
                "server with a context window that small may refuse them; raise the window and the budget"
            )
        return note, (
            f"LLM prompts were shortened to fit {budget} (estimated at 3.5 characters a token): the profile, the "
            "sensitivity table and the earlier rounds were cut to their most important entries; each exchange in "
            "llm/exchanges.jsonl says what its prompt left out"
        )

    def _format_note(self, chat: BaseChatModel) -> str | None:
        """The report's note on the response format this endpoint was found to accept, if a refusal taught one."""
        key = endpoint_of(chat)
        learned = self.format_memory.learned(key)
        if learned is None or self.response_format != "auto":
            return None
        return (
            f"LLM endpoint {key}: {self.format_memory.reason(key) or 'a response format was refused'}; "
            f"requests use response_format={learned} from then on"
        )

    def _plan(self, ctx: PlanningContext, purpose: Purpose) -> PlanResult:
        chat = self.chat  # configuration errors are the caller's to report
        build: PromptBuilder = (
            (lambda d: iteration_messages(ctx, d)) if purpose == "iteration" else (lambda d: analysis_messages(ctx, d))
        )
        followups: list[dict[str, str]] = []
        fitted: FittedMessages[PromptDetail] | None = None
        rejected: list[RejectedAttempt] = []
        report_notes: list[str] = []
        usage: Counter[str] = Counter()
        attempts = 0
        reason = ""
        model = ""
        try:
            for attempt in range(1, self.max_attempts + 1):
                attempts = attempt
                fitted, kept = self._fit(build, followups)
                followups = followups[len(followups) - kept :] if kept else []
                exchange_note, report_note = self._prompt_notes(fitted, ctx)
                if report_note and report_note not in report_notes:
                    report_notes.append(report_note)
                plan, exchange = self._request(chat, ctx, purpose, fitted.messages + followups, attempt)
                model = exchange.model
                if exchange_note:
                    exchange.notes.insert(0, exchange_note)
                plan = self._checked(plan, exchange, ctx, purpose)
                _emit(self.exchange_log, exchange)
                _add_usage(usage, exchange)
                if plan is not None and exchange.ok:
                    source = "llm" if attempt == 1 else "llm-repaired"
                    logger.info("LLM %s plan accepted at attempt %d (%s)", purpose, attempt, source)
                    state = self._state(model, attempts, rejected, usage, exchange)
                    self._add_notes(state, chat, report_notes, fitted)
                    return PlanResult(plan=plan, source=source, planner_state=state)
                rejected.append(self._rejected(exchange, purpose))
                if exchange.transport_failed:
                    detail = exchange.errors[-1] if exchange.errors else ""
                    reason = f"the LLM endpoint failed ({exchange.failure}): {detail}"
                    break
                followups += self._followup(exchange)
            else:
                reason = f"no valid plan after {self.max_attempts} attempts"
        except Exception as exc:  # a bug here must not cost the run: the rules planner still plans
            logger.exception("LLM planner failed")
            reason = f"LLM planner error: {type(exc).__name__}: {exc}"
        result = self._fallback_result(ctx, purpose, model, attempts, rejected, usage, reason)
        self._add_notes(result.planner_state, chat, report_notes, fitted)
        return result

    def _request(
        self, chat: BaseChatModel, ctx: PlanningContext, purpose: Purpose, messages: list[dict[str, str]], attempt: int
    ) -> tuple[OptimizationPlan | None, LLMExchange]:
        """Ask the model for a plan once (:func:`~tools.llm.structured.invoke_structured`): the plan, if it parsed,
        and the exchange."""
        return invoke_structured(
            chat,
            messages,
            OptimizationPlan,
            purpose=purpose,
            normalize=normalize_payload,
            attempt=attempt,
            round=next_round(ctx) if purpose == "iteration" else None,
            response_format=self.response_format,
            memory=self.format_memory,
        )

    def _checked(
        self, plan: OptimizationPlan | None, exchange: LLMExchange, ctx: PlanningContext, purpose: Purpose
    ) -> OptimizationPlan | None:
        """The answer's plan, an iteration's with the latest quantization recommendations carried, validated: the
        exchange is rejected with the reasons where it is invalid."""
        if plan is not None:
            if purpose == "iteration":
                plan = self._carry_quantization(plan, ctx)
                exchange.parsed = plan.model_dump(mode="json")
            errors = validate_plan(plan, ctx, self.model_layer_names, require_pruning=True)
            if errors:
                exchange.reject(errors)
        return plan

    def _rejected(self, exchange: LLMExchange, purpose: Purpose) -> RejectedAttempt:
        """The rejected attempt's entry in ``planner_state["rejected"]``, logged."""
        entry: RejectedAttempt = {
            "attempt": exchange.attempt,
            "failure": exchange.failure,
            "reasons": list(exchange.errors),
            "plan": exchange.parsed,
        }
        if exchange.parsed is None and exchange.raw_response:
            entry["raw"] = exchange.raw_response[:_RAW_KEPT]
        logger.warning(
            "LLM %s attempt %d/%d rejected (%s): %s",
            purpose,
            exchange.attempt,
            self.max_attempts,
            exchange.failure,
            "; ".join(exchange.errors[:3]),
        )
        return entry

    def _followup(self, exchange: LLMExchange) -> list[dict[str, str]]:
        """The rejected answer (cut to fit the budget) and the reasons, to send back with the next attempt."""
        echo = exchange.raw_response or "(empty answer)"
        if len(echo) > self._echo_chars:
            echo = echo[: self._echo_chars] + " ... (cut)"
        reasons = [shorten(e, _ECHO_ERROR_CHARS) for e in exchange.errors[:_ECHO_ERRORS]]
        if len(exchange.errors) > _ECHO_ERRORS:
            reasons.append(f"... and {len(exchange.errors) - _ECHO_ERRORS} more")
        return [{"role": "assistant", "content": echo}, {"role": "user", "content": retry_message(reasons)}]

    def _add_notes(
        self,
        state: dict[str, Any],
        chat: BaseChatModel,
        report_notes: list[str],
        fitted: FittedMessages[PromptDetail] | None,
    ) -> None:
        """The prompt's size against the budget, and the notes for the report, into ``planner_state``."""
        notes = list(report_notes)
        with_format = self._format_note(chat)
        if with_format:
            notes.insert(0, with_format)
        if fitted is not None:
            state["prompt"] = {
                "budget_tokens": self.context_tokens,
                "estimated_tokens": fitted.tokens,
                "full_estimated_tokens": fitted.full_tokens,
                "detail": fitted.level.name,
            }
        if notes:
            state["report_notes"] = notes

    def _state(
        self,
        model: str,
        attempts: int,
        rejected: list[RejectedAttempt],
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
        rejected: list[RejectedAttempt],
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
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> LLMPlanner:
    """The LLM planner of one run: settings from the environment (non-None arguments win), every exchange
    appended to ``RUN/llm/exchanges.jsonl``, learned response formats kept in ``RUN/llm/response_format.json``.
    Raises ``LLMConfigError`` when nothing is configured."""
    settings = settings_from_options(model, base_url, timeout_s)
    log = JsonlExchangeLog(Path(run_dir) / "llm" / "exchanges.jsonl")
    return LLMPlanner(settings, max_attempts=max_attempts, exchange_log=log, context_tokens=context_tokens)


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
    format_memory: ResponseFormatMemory | None = None,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> tuple[InputShape | None, LLMExchange]:
    """Ask the LLM for (channels, height, width) from ``metadata`` (see :func:`shape_metadata`).

    Returns ``(InputShape(source="llm"), exchange)``, or ``(None, exchange)`` when the answer is missing,
    unparsable or implausible. The caller must still prove the shape with a dry forward pass. The prompt
    shows fewer and shorter metadata fields when it would not fit ``context_tokens``; ``format_memory``
    (default: next to a :class:`JsonlExchangeLog`) keeps the response format the endpoint accepts.
    """
    fitted = fit_messages(SHAPE_LEVELS, lambda level: input_shape_messages(metadata, level), context_tokens)
    shape, exchange = invoke_structured(
        chat,
        fitted.messages,
        InputShape,
        purpose="input_shape",
        normalize=normalize_payload,
        memory=format_memory if format_memory is not None else _memory_for(exchange_log),
    )
    if fitted.shortened or fitted.over_budget:
        fields, chars = fitted.level
        exchange.notes.insert(
            0,
            f"prompt shortened to fit {context_tokens:,} tokens (estimated {fitted.tokens:,}, {fitted.full_tokens:,} "
            f"in full): at most {fields} metadata fields per section, values cut to {chars} characters",
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
