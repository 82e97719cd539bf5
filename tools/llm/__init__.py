"""A domain-free client for OpenAI-compatible chat models: settings and endpoint check, structured output,
the response format each endpoint accepts (learned from its refusals), and prompt sizes against a budget."""
