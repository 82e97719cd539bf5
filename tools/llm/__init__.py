"""A domain-free client for OpenAI-compatible chat models: settings and endpoint check, structured output."""
