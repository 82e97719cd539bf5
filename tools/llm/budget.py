"""Prompt sizes against a context budget: a token estimate and the choice of the longest prompt that fits.

Local models often have 4k–8k token context windows, and their tokenizers are not at hand (nor is
tiktoken's vocabulary without the network), so tokens are estimated from characters:
:data:`CHARS_PER_TOKEN` is on the safe side for English prose mixed with numbers and regular
expressions, which tokenize more densely than prose. :func:`fit_messages` builds a prompt at
decreasing levels of detail until one fits the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_CONTEXT_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "MIN_CONTEXT_TOKENS",
    "FittedMessages",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "fit_messages",
]

#: Characters per token of the estimate (English text is about 4; digits and regexes pack fewer).
CHARS_PER_TOKEN = 3.5
#: Tokens a chat template adds around each message (role markers, separators).
MESSAGE_OVERHEAD_TOKENS = 4
#: Default prompt budget: an 8k-token local model, leaving about 2k tokens for the answer.
DEFAULT_CONTEXT_TOKENS = 6000
#: The smallest budget accepted: below it not even the shortest planning prompt fits.
MIN_CONTEXT_TOKENS = 2000

L = TypeVar("L")


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text`` (characters / :data:`CHARS_PER_TOKEN`, rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_prompt_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """Estimated tokens of chat messages, with :data:`MESSAGE_OVERHEAD_TOKENS` for each."""
    return sum(estimate_tokens(str(m.get("content", ""))) + MESSAGE_OVERHEAD_TOKENS for m in messages)


@dataclass(frozen=True)
class FittedMessages(Generic[L]):
    """The prompt chosen for a budget, with its level of detail and the estimates behind the choice."""

    messages: list[dict[str, str]]
    level: L
    shortened: bool
    tokens: int
    full_tokens: int
    budget_tokens: int

    @property
    def over_budget(self) -> bool:
        return self.tokens > self.budget_tokens


def fit_messages(
    levels: Sequence[L],
    build: Callable[[L], list[dict[str, str]]],
    budget_tokens: int,
    reserved_tokens: int = 0,
) -> FittedMessages[L]:
    """The first of ``levels`` (most detailed first) whose prompt fits ``budget_tokens`` less ``reserved_tokens``
    (e.g. follow-up messages sent after it); the last level when none fits (``over_budget`` then says so).

    ``tokens`` and ``full_tokens`` include the reserved tokens, so they compare with ``budget_tokens``.
    """
    if not levels:
        raise ValueError("fit_messages needs at least one level")
    full_tokens = 0
    for i, level in enumerate(levels):
        messages = build(level)
        tokens = estimate_prompt_tokens(messages) + reserved_tokens
        if i == 0:
            full_tokens = tokens
        if tokens <= budget_tokens or i == len(levels) - 1:
            return FittedMessages(messages, level, i > 0, tokens, full_tokens, budget_tokens)
    raise AssertionError("unreachable")  # pragma: no cover
