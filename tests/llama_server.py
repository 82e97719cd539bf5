"""A real OpenAI-compatible server for tests: llama-cpp-python's, on 127.0.0.1, with a tiny model made here.

llama-cpp-python's server validates requests itself: it refuses ``response_format`` ``json_schema`` with
``HTTP 500 … Input should be 'text' or 'json_object'`` and constrains ``json_object`` answers with a JSON
grammar, which is what the client must cope with. No model can be downloaded, so :func:`write_tiny_gguf`
writes one with the ``gguf`` package: a one-layer llama with a byte-level SentencePiece vocabulary whose
weights are set, not trained, so that it answers every prompt with ``{}`` and stops (the attention and
feed-forward outputs are zero, so the next token depends on the last one only: anything → ``{``, ``{`` →
``}``, ``}`` → end of text). The answer is valid JSON and never a valid plan.

Needs the optional ``llm-server`` extra (``pip install -e ".[llm-server]"``); :func:`llama_server` skips
the test that asks for it when the extra is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

logger = logging.getLogger(__name__)

__all__ = ["LlamaCppServer", "llama_server", "server_available", "write_tiny_gguf"]

MODEL_ALIAS = "tiny-llama"
N_EMBD, N_FF, N_HEAD = 16, 32, 2
#: Server context window in tokens; byte-level tokens, so about one per character of the prompt.
N_CTX = 16384
STARTUP_S = 90.0


def server_available() -> bool:
    """Whether llama-cpp-python's server and the gguf writer are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "gguf", "fastapi", "uvicorn"))


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types): unknown, BOS, EOS, the 256 byte tokens, then the printable ASCII characters."""
    import gguf

    types = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    kinds = [types.UNKNOWN, types.CONTROL, types.CONTROL] + [types.BYTE] * 256
    for code in range(0x20, 0x7F):
        tokens.append("\u2581" if code == 0x20 else chr(code))  # SentencePiece writes a space as U+2581
        kinds.append(types.NORMAL)
    return tokens, [0.0] * len(tokens), [int(k) for k in kinds]


def write_tiny_gguf(path: Path) -> Path:
    """A one-layer llama (F32, ~10k weights) that answers ``{}`` to anything; see the module docstring."""
    import gguf

    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    open_, close, eos = tokens.index("{"), tokens.index("}"), 2
    embd = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    embd[:, 0] = 1.0  # every token: a preference for "{"
    embd[open_, 1] = 1.0  # after "{": "}"
    embd[close, 2] = 1.0  # after "}": end of text
    out = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    out[open_, 0], out[close, 1], out[eos, 2] = 5.0, 10.0, 10.0

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    rng = np.random.default_rng(0)
    square = (N_EMBD, N_EMBD)
    tensors = {
        "token_embd.weight": embd,
        "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "output.weight": out,
        "blk.0.attn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "blk.0.attn_q.weight": rng.normal(0, 0.02, square).astype(np.float32),
        "blk.0.attn_k.weight": rng.normal(0, 0.02, square).astype(np.float32),
        "blk.0.attn_v.weight": rng.normal(0, 0.02, square).astype(np.float32),
        "blk.0.attn_output.weight": np.zeros(square, dtype=np.float32),
        "blk.0.ffn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "blk.0.ffn_gate.weight": rng.normal(0, 0.02, (N_FF, N_EMBD)).astype(np.float32),
        "blk.0.ffn_up.weight": rng.normal(0, 0.02, (N_FF, N_EMBD)).astype(np.float32),
        "blk.0.ffn_down.weight": np.zeros((N_EMBD, N_FF), dtype=np.float32),
    }
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaCppServer:
    """``python -m llama_cpp.server`` on 127.0.0.1 in a child process, with its output in ``log_path``."""

    def __init__(self, model_path: Path, log_path: Path, *, n_ctx: int = N_CTX) -> None:
        self.model_path = model_path
        self.log_path = log_path
        self.n_ctx = n_ctx
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaCppServer:
        argv = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model_path),
            "--model_alias",
            MODEL_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            "--logits_all",
            "false",
        ]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self._process.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=2).is_success:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server did not answer within {STARTUP_S:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        return text[-chars:]

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None


@contextlib.contextmanager
def llama_server(folder: Path) -> Iterator[LlamaCppServer]:
    """A started :class:`LlamaCppServer` with the tiny model written to ``folder``; the calling test is skipped
    when the ``llm-server`` extra is not installed."""
    if not server_available():
        pytest.skip('llama-cpp-python\'s server is not installed (pip install -e ".[llm-server]")')
    server = LlamaCppServer(write_tiny_gguf(folder / "tiny.gguf"), folder / "server.log").start()
    try:
        yield server
    finally:
        server.stop()
