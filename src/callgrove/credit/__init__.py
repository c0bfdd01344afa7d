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
)
from callgrove.credit.ema import EMABaseline
from callgrove.credit.grpo import GRPO, HierarchicalGRPO, Scope

__all__ = [
    "GRPO",
    "Advantage",
    "Algorithm",
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
]
