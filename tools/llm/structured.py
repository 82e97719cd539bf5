"""Structured answers from a chat model: JSON parsed from the raw text into a pydantic schema.

* :func:`invoke_structured` asks for JSON matching a pydantic schema and parses it from the raw text,
  whatever the server does with ``response_format``: JSON in prose, in code fences or after a
  ``<think>`` block, trailing commas, Python-style literals, a wrapper object (``{"answer": {...}}``).
  Callers pass a ``normalize`` function that maps field-name variants onto the schema's names (see
  :data:`Normalizer`); the default only unwraps wrapper objects. It never raises for HTTP errors,
  timeouts or garbage: it returns ``None`` and an :class:`LLMExchange` that says what went wrong.
  When the server refuses the ``response_format``, it asks again with the next one
  (:mod:`tools.llm.response_format`) and remembers what the endpoint accepts.
* Every exchange is a record that can be stored.

This module knows nothing about what the answers mean: schemas and normalisers come from the caller.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from tools.llm.budget import estimate_prompt_tokens
from tools.llm.client import shorten
from tools.llm.response_format import (
    ResponseFormatMemory,
    ResponseFormatMode,
    endpoint_key,
    error_text,
    refuses_format,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import BaseMessage

logger = logging.getLogger(__name__)

__all__ = [
    "TRANSPORT_FAILURES",
    "Failure",
    "LLMExchange",
    "Normalizer",
    "PromptMessage",
    "ResponseFormatMemory",
    "ResponseFormatMode",
    "endpoint_of",
    "extract_json_candidates",
    "find_object",
    "find_unwrapped",
    "invoke_structured",
    "norm_key",
    "normalize_generic",
    "parse_structured",
    "prompt_dicts",
]

Failure = Literal["http", "timeout", "connection", "error", "parse", "schema", "validation"]
#: Failures of the transport (the server did not give an answer): retrying the same prompt is pointless.
TRANSPORT_FAILURES: frozenset[str] = frozenset({"http", "timeout", "connection", "error"})

T = TypeVar("T", bound=BaseModel)

#: Maps a parsed JSON value onto a schema's field names, appending what it did to the notes list.
Normalizer = Callable[[Any, type[BaseModel], list[str]], Any]


# --------------------------------------------------------------------------------------------------
# Exchange records
# --------------------------------------------------------------------------------------------------


class LLMExchange(BaseModel):
    """One request to the chat model and what came of it (stored in the run directory)."""

    purpose: str = Field(description="What the request is for (a label chosen by the caller).")
    attempt: int = 1
    round: int | None = Field(default=None, description="Round of an iterative loop the request is for, if any.")
    model: str = ""
    prompt: list[dict[str, str]] = Field(default_factory=list, description="role/content messages as sent.")
    raw_response: str = ""
    parsed: dict[str, Any] | None = Field(default=None, description="The JSON object used, after normalisation.")
    errors: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Non-fatal: renamed fields, format downgrades.")
    failure: Failure | None = None
    http_status: int | None = None
    response_format: ResponseFormatMode = Field(default="none", description="The format the answer was asked with.")
    refused_formats: list[ResponseFormatMode] = Field(
        default_factory=list, description="Formats the server refused for this request, in the order tried."
    )
    estimated_prompt_tokens: int = Field(default=0, description="The prompt's size as estimated before sending.")
    token_usage: dict[str, int] = Field(default_factory=dict, description="Tokens as counted by the server.")
    latency_s: float = 0.0
    ok: bool = False
    timestamp: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def reject(self, reasons: Sequence[str], failure: Failure = "validation") -> None:
        """Mark a parsed answer as rejected by a later check (e.g. plan validation)."""
        self.errors.extend(reasons)
        self.failure = failure
        self.ok = False

    @property
    def transport_failed(self) -> bool:
        return self.failure in TRANSPORT_FAILURES


# --------------------------------------------------------------------------------------------------
# JSON extraction
# --------------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def _lenient_loads(text: str) -> Any:
    """json.loads, then without trailing commas, then as a Python literal (single quotes, True/None)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    fixed = _TRAILING_COMMA.sub(r"\1", text)
    try:
        return json.loads(fixed)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(fixed)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError("not JSON") from None
    if isinstance(value, dict | list):
        return json.loads(json.dumps(value))
    raise ValueError("not a JSON object")


def _balanced_spans(text: str) -> list[tuple[int, int]]:
    """Spans of top-level balanced ``{...}`` / ``[...]`` in ``text``, skipping brackets inside strings."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] not in "{[":
            i += 1
            continue
        stack: list[str] = []
        quote: str | None = None
        j = i
        end = -1
        while j < n:
            ch = text[j]
            if quote:
                if ch == "\\":
                    j += 2
                    continue
                if ch == quote:
                    quote = None
            elif ch in "\"'":
                # an apostrophe in prose inside a Python-style dict is rare; only treat ' as a quote after
                # a delimiter, so that "don't" in a justification does not swallow the rest
                if ch == '"' or (j > 0 and text[j - 1] in "{[,: \n\t"):
                    quote = ch
            elif ch in "{[":
                stack.append("}" if ch == "{" else "]")
            elif ch in "}]":
                if not stack or stack.pop() != ch:
                    break
                if not stack:
                    end = j + 1
                    break
            j += 1
        if end > 0:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def extract_json_candidates(text: str) -> list[Any]:
    """JSON values found in a model's answer, most likely first: the whole text, fenced blocks, then
    balanced objects in the prose. ``<think>`` blocks of reasoning models are ignored."""
    text = _THINK.sub("", text).strip()
    found: list[Any] = []
    seen: set[str] = set()

    def add(value: Any) -> None:
        if not isinstance(value, dict | list):
            return
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            found.append(value)

    def scan(chunk: str) -> None:
        for start, end in _balanced_spans(chunk):
            try:
                add(_lenient_loads(chunk[start:end]))
            except ValueError:
                continue

    with contextlib.suppress(ValueError):
        add(_lenient_loads(text))
    blocks = list(_FENCE.finditer(text))
    for block in blocks:
        body = block.group(2)
        try:
            add(_lenient_loads(body))
        except ValueError:
            scan(body)
    scan(_FENCE.sub(" ", text) if blocks else text)
    return found


# --------------------------------------------------------------------------------------------------
# Normalisation and parsing
# --------------------------------------------------------------------------------------------------


def norm_key(key: Any) -> str:
    """A field name compared loosely: trimmed, lower case, spaces and dashes as underscores."""
    return re.sub(r"[\s\-]+", "_", str(key).strip()).lower()


def find_object(data: Any, known: set[str], depth: int = 3) -> Any:
    """``data`` itself when it has a known key, else the first nested dict that does (wrappers)."""
    if isinstance(data, dict):
        if any(norm_key(k) in known for k in data):
            return data
        if depth > 0:
            for value in data.values():
                found = find_object(value, known, depth - 1)
                if found is not None:
                    return found
    return None


def find_unwrapped(data: Any, known: set[str], what: str, notes: list[str]) -> Any:
    """:func:`find_object`, noting ``unwrapped the <what> from an enclosing object`` where it was nested."""
    found = find_object(data, known)
    if found is not None and found is not data:
        notes.append(f"unwrapped the {what} from an enclosing object")
    return found


def normalize_generic(data: Any, schema: type[BaseModel], notes: list[str]) -> Any:
    """The default :data:`Normalizer`: ``data``, or the nested object that has ``schema``'s fields."""
    found = find_unwrapped(data, set(schema.model_fields), "answer", notes)
    return found if found is not None else data


def _validation_messages(exc: ValidationError) -> list[str]:
    messages = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        got = err.get("input")
        shown = "" if err.get("type") == "missing" else f" (got {shorten(json.dumps(got, default=str), 80)})"
        messages.append(f"{loc}: {err.get('msg', 'invalid')}{shown}")
    return messages


def parse_structured(
    text: str, schema: type[T], normalize: Normalizer | None = None
) -> tuple[T | None, dict[str, Any] | None, list[str], list[str]]:
    """Parse ``schema`` from a raw answer: (value, normalised dict, errors, notes).

    ``normalize`` maps each JSON candidate onto the schema's field names (default: :func:`normalize_generic`).
    """
    normalize = normalize if normalize is not None else normalize_generic
    candidates = extract_json_candidates(text)
    if not candidates:
        preview = shorten(text, 200) if text.strip() else "(empty answer)"
        return None, None, [f"no JSON object found in the answer: {preview}"], []
    best: tuple[list[str], dict[str, Any] | None, list[str]] | None = None
    for candidate in candidates:
        notes: list[str] = []
        normalized = normalize(candidate, schema, notes)
        if not isinstance(normalized, dict):
            errors = [f"expected a JSON object for {schema.__name__}, got {type(normalized).__name__}"]
            if best is None:
                best = (errors, None, notes)
            continue
        try:
            value = schema.model_validate(normalized)
        except ValidationError as exc:
            errors = _validation_messages(exc) + [n for n in notes if "dropped" in n]
            if best is None or best[1] is None or len(errors) < len(best[0]):
                best = (errors, normalized, notes)
            continue
        return value, normalized, [], notes
    assert best is not None
    return None, best[1], best[0], best[2]


# --------------------------------------------------------------------------------------------------
# Invocation
# --------------------------------------------------------------------------------------------------

PromptMessage = dict[str, str]
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "user": "user", "assistant": "assistant"}


def prompt_dicts(messages: Sequence[BaseMessage | PromptMessage]) -> list[PromptMessage]:
    """Messages as role/content dicts (what an exchange records)."""
    out = []
    for m in messages:
        if isinstance(m, dict):
            out.append({"role": str(m.get("role", "user")), "content": str(m.get("content", ""))})
        else:
            out.append({"role": _ROLES.get(m.type, m.type), "content": m.text})
    return out


def _to_messages(messages: Sequence[PromptMessage]) -> list[BaseMessage]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    kinds: dict[str, type[BaseMessage]] = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds.get(m["role"], HumanMessage)(content=m["content"]) for m in messages]


def _response_format(mode: ResponseFormatMode, schema: type[BaseModel]) -> dict[str, Any] | None:
    if mode == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema(), "strict": False},
        }
    if mode == "json_object":
        return {"type": "json_object"}
    return None


def _classify(exc: BaseException) -> tuple[Failure, int | None]:
    import openai
    from langchain_core.exceptions import ModelConnectionError, ModelTimeoutError

    if isinstance(exc, openai.APITimeoutError | ModelTimeoutError | TimeoutError):
        return "timeout", None
    if isinstance(exc, openai.APIConnectionError | ModelConnectionError | ConnectionError):
        return "connection", None
    if isinstance(exc, openai.APIStatusError):
        return "http", int(exc.status_code)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return "http", status
    return "error", None


def _usage(message: Any) -> dict[str, int]:
    usage = getattr(message, "usage_metadata", None) or {}
    out = {k: int(v) for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
    if not out:
        raw = (getattr(message, "response_metadata", None) or {}).get("token_usage") or {}
        out = {k: int(v) for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out


def _supports_response_format(chat: Any) -> bool:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:  # pragma: no cover - langchain-openai is a dependency
        return False
    return isinstance(chat, ChatOpenAI)


def _model_name(chat: Any) -> str:
    return str(getattr(chat, "model_name", None) or getattr(chat, "model", None) or type(chat).__name__)


def endpoint_of(chat: Any) -> str:
    """The key under which ``chat``'s endpoint is remembered (base URL and model; see :func:`endpoint_key`)."""
    base = getattr(chat, "openai_api_base", None) or getattr(chat, "base_url", None) or ""
    return endpoint_key(str(base), _model_name(chat))


def invoke_structured(
    chat: BaseChatModel,
    messages: Sequence[BaseMessage | PromptMessage],
    schema: type[T],
    *,
    purpose: str,
    normalize: Normalizer | None = None,
    attempt: int = 1,
    round: int | None = None,
    response_format: ResponseFormatMode = "auto",
    memory: ResponseFormatMemory | None = None,
) -> tuple[T | None, LLMExchange]:
    """Ask ``chat`` for JSON matching ``schema`` and parse it from the raw answer. Never raises for
    HTTP errors, timeouts, connection failures or unparsable answers: returns ``(None, exchange)``.

    ``response_format``: ``auto`` sends a ``json_schema`` response format (a hint only: many servers
    ignore it) and, when the server refuses it, asks again with ``json_object``, then without one
    (:data:`~tools.llm.response_format.LADDER`). A refusal is an HTTP 4xx/5xx whose message mentions the
    format (llama-cpp-python's server answers 500), or a plain 400/422. ``memory`` remembers per endpoint
    the format it accepts, so later requests start there (refusals that name the format are remembered at
    once, a plain 400/422 once the next format was answered). ``json_schema``, ``json_object`` or ``none``
    fix the mode. The exchange records the format used, the refused ones and a note for each refusal.
    The answer is parsed from its text in every mode. ``purpose`` labels the exchange; ``normalize``
    maps field-name variants (see :func:`parse_structured`).
    """
    prompt = prompt_dicts(messages)
    exchange = LLMExchange(
        purpose=purpose,
        attempt=attempt,
        round=round,
        model=_model_name(chat),
        prompt=prompt,
        estimated_prompt_tokens=estimate_prompt_tokens(prompt),
    )
    memory = memory if memory is not None else ResponseFormatMemory()
    modes = _format_modes(chat, response_format, memory, exchange)
    lc_messages = _to_messages(prompt)
    started = time.perf_counter()
    message = _invoke_in_formats(chat, lc_messages, schema, modes, memory, exchange)
    exchange.latency_s = float(f"{time.perf_counter() - started:.4f}")
    if message is None:
        if exchange.failure is None:  # pragma: no cover - defensive
            exchange.failure = "error"
        return None, exchange
    return _parse_answer(message, schema, normalize, exchange), exchange


def _format_modes(
    chat: BaseChatModel, response_format: ResponseFormatMode, memory: ResponseFormatMemory, exchange: LLMExchange
) -> list[ResponseFormatMode]:
    """The response formats to ask with, in order: from the one ``memory`` learned for the endpoint (noted on
    ``exchange`` when not ``json_schema``), or none where the client cannot send one."""
    modes: list[ResponseFormatMode] = (
        memory.start(endpoint_of(chat), response_format) if _supports_response_format(chat) else ["none"]
    )
    if response_format == "auto" and modes[0] != "json_schema":
        exchange.notes.append(f"response_format={modes[0]}, learned earlier for this endpoint")
    return modes


def _invoke_in_formats(
    chat: BaseChatModel,
    lc_messages: list[BaseMessage],
    schema: type[BaseModel],
    modes: list[ResponseFormatMode],
    memory: ResponseFormatMemory,
    exchange: LLMExchange,
) -> Any:
    """The server's message, asked with each of ``modes`` in turn while the server refuses the format (each refusal
    noted, and learned into ``memory``); None where the request failed otherwise (``exchange`` says how)."""
    key = endpoint_of(chat)
    unconfirmed: str | None = None  # a plain 400/422 refusal, remembered once the next format is answered
    for i, mode in enumerate(modes):
        exchange.response_format = mode
        fmt = _response_format(mode, schema)
        try:
            message = chat.invoke(lc_messages, extra_body={"response_format": fmt}) if fmt else chat.invoke(lc_messages)
        except Exception as exc:  # every client error becomes a recorded failure
            failure, status = _classify(exc)
            text = error_text(exc)
            named = failure == "http" and refuses_format(status, text)
            if (named or (failure == "http" and status in (400, 422))) and i + 1 < len(modes):
                following = modes[i + 1]
                reason = _note_refusal(exchange, exc, mode, following, status)
                if not named:
                    unconfirmed = reason
                elif memory.learn(key, following, reason):
                    exchange.notes.append(f"response_format={following} is used for this endpoint from now on")
                continue
            exchange.failure, exchange.http_status = failure, status
            exchange.errors.append(
                f"{failure} error from {exchange.model}: {type(exc).__name__}: {shorten(str(exc), 240)}"
            )
            logger.warning("LLM %s request failed: %s", exchange.purpose, exchange.errors[-1])
            return None
        if unconfirmed is not None and memory.learn(key, mode, unconfirmed):
            exchange.notes.append(f"response_format={mode} is used for this endpoint from now on")
        return message
    return None


def _note_refusal(
    exchange: LLMExchange,
    exc: Exception,
    mode: ResponseFormatMode,
    following: ResponseFormatMode,
    status: int | None,
) -> str:
    """Record on ``exchange`` (and in the log) that the server refused ``mode`` and ``following`` is asked next; the
    reason noted."""
    exchange.refused_formats.append(mode)
    reason = (
        f"the server refused response_format={mode} (HTTP {status}: {shorten(str(exc), 160)}); "
        f"asked again with response_format={following}"
    )
    exchange.notes.append(reason)
    logger.warning("LLM %s: %s", exchange.purpose, reason)
    return reason


def _parse_answer(message: Any, schema: type[T], normalize: Normalizer | None, exchange: LLMExchange) -> T | None:
    """``schema`` parsed from the server's ``message`` (None where it does not parse); the answer, what was parsed and
    what went wrong recorded on ``exchange``."""
    exchange.raw_response = str(getattr(message, "text", "") or "")
    exchange.token_usage = _usage(message)
    value, parsed, errors, notes = parse_structured(exchange.raw_response, schema, normalize)
    exchange.parsed = parsed
    exchange.notes.extend(notes)
    if value is None:
        exchange.errors.extend(errors)
        exchange.failure = "parse" if parsed is None else "schema"
        logger.info("LLM %s answer did not parse as %s: %s", exchange.purpose, schema.__name__, "; ".join(errors[:3]))
        return None
    exchange.parsed = value.model_dump(mode="json")
    exchange.ok = True
    return value
