"""Which ``response_format`` an OpenAI-compatible endpoint accepts, learned from its refusals.

Servers differ: OpenAI and vLLM accept ``json_schema``; llama-cpp-python's server refuses it with
``HTTP 500 … Input should be 'text' or 'json_object'``; others refuse ``json_object`` too, or answer
500 where 400 was meant. :func:`refuses_format` reads an error for that, :data:`LADDER` is the order
in which formats are tried (``json_schema`` → ``json_object`` → ``none``), and
:class:`ResponseFormatMemory` remembers per endpoint (base URL and model) the first format it
accepts, in memory or in a small JSON file, so that a run (and its resume) asks each endpoint only
once with a format it refuses.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tools.store.files import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_MEMORY_FILE",
    "LADDER",
    "ResponseFormatMemory",
    "ResponseFormatMode",
    "endpoint_key",
    "error_text",
    "ladder_from",
    "refuses_format",
]

ResponseFormatMode = Literal["auto", "json_schema", "json_object", "none"]
#: Formats from the most to the least specific; a refusal moves one step down.
LADDER: tuple[ResponseFormatMode, ...] = ("json_schema", "json_object", "none")
#: File name of a persisted memory (next to the exchange log of a run).
FORMAT_MEMORY_FILE = "response_format.json"

_MENTIONS = re.compile(r"response[_ ]?format|json[_ ]?schema|json[_ ]?object", re.IGNORECASE)


def ladder_from(mode: ResponseFormatMode) -> list[ResponseFormatMode]:
    """The formats to try starting at ``mode`` (``auto``: the whole ladder)."""
    if mode == "auto":
        return list(LADDER)
    return list(LADDER[LADDER.index(mode) :])


def error_text(exc: BaseException) -> str:
    """What a client error says: its message and, for an HTTP error, the server's body."""
    parts = [str(exc)]
    body = getattr(exc, "body", None)
    if body is not None:
        parts.append(json.dumps(body, default=str) if not isinstance(body, str) else body)
    return " ".join(parts)


def refuses_format(status: int | None, text: str) -> bool:
    """Whether an HTTP error (any 4xx/5xx) says the server does not accept the request's response format."""
    return status is not None and 400 <= status < 600 and bool(_MENTIONS.search(text))


def endpoint_key(base_url: str, model: str) -> str:
    """How an endpoint is remembered: its base URL (without a trailing slash) and the model name."""
    return f"{base_url.rstrip('/')} {model}"


class ResponseFormatMemory:
    """The first response format each endpoint accepts; kept in ``path`` (JSON) when one is given.

    An unreadable file is treated as empty (the formats are learned again); the file is written
    atomically after every change.
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = {}
            if self.path is not None and self.path.is_file():
                try:
                    data = json.loads(self.path.read_text(encoding="utf-8"))
                    endpoints = data.get("endpoints", {}) if isinstance(data, dict) else {}
                    self._entries = {
                        str(k): dict(v)
                        for k, v in endpoints.items()
                        if isinstance(v, dict) and v.get("response_format") in LADDER
                    }
                except (OSError, ValueError) as exc:
                    logger.warning("ignoring unreadable %s (%s): formats are learned again", self.path, exc)
        return self._entries

    def learned(self, key: str) -> ResponseFormatMode | None:
        """The format ``key`` was found to accept, if a refusal taught one."""
        with self._lock:
            mode = self._load().get(key, {}).get("response_format")
        return mode if mode in LADDER else None

    def reason(self, key: str) -> str | None:
        """Why ``key`` uses its learned format (the refusal that taught it), if any."""
        with self._lock:
            text = self._load().get(key, {}).get("reason")
        return str(text) if text else None

    def start(self, key: str, mode: ResponseFormatMode) -> list[ResponseFormatMode]:
        """The formats to try for ``key``: ``mode``'s ladder, starting lower where a refusal taught it."""
        if mode != "auto":
            return [mode]
        learned = self.learned(key)
        return ladder_from(learned) if learned is not None else list(LADDER)

    def learn(self, key: str, mode: ResponseFormatMode, reason: str) -> bool:
        """Remember that ``key`` is to be asked with ``mode`` (never moving back up); True if it changed."""
        if mode not in LADDER:
            return False
        with self._lock:
            entries = self._load()
            current = entries.get(key, {}).get("response_format")
            if current in LADDER and LADDER.index(current) >= LADDER.index(mode):
                return False
            entries[key] = {
                "response_format": mode,
                "reason": reason,
                "learned_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            if self.path is not None:
                try:
                    atomic_write_json(self.path, {"endpoints": entries})
                except OSError as exc:  # the run goes on; the format is remembered for this process
                    logger.warning("could not write %s: %s", self.path, exc)
        logger.info("LLM endpoint %s: %s", key, reason)
        return True
