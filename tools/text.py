"""Small text helpers shared by every stage: one-line error messages, name previews, file-name slugs."""

from __future__ import annotations

from collections.abc import Sequence


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when the message is empty."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def preview(names: Sequence[object], limit: int = 4, *, quote: bool = False) -> str:
    """``a, b, c, ... (12 in all)``: the first ``limit`` names of a long list."""
    shown = ", ".join(repr(str(n)) if quote else str(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def listing(names: Sequence[object], limit: int = 4, *, quote: bool = False) -> str:
    """``a, b, c and 9 more``: the first ``limit`` names of a list and how many it leaves out."""
    shown = ", ".join(repr(str(n)) if quote else str(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def slug(name: str, default: str = "model") -> str:
    """A file-name-safe form of a model spec or name: letters, digits and ``-_.``; others become ``-``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name.strip("/")).strip("-.") or default
