"""callgrove: multi-agent LLM rollouts (subagents, forks, compactions) as exactly-once RL rows."""

__version__ = "0.1.0"
