"""Group-relative credit: GRPO and its hierarchical form for seats that repeat within an episode."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal, get_args

import msgspec

from callgrove.credit.algorithm import (
    Algorithm,
    Credit,
    Trace,
    episode_trace,
    relative_credit,
    seat_traces,
    shares_episode_reward,
)
from callgrove.episode import Episode
from callgrove.formats.ranges import check_choice, check_range

Scope = Literal["seat", "episode"]
SharedRewardCredit = Literal["pool", "leave_one_out", "seat_normalised"]


class _PooledBaseline(
    Algorithm, msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="name"
):
    """Splits the group's traces into pools and baselines each trace against its own pool."""

    scale_by_std: bool = False
    """Divide each pool's advantages by its reward std."""
    std_epsilon: float = 1e-6
    """Added to the std before dividing, so a pool of equal rewards gives 0.0."""
    shared_reward_credit: str = "pool"  # a `SharedRewardCredit`, checked below
    """How a subagent scored by the episode's reward is credited (a seat's trace whose agent is
    not the leader and has no rewards of its own: `shares_episode_reward`). `pool`: as every
    other trace, against its own pool. `leave_one_out`: against the mean of its pool's other
    traces, apart from traces that have rewards of their own (a pool of one gets 0.0).
    `seat_normalised`: against the same seat's such traces across the group (a local seat's
    too), divided by their reward std whatever `scale_by_std` says."""
    shared_reward_scale: float = 1.0
    """The coefficient on such a trace's advantage: 1 credits it like any seat; 0 trains its
    calls with advantage 0.0, so the leader's calls carry the only policy gradient, as under
    `[rows] scheme = "leader_only"`, while every call stays in the rows. A call left without
    an advantage keeps none whatever the coefficient."""

    def __post_init__(self) -> None:
        check_range("std_epsilon", self.std_epsilon, above=0)
        check_choice(
            "shared_reward_credit", self.shared_reward_credit, get_args(SharedRewardCredit)
        )
        check_range("shared_reward_scale", self.shared_reward_scale, at_least=0)

    def pool_of(self, trace: Trace) -> Hashable:
        raise NotImplementedError

    def score_group(self, episodes: Sequence[Episode]) -> list[Credit]:
        pools: dict[tuple[str, Hashable], list[Trace]] = {}
        for episode in episodes:
            for trace in self.score_episode(episode):
                pools.setdefault(self._credited_in(trace), []).append(trace)
        credits = []
        for (rule, _), pool in pools.items():
            credits += relative_credit(
                pool,
                self.scale_by_std or rule == "seat_normalised",
                self.std_epsilon,
                leave_one_out=rule == "leave_one_out",
            )
        if self.shared_reward_scale == 1.0:
            return credits
        return [
            Credit(c.trace, c.baseline, c.advantage * self.shared_reward_scale)
            if shares_episode_reward(c.trace)
            else c
            for c in credits
        ]

    def _credited_in(self, trace: Trace) -> tuple[str, Hashable]:
        """The rule a trace is credited by and the pool it is compared within."""
        if self.shared_reward_credit == "pool" or not shares_episode_reward(trace):
            return "pool", self.pool_of(trace)
        if self.shared_reward_credit == "seat_normalised":
            return "seat_normalised", trace.seat
        return "leave_one_out", self.pool_of(trace)


class GRPO(_PooledBaseline, tag="grpo"):
    """Advantage = reward minus the group mean (divided by the group std if `scale_by_std`).

    `scope="seat"`: every trainable agent is a trace rewarded by `agent_reward` (its own
    `rewards` if it has them, else the episode reward) and is compared with the traces of the
    same seat (agent name) across the group's completed episodes. `scope="episode"`: each
    completed episode is one trace at the episode reward, compared with the other episodes,
    and all its trainable agents' calls share that advantage.
    """

    scope: str = "seat"  # a `Scope`, checked below so the error lists the choices
    """`seat`: a trace per trainable agent, baselined within its seat; `episode`: one trace per
    episode."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scope", self.scope, get_args(Scope))  # a constructor does not check types

    def score_episode(self, episode: Episode) -> list[Trace]:
        return seat_traces(episode) if self.scope == "seat" else episode_trace(episode)

    def pool_of(self, trace: Trace) -> Hashable:
        return trace.seat


class HierarchicalGRPO(_PooledBaseline, tag="hierarchical_grpo"):
    """GRPO where some seats are compared within their own episode.

    A trace whose seat is in `local_seats` (say the several solvers one proposer spawned) is
    baselined against the traces of the same seat in the same episode, keyed by the episode id;
    every other seat (the proposer) is baselined across the group as in per-seat GRPO. Rewards
    follow `agent_reward`, so a solver's own `rewards` score it and a proposer without its own
    takes the episode reward. A local seat with one trace in its episode gets advantage 0.0.
    """

    local_seats: frozenset[str] = frozenset()
    """Seats baselined within their own episode (the others across the group)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.local_seats = frozenset(self.local_seats)

    def pool_of(self, trace: Trace) -> Hashable:
        if trace.seat in self.local_seats:
            return (trace.episode.id, trace.seat)
        return (None, trace.seat)
