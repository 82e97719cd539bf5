"""Chat models for the LLM planner: settings, an endpoint check, and robust structured output.

* :class:`LLMSettings` configures a ``langchain_openai.ChatOpenAI`` client for OpenAI or any
  OpenAI-compatible server (vLLM, llama.cpp, Ollama, LM Studio, ...). :meth:`LLMSettings.from_env`
  reads ``OPENAI_API_KEY``, ``PROFILING_AGENT_LLM_BASE_URL`` / ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE``
  and ``PROFILING_AGENT_LLM_MODEL``.
* :func:`make_chat_model` builds the client (``langchain_openai`` is imported only then: importing this
  module needs neither a key nor the network).
* :func:`check_endpoint` makes one cheap request and raises :class:`LLMUnavailableError` when the
  endpoint does not answer, so that a run fails at its start rather than in the middle.
* :func:`invoke_structured` asks for JSON matching a pydantic schema and parses it from the raw text,
  whatever the server does with ``response_format``: JSON in prose or in code fences, a wrapper object
  (``{"plan": {...}}``), common field-name variants (``type`` for ``pruning_type``, ``ratio`` for
  ``pruning_ratio``, ...). It never raises for HTTP errors, timeouts or garbage: it returns ``None``
  and an :class:`LLMExchange` that says what went wrong. Every exchange is a record that can be stored.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError

from tools.schemas import InputShape, OptimizationPlan

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import BaseMessage
    from langchain_openai import ChatOpenAI

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "PLACEHOLDER_API_KEY",
    "Failure",
    "LLMConfigError",
    "LLMExchange",
    "LLMSettings",
    "LLMUnavailableError",
    "Purpose",
    "ResponseFormatMode",
    "check_endpoint",
    "extract_json_candidates",
    "invoke_structured",
    "make_chat_model",
    "normalize_payload",
    "parse_structured",
    "prompt_dicts",
]

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_API_KEY = "not-needed"  # local OpenAI-compatible servers want a key but do not check it

Purpose = Literal["input_shape", "analysis", "iteration"]
ResponseFormatMode = Literal["auto", "json_schema", "json_object", "none"]
Failure = Literal["http", "timeout", "connection", "error", "parse", "schema", "validation"]
#: Failures of the transport (the server did not give an answer): retrying the same prompt is pointless.
TRANSPORT_FAILURES: frozenset[str] = frozenset({"http", "timeout", "connection", "error"})

T = TypeVar("T", bound=BaseModel)


class LLMConfigError(ValueError):
    """The LLM cannot be configured (no key and no base URL)."""


class LLMUnavailableError(ValueError):
    """The configured endpoint does not answer."""


# --------------------------------------------------------------------------------------------------
# Settings and client
# --------------------------------------------------------------------------------------------------


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


class LLMSettings(BaseModel):
    """How to reach the chat model. ``api_key`` is a secret: it never appears in dumps or reprs."""

    model: str = DEFAULT_MODEL
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=0.0, description="None leaves the server's default.")
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=1, ge=0, description="Client retries on connection errors, 429 and 5xx.")

    @classmethod
    def from_env(cls, **overrides: Any) -> LLMSettings:
        """Settings from the environment; keyword overrides that are not None win (e.g. CLI flags).

        ``base_url``: ``PROFILING_AGENT_LLM_BASE_URL``, then ``OPENAI_BASE_URL``, then ``OPENAI_API_BASE``.
        ``model``: ``PROFILING_AGENT_LLM_MODEL`` (default ``gpt-4o-mini``). ``api_key``: ``OPENAI_API_KEY``;
        with a base URL and no key a placeholder is used, as local servers expect. Raises
        :class:`LLMConfigError` when there is neither a key nor a base URL.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - set(cls.model_fields)
        if unknown:
            raise TypeError(f"unknown LLM settings: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {
            "model": _env("PROFILING_AGENT_LLM_MODEL") or DEFAULT_MODEL,
            "base_url": _env("PROFILING_AGENT_LLM_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE"),
            "api_key": _env("OPENAI_API_KEY"),
        }
        values.update(given)
        if isinstance(values.get("api_key"), SecretStr):
            values["api_key"] = values["api_key"].get_secret_value() or None
        if not values.get("api_key"):
            if not values.get("base_url"):
                raise LLMConfigError(
                    "no LLM configured: set OPENAI_API_KEY, or pass --llm-base-url for an OpenAI-compatible server"
                )
            values["api_key"] = PLACEHOLDER_API_KEY
        return cls.model_validate(values)

    @property
    def endpoint(self) -> str:
        """The base URL requests go to (OpenAI's when none is set)."""
        return (self.base_url or DEFAULT_BASE_URL).rstrip("/")

    def public_dict(self) -> dict[str, Any]:
        """JSON-safe settings without the key (for settings files and reports)."""
        data = self.model_dump(exclude={"api_key"})
        data["api_key_set"] = self.api_key is not None and self.api_key.get_secret_value() != PLACEHOLDER_API_KEY
        return data

    def _key(self) -> str:
        key = self.api_key.get_secret_value() if self.api_key is not None else ""
        if key:
            return key
        if self.base_url:
            return PLACEHOLDER_API_KEY
        raise LLMConfigError(
            "no LLM configured: set OPENAI_API_KEY, or pass --llm-base-url for an OpenAI-compatible server"
        )


def make_chat_model(settings: LLMSettings) -> ChatOpenAI:
    """A ``ChatOpenAI`` client for ``settings`` (Chat Completions API; creating it sends no request)."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=settings.model,
        base_url=settings.endpoint,
        api_key=SecretStr(settings._key()),
        temperature=settings.temperature,
        timeout=settings.timeout_s,
        max_retries=settings.max_retries,
        use_responses_api=False,
    )


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_endpoint(settings: LLMSettings, timeout_s: float = 5.0) -> None:
    """One cheap request to the endpoint; :class:`LLMUnavailableError` (one line, naming the URL) if it fails.

    ``GET {base_url}/models``; servers without that route (404/405) get one 1-token chat completion
    instead. A rejected key (401/403) is an error too.
    """
    import httpx

    base = settings.endpoint
    headers = {"Authorization": f"Bearer {settings._key()}"}
    url = f"{base}/models"
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LLMUnavailableError(
            f"LLM endpoint {url} does not answer: {type(exc).__name__}: {_short(str(exc))}"
        ) from None
    if response.status_code in (401, 403):
        raise LLMUnavailableError(f"LLM endpoint {url} rejected the API key (HTTP {response.status_code})")
    if response.is_success:
        try:
            ids = {str(m.get("id")) for m in response.json().get("data", []) if isinstance(m, dict)}
        except (ValueError, AttributeError):
            ids = set()
        if ids and settings.model not in ids:
            logger.warning(
                "model %r is not listed by %s (%d models); the server may still accept it",
                settings.model,
                url,
                len(ids),
            )
        return
    url = f"{base}/chat/completions"
    body = {"model": settings.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    try:
        response = httpx.post(url, headers=headers, json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LLMUnavailableError(
            f"LLM endpoint {url} does not answer: {type(exc).__name__}: {_short(str(exc))}"
        ) from None
    if not response.is_success:
        raise LLMUnavailableError(
            f"LLM endpoint {url} answered HTTP {response.status_code}: {_short(response.text, 120)}"
        )


# --------------------------------------------------------------------------------------------------
# Exchange records
# --------------------------------------------------------------------------------------------------


class LLMExchange(BaseModel):
    """One request to the chat model and what came of it (stored in the run directory)."""

    purpose: Purpose
    attempt: int = 1
    round: int | None = Field(default=None, description="Iteration round the plan is for (iteration only).")
    model: str = ""
    prompt: list[dict[str, str]] = Field(default_factory=list, description="role/content messages as sent.")
    raw_response: str = ""
    parsed: dict[str, Any] | None = Field(default=None, description="The JSON object used, after normalisation.")
    errors: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Non-fatal: renamed fields, format downgrades.")
    failure: Failure | None = None
    http_status: int | None = None
    response_format: ResponseFormatMode = "none"
    token_usage: dict[str, int] = Field(default_factory=dict)
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
# Normalisation of field-name variants
# --------------------------------------------------------------------------------------------------

_PRUNING_KEYS = {
    "pruning_recommendations": "pruning_recommendations",
    "pruning": "pruning_recommendations",
    "prune": "pruning_recommendations",
    "pruning_plan": "pruning_recommendations",
    "pruning_recs": "pruning_recommendations",
    "pruning_recommendation": "pruning_recommendations",
    "pruning_decisions": "pruning_recommendations",
    "quantization_recommendations": "quantization_recommendations",
    "quantization": "quantization_recommendations",
    "quantize": "quantization_recommendations",
    "quantization_plan": "quantization_recommendations",
    "quantization_recs": "quantization_recommendations",
    "quantization_recommendation": "quantization_recommendations",
    "quant_recommendations": "quantization_recommendations",
    "quantization_decisions": "quantization_recommendations",
}
_PRUNE_REC_KEYS = {
    "layer": "layer",
    "pattern": "layer",
    "regex": "layer",
    "layer_pattern": "layer",
    "layer_regex": "layer",
    "layers": "layer",
    "module": "layer",
    "modules": "layer",
    "target": "layer",
    "name": "layer",
    "pruning_type": "pruning_type",
    "type": "pruning_type",
    "prune_type": "pruning_type",
    "method": "pruning_type",
    "kind": "pruning_type",
    "strategy": "pruning_type",
    "pruning_ratio": "pruning_ratio",
    "ratio": "pruning_ratio",
    "prune_ratio": "pruning_ratio",
    "amount": "pruning_ratio",
    "sparsity": "pruning_ratio",
    "fraction": "pruning_ratio",
    "justification": "justification",
    "reason": "justification",
    "rationale": "justification",
    "why": "justification",
    "explanation": "justification",
}
_QUANT_REC_KEYS = {
    "layer": "layer",
    "pattern": "layer",
    "regex": "layer",
    "layers": "layer",
    "layer_pattern": "layer",
    "module": "layer",
    "modules": "layer",
    "target": "layer",
    "quantization_type": "quantization_type",
    "type": "quantization_type",
    "method": "quantization_type",
    "mode": "quantization_type",
    "dtype": "dtype",
    "precision": "dtype",
    "data_type": "dtype",
    "bits": "dtype",
    "justification": "justification",
    "reason": "justification",
    "rationale": "justification",
    "why": "justification",
    "explanation": "justification",
}
_SHAPE_KEYS = {
    "channels": "channels",
    "c": "channels",
    "num_channels": "channels",
    "in_channels": "channels",
    "n_channels": "channels",
    "channel": "channels",
    "height": "height",
    "h": "height",
    "image_height": "height",
    "img_height": "height",
    "width": "width",
    "w": "width",
    "image_width": "width",
    "img_width": "width",
}
_DTYPES = {
    "qint8": "qint8",
    "int8": "qint8",
    "torch.qint8": "qint8",
    "i8": "qint8",
    "8": "qint8",
    "8bit": "qint8",
    "8-bit": "qint8",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "torch.float16": "float16",
    "16": "float16",
}


def _norm_key(key: Any) -> str:
    return re.sub(r"[\s\-]+", "_", str(key).strip()).lower()


def _rename(item: dict[str, Any], aliases: dict[str, str], where: str, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in item.items():
        target = aliases.get(_norm_key(key))
        if target is None:
            expected = ", ".join(sorted(set(aliases.values())))
            notes.append(f"{where}: dropped unknown field {key!r} (fields: {expected})")
            continue
        if target in out:
            if _norm_key(key) == target:  # the canonical name wins over an alias seen earlier
                out[target] = value
            notes.append(f"{where}: dropped duplicate field {key!r}")
            continue
        if key != target:
            notes.append(f"{where}: read {key!r} as {target!r}")
        out[target] = value
    return out


def _ratio(value: Any, where: str, notes: list[str]) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            if text.endswith("%"):
                value = float(text[:-1]) / 100
                notes.append(f"{where}: read {text!r} as {value}")
                return value
            value = float(text)
        except ValueError:
            return text
    if isinstance(value, int | float) and not isinstance(value, bool) and 1 < value <= 100:
        notes.append(f"{where}: read pruning_ratio {value} as a percentage ({value / 100})")
        return value / 100
    return value


def _layer(value: Any, where: str, notes: list[str]) -> Any:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        joined = value[0] if len(value) == 1 else "|".join(f"(?:{v})" for v in value)
        notes.append(f"{where}: joined a list of {len(value)} layer patterns into one regex")
        return joined
    return value


def _pruning_type(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = _norm_key(value)
    if "head" in text:
        return "head"
    if any(k in text for k in ("struct", "channel", "filter", "neuron", "width")):
        return "structured"
    return value


def _normalize_prune_rec(item: Any, where: str, notes: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    rec = _rename(item, _PRUNE_REC_KEYS, where, notes)
    if "pruning_type" in rec:
        before = rec["pruning_type"]
        rec["pruning_type"] = _pruning_type(before)
        if rec["pruning_type"] != before:
            notes.append(f"{where}: read pruning_type {before!r} as {rec['pruning_type']!r}")
    if "pruning_ratio" in rec:
        rec["pruning_ratio"] = _ratio(rec["pruning_ratio"], where, notes)
    if "layer" in rec:
        rec["layer"] = _layer(rec["layer"], where, notes)
    return rec


def _normalize_quant_rec(item: Any, where: str, notes: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    rec = _rename(item, _QUANT_REC_KEYS, where, notes)
    qtype = rec.get("quantization_type")
    if isinstance(qtype, str | int) and str(qtype).strip().lower() in _DTYPES and "dtype" not in rec:
        rec["dtype"] = qtype
        rec["quantization_type"] = "dynamic"
        notes.append(f"{where}: read quantization_type {qtype!r} as a dtype")
    elif isinstance(qtype, str) and "dynamic" in qtype.lower() and qtype != "dynamic":
        rec["quantization_type"] = "dynamic"
        notes.append(f"{where}: read quantization_type {qtype!r} as 'dynamic'")
    dtype = rec.get("dtype")
    if isinstance(dtype, str | int) and not isinstance(dtype, bool):
        mapped = _DTYPES.get(str(dtype).strip().lower())
        if mapped and mapped != dtype:
            rec["dtype"] = mapped
            notes.append(f"{where}: read dtype {dtype!r} as {mapped!r}")
    if "layer" in rec:
        rec["layer"] = _layer(rec["layer"], where, notes)
        if isinstance(rec["layer"], str) and rec["layer"].strip().lower() in {"all", "*", ".*", "all_linear"}:
            rec["layer"] = "all"
    return rec


def _is_quant_item(item: Any) -> bool:
    return isinstance(item, dict) and any(_norm_key(k) in {"dtype", "quantization_type", "precision"} for k in item)


def _find_object(data: Any, known: set[str], depth: int = 3) -> Any:
    """``data`` itself when it has a known key, else the first nested dict that does (wrappers)."""
    if isinstance(data, dict):
        if any(_norm_key(k) in known for k in data):
            return data
        if depth > 0:
            for value in data.values():
                found = _find_object(value, known, depth - 1)
                if found is not None:
                    return found
    return None


def _normalize_plan(data: Any, notes: list[str]) -> Any:
    if isinstance(data, list):
        notes.append("read a top-level list as the recommendations")
        data = {"recommendations": data}
    known = {*_PRUNING_KEYS, "recommendations"}
    found = _find_object(data, known)
    if found is None:
        rec_keys = {_norm_key(k) for k in data} if isinstance(data, dict) else set()
        if {_PRUNE_REC_KEYS.get(k) for k in rec_keys} >= {"layer", "pruning_ratio"}:
            notes.append("read a single top-level recommendation as the pruning recommendations")
            found = {"pruning_recommendations": [data]}
        else:
            return data
    if found is not data:
        notes.append("unwrapped the plan from an enclosing object")
    out: dict[str, Any] = {}
    for key, value in found.items():
        norm = _norm_key(key)
        if norm == "recommendations" and isinstance(value, list):
            prune = [v for v in value if not _is_quant_item(v)]
            quant = [v for v in value if _is_quant_item(v)]
            out.setdefault("pruning_recommendations", []).extend(prune)
            out.setdefault("quantization_recommendations", []).extend(quant)
            notes.append("split 'recommendations' into pruning and quantization recommendations")
            continue
        target = _PRUNING_KEYS.get(norm)
        if target is None:
            notes.append(f"dropped unknown top-level field {key!r}")
            continue
        if key != target:
            notes.append(f"read {key!r} as {target!r}")
        if isinstance(value, dict):
            value = [value]
        if value is None:
            value = []
        if isinstance(value, list):
            out.setdefault(target, []).extend(value)
        else:
            out[target] = value
    for i, item in enumerate(out.get("pruning_recommendations", [])):
        out["pruning_recommendations"][i] = _normalize_prune_rec(item, f"pruning_recommendations[{i}]", notes)
    for i, item in enumerate(out.get("quantization_recommendations", [])):
        where = f"quantization_recommendations[{i}]"
        out["quantization_recommendations"][i] = _normalize_quant_rec(item, where, notes)
    return out


def _normalize_shape(data: Any, notes: list[str]) -> Any:
    if isinstance(data, list):
        data = {"shape": data}
    known = {*_SHAPE_KEYS, "shape", "input_shape", "size", "image_size", "input_size"}
    found = _find_object(data, known)
    if found is None:
        return data
    if found is not data:
        notes.append("unwrapped the shape from an enclosing object")
    out: dict[str, Any] = {}
    for key, value in found.items():
        norm = _norm_key(key)
        if norm in {"shape", "input_shape", "size", "image_size", "input_size"}:
            dims = [value, value] if isinstance(value, int) else value
            if isinstance(dims, dict):
                out.update(_rename(dims, _SHAPE_KEYS, key, notes))
            elif isinstance(dims, list) and all(isinstance(d, int) for d in dims):
                dims = dims[-3:] if len(dims) == 4 else dims  # drop a batch dimension
                if len(dims) == 3:
                    c, h, w = dims if dims[0] <= 4 or dims[2] > 4 else (dims[2], dims[0], dims[1])
                    out.setdefault("channels", c)
                    out.setdefault("height", h)
                    out.setdefault("width", w)
                elif len(dims) == 2:
                    out.setdefault("height", dims[0])
                    out.setdefault("width", dims[1])
                notes.append(f"read {key!r} {value!r} as the shape")
            continue
        target = _SHAPE_KEYS.get(norm)
        if target is None:
            if norm != "source":
                notes.append(f"dropped unknown field {key!r}")
            continue
        out[target] = value
    return out


#: Schema -> function that maps a parsed JSON value to the schema's field names (recording what it did).
NORMALIZERS: dict[type[BaseModel], Callable[[Any, list[str]], Any]] = {
    OptimizationPlan: _normalize_plan,
    InputShape: _normalize_shape,
}


def _normalize_generic(data: Any, schema: type[BaseModel], notes: list[str]) -> Any:
    found = _find_object(data, set(schema.model_fields))
    if found is not None and found is not data:
        notes.append("unwrapped the answer from an enclosing object")
    return found if found is not None else data


def normalize_payload(data: Any, schema: type[BaseModel], notes: list[str] | None = None) -> Any:
    """Map a parsed JSON value onto ``schema``'s field names (wrappers, aliases, value spellings)."""
    notes = notes if notes is not None else []
    normalizer = NORMALIZERS.get(schema)
    if normalizer is None:
        return _normalize_generic(data, schema, notes)
    return normalizer(data, notes)


def _validation_messages(exc: ValidationError) -> list[str]:
    messages = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        got = err.get("input")
        shown = "" if err.get("type") == "missing" else f" (got {_short(json.dumps(got, default=str), 80)})"
        messages.append(f"{loc}: {err.get('msg', 'invalid')}{shown}")
    return messages


def parse_structured(text: str, schema: type[T]) -> tuple[T | None, dict[str, Any] | None, list[str], list[str]]:
    """Parse ``schema`` from a raw answer: (value, normalised dict, errors, notes)."""
    candidates = extract_json_candidates(text)
    if not candidates:
        preview = _short(text, 200) if text.strip() else "(empty answer)"
        return None, None, [f"no JSON object found in the answer: {preview}"], []
    best: tuple[list[str], dict[str, Any] | None, list[str]] | None = None
    for candidate in candidates:
        notes: list[str] = []
        normalized = normalize_payload(candidate, schema, notes)
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


def invoke_structured(
    chat: BaseChatModel,
    messages: Sequence[BaseMessage | PromptMessage],
    schema: type[T],
    *,
    purpose: Purpose = "analysis",
    attempt: int = 1,
    round: int | None = None,
    response_format: ResponseFormatMode = "auto",
) -> tuple[T | None, LLMExchange]:
    """Ask ``chat`` for JSON matching ``schema`` and parse it from the raw answer. Never raises for
    HTTP errors, timeouts, connection failures or unparsable answers: returns ``(None, exchange)``.

    ``response_format``: ``auto`` sends a ``json_schema`` response format (a hint only: many servers
    ignore it) and, if the server refuses it with HTTP 400/422, asks again without one; ``json_schema``,
    ``json_object`` or ``none`` fix the mode. The answer is parsed from its text in every mode.
    """
    prompt = prompt_dicts(messages)
    exchange = LLMExchange(purpose=purpose, attempt=attempt, round=round, model=_model_name(chat), prompt=prompt)
    modes: list[ResponseFormatMode]
    if not _supports_response_format(chat):
        modes = ["none"]
    elif response_format == "auto":
        modes = ["json_schema", "none"]
    else:
        modes = [response_format]
    lc_messages = _to_messages(prompt)
    started = time.perf_counter()
    message: Any = None
    for i, mode in enumerate(modes):
        exchange.response_format = mode
        fmt = _response_format(mode, schema)
        try:
            message = chat.invoke(lc_messages, extra_body={"response_format": fmt}) if fmt else chat.invoke(lc_messages)
            break
        except Exception as exc:  # every client error becomes a recorded failure
            failure, status = _classify(exc)
            if failure == "http" and status in (400, 422) and i + 1 < len(modes):
                exchange.notes.append(f"server refused response_format={mode} (HTTP {status}); asked again without it")
                continue
            exchange.failure, exchange.http_status = failure, status
            exchange.errors.append(
                f"{failure} error from {exchange.model}: {type(exc).__name__}: {_short(str(exc), 240)}"
            )
            logger.warning("LLM %s request failed: %s", purpose, exchange.errors[-1])
            break
    exchange.latency_s = float(f"{time.perf_counter() - started:.4f}")
    if message is None:
        if exchange.failure is None:  # pragma: no cover - defensive
            exchange.failure = "error"
        return None, exchange
    exchange.raw_response = str(getattr(message, "text", "") or "")
    exchange.token_usage = _usage(message)
    value, parsed, errors, notes = parse_structured(exchange.raw_response, schema)
    exchange.parsed = parsed
    exchange.notes.extend(notes)
    if value is None:
        exchange.errors.extend(errors)
        exchange.failure = "parse" if parsed is None else "schema"
        logger.info("LLM %s answer did not parse as %s: %s", purpose, schema.__name__, "; ".join(errors[:3]))
        return None, exchange
    exchange.parsed = value.model_dump(mode="json")
    exchange.ok = True
    return value, exchange
