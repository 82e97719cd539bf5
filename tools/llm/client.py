"""A domain-free client for OpenAI-compatible chat models: settings, the client, an endpoint check.

* :class:`LLMSettings` configures a ``langchain_openai.ChatOpenAI`` client for OpenAI or any
  OpenAI-compatible server (vLLM, llama.cpp, Ollama, LM Studio, ...). :meth:`LLMSettings.from_env`
  reads ``OPENAI_API_KEY``, ``PROFILING_AGENT_LLM_BASE_URL`` / ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE``
  and ``PROFILING_AGENT_LLM_MODEL``.
* :func:`make_chat_model` builds the client (``langchain_openai`` is imported only then: importing this
  module needs neither a key nor the network).
* :func:`check_endpoint` makes one cheap request and raises :class:`LLMUnavailableError` when the
  endpoint does not answer, so that a run fails at its start rather than in the middle.

Structured answers (JSON parsed from the raw text into a pydantic schema) are in :mod:`tools.llm.structured`.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, SecretStr

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "PLACEHOLDER_API_KEY",
    "LLMConfigError",
    "LLMSettings",
    "LLMUnavailableError",
    "check_endpoint",
    "make_chat_model",
    "shorten",
]

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_API_KEY = "not-needed"  # local OpenAI-compatible servers want a key but do not check it


class LLMConfigError(ValueError):
    """The LLM cannot be configured (no key and no base URL)."""


class LLMUnavailableError(ValueError):
    """The configured endpoint does not answer."""


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


def shorten(text: str, limit: int = 160) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with ``...``."""
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
            f"LLM endpoint {url} does not answer: {type(exc).__name__}: {shorten(str(exc))}"
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
            f"LLM endpoint {url} does not answer: {type(exc).__name__}: {shorten(str(exc))}"
        ) from None
    if not response.is_success:
        raise LLMUnavailableError(
            f"LLM endpoint {url} answered HTTP {response.status_code}: {shorten(response.text, 120)}"
        )
