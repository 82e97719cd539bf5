"""A run's LLM settings: the ``--llm-*`` options of its :class:`~agents.context.Context` over the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.llm.client import LLMSettings

if TYPE_CHECKING:
    from agents.context import Context

__all__ = ["llm_settings", "settings_from_options"]


def settings_from_options(
    model: str | None = None, base_url: str | None = None, timeout_s: float | None = None
) -> LLMSettings:
    """:meth:`LLMSettings.from_env` with the options that are given: empty or None ones leave the environment's.

    Raises ``LLMConfigError`` when there is neither an API key nor a base URL.
    """
    return LLMSettings.from_env(model=model or None, base_url=base_url or None, timeout_s=timeout_s)


def llm_settings(ctx: Context, *, timeout_s: float | None = None) -> LLMSettings:
    """The settings for ``ctx``'s chat model; ``timeout_s`` replaces ``ctx.llm_timeout`` when given."""
    return settings_from_options(ctx.llm_model, ctx.llm_base_url, ctx.llm_timeout if timeout_s is None else timeout_s)
