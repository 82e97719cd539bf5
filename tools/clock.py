"""Where a run's time goes: each kind of work adds its seconds to the ledger of the node running it.

``with work("distil"):`` around a stretch of work counts its seconds as distillation; work inside other work counts
to the inner kind only, so the kinds add up to no more than the node's time. ``with ledger() as spent:`` opens the
ledger a node's work adds to (the graph opens one per node); outside one, ``work`` counts nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, ParamSpec, TypeVar, get_args

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["WORK_KINDS", "WorkKind", "counts_as", "ledger", "work"]

#: The kinds of work a run's time is counted in (:data:`WorkKind`); what no kind covers is the node's own.
WorkKind = Literal["profile", "evaluate", "prune", "distil", "build", "time"]
WORK_KINDS: tuple[WorkKind, ...] = get_args(WorkKind)


@dataclass
class _Frame:
    kind: str
    since: float


class _Ledger:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack: list[_Frame] = []  # the innermost work runs, the outer ones wait

    def add(self, kind: str, seconds: float) -> None:
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds


_current: ContextVar[_Ledger | None] = ContextVar("profiling_agent_ledger", default=None)


@contextmanager
def ledger() -> Iterator[dict[str, float]]:
    """A fresh ledger for the work inside: the dict it yields holds seconds by kind once the block ends."""
    book = _Ledger()
    token = _current.set(book)
    try:
        yield book.seconds
    finally:
        _current.reset(token)


@contextmanager
def work(kind: WorkKind) -> Iterator[None]:
    """Count the seconds inside as ``kind`` in the open ledger (the time of work nested inside goes to its kind)."""
    book = _current.get()
    if book is None:
        yield
        return
    now = time.perf_counter()
    if book.stack:
        outer = book.stack[-1]
        book.add(outer.kind, now - outer.since)
    book.stack.append(_Frame(kind, now))
    try:
        yield
    finally:
        now = time.perf_counter()
        book.add(kind, now - book.stack.pop().since)
        if book.stack:
            book.stack[-1].since = now


def counts_as(kind: WorkKind) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A decorator: every call of the function counts as ``kind`` of work (:func:`work`)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            with work(kind):
                return function(*args, **kwargs)

        return counted

    return decorate
