"""The RL loop: environments whose agents record themselves, a dispatcher, the training step,
sinks and monitors, configured from one TOML file (`callgrove train CONFIG`)."""

from callgrove.orchestrator.env import (
    AgentHandle,
    Background,
    Environment,
    EpisodeRun,
    PolicyCallError,
    run_episode,
    sample_episode,
)

__all__ = [
    "AgentHandle",
    "Background",
    "Environment",
    "EpisodeRun",
    "PolicyCallError",
    "run_episode",
    "sample_episode",
]
