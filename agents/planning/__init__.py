"""Planning: planner protocol and registry, rules and LLM planners, prompts, validation, selection policy."""
