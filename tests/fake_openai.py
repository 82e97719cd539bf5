"""A small OpenAI-compatible HTTP server for tests (stdlib only, 127.0.0.1, a random port).

It answers ``POST /v1/chat/completions`` from a script and ``GET /v1/models`` with one model. A script
is a list of replies consumed in order, or a callable ``(request_json) -> reply``. A reply is

* a ``str``: the assistant message content (a proper ``chat.completion`` with ``usage``);
* an ``int``: an HTTP status code, answered with an OpenAI-style error body;
* a :class:`Delay`: wait, then answer its own reply (to exceed a client timeout);
* a ``dict``: a complete JSON body, answered as is with status 200.

When a list script runs out, the server answers 500 ("script exhausted"). Every request is recorded.

    with FakeOpenAI(['{"pruning_recommendations": []}']) as server:
        chat = ChatOpenAI(base_url=server.base_url, api_key="x", model="fake")
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

logger = logging.getLogger(__name__)

__all__ = ["Delay", "FakeOpenAI", "RecordedRequest", "Reply", "Script", "fake_openai"]


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (or until the server stops), then answer ``reply``."""

    seconds: float
    reply: str | int | dict[str, Any] = "{}"


Reply = str | int | Delay | dict[str, Any]
Script = list[Reply] | Callable[[dict[str, Any]], Reply]


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None = None
    received_at: float = field(default_factory=time.monotonic)


def _count_tokens(text: str) -> int:
    return max(1, len(text.split()))


def completion_body(content: str, request: dict[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object answering ``request`` with ``content``."""
    prompt = " ".join(str(m.get("content", "")) for m in request.get("messages", []) if isinstance(m, dict))
    prompt_tokens, completion_tokens = _count_tokens(prompt), _count_tokens(content)
    return {
        "id": f"chatcmpl-fake-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(request.get("model", "fake-model")),
        "system_fingerprint": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeOpenAI:
    """Scripted OpenAI-compatible server in a background thread."""

    def __init__(self, script: Script | None = None, *, model: str = "fake-model", models_status: int = 200) -> None:
        self.script: Script = script if script is not None else []
        self.model = model
        self.models_status = models_status
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._served = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeOpenAI:
        handler = _make_handler(self)
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # --- script ---------------------------------------------------------------------------------

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the chat completion requests received, in order."""
        return [r.body or {} for r in self.requests if r.path.endswith("/chat/completions")]

    def _next_reply(self, body: dict[str, Any]) -> tuple[Reply, int]:
        with self._lock:
            index = self._served
            self._served += 1
            if callable(self.script):
                return self.script(body), index
            if not self.script:
                return {"__status__": 500, "message": "fake server script exhausted"}, index
            return self.script.pop(0), index

    def wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _make_handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "FakeOpenAI/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("fake openai: " + format, *args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                logger.debug("fake openai: client went away")

        def _error(self, status: int, message: str | None = None) -> None:
            text = message or f"fake server error {status}"
            kind = "server_error" if status >= 500 else "invalid_request_error"
            self._send(status, {"error": {"message": text, "type": kind, "param": None, "code": str(status)}})

        def _record(self, body: dict[str, Any] | None) -> None:
            with fake._lock:
                fake.requests.append(
                    RecordedRequest(method=self.command, path=self.path, headers=dict(self.headers), body=body)
                )

        def do_GET(self) -> None:
            self._record(None)
            if self.path.rstrip("/").endswith("/models"):
                if fake.models_status != 200:
                    self._error(fake.models_status)
                    return
                self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model", "owned_by": "test"}]})
                return
            self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._record(None)
                self._error(400, "body is not JSON")
                return
            self._record(body)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            reply, index = fake._next_reply(body)
            self._answer(reply, body, index)

        def _answer(self, reply: Reply, body: dict[str, Any], index: int) -> None:
            if isinstance(reply, Delay):
                fake.wait(reply.seconds)
                if fake._stopping.is_set():
                    return
                self._answer(reply.reply, body, index)
            elif isinstance(reply, bool):
                raise TypeError("a reply cannot be a bool")
            elif isinstance(reply, int):
                self._error(reply)
            elif isinstance(reply, str):
                self._send(200, completion_body(reply, body, index))
            elif "__status__" in reply:
                self._error(int(reply["__status__"]), str(reply.get("message", "")))
            else:
                self._send(200, reply)

    return Handler


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A started :class:`FakeOpenAI` with an empty script (set ``server.script`` in the test)."""
    with FakeOpenAI() as server:
        yield server
