"""Credit: algorithms score a group's episodes and write advantages onto their calls."""

from callgrove.credit.algorithm import (
    Advantage,
    Algorithm,
    Credit,
    GroupCredit,
    Trace,
    agent_reward,
    episode_trace,
    finalize_group,
    relative_credit,
    seat_traces,
    shares_episode_reward,
)
from callgrove.credit.ema import EMABaseline
from callgrove.credit.grpo import GRPO, HierarchicalGRPO, Scope

BuiltinAlgorithm = GRPO | HierarchicalGRPO | EMABaseline
"""The algorithms a config names (`[algorithm] name = ...`): each is its own settings struct."""
ALGORITHMS: dict[str, type[GRPO | HierarchicalGRPO | EMABaseline]] = {
    kind.__struct_config__.tag: kind for kind in (GRPO, HierarchicalGRPO, EMABaseline)
}

__all__ = [
    "ALGORITHMS",
    "GRPO",
    "Advantage",
    "Algorithm",
    "BuiltinAlgorithm",
    "Credit",
    "EMABaseline",
    "GroupCredit",
    "HierarchicalGRPO",
    "Scope",
    "Trace",
    "agent_reward",
    "episode_trace",
    "finalize_group",
    "relative_credit",
    "seat_traces",
    "shares_episode_reward",
]
