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
)
from callgrove.episode import Episode
from callgrove.formats.ranges import check_choice, check_range

Scope = Literal["seat", "episode"]


class _PooledBaseline(
    Algorithm, msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="name"
):
    """Splits the group's traces into pools and baselines each trace against its own pool."""

    scale_by_std: bool = False
    """Divide each pool's advantages by its reward std."""
    std_epsilon: float = 1e-6
    """Added to the std before dividing, so a pool of equal rewards gives 0.0."""

    def __post_init__(self) -> None:
        check_range("std_epsilon", self.std_epsilon, above=0)

    def pool_of(self, trace: Trace) -> Hashable:
        raise NotImplementedError

    def score_group(self, episodes: Sequence[Episode]) -> list[Credit]:
        pools: dict[Hashable, list[Trace]] = {}
        for episode in episodes:
            for trace in self.score_episode(episode):
                pools.setdefault(self.pool_of(trace), []).append(trace)
        return [
            credit
            for pool in pools.values()
            for credit in relative_credit(pool, self.scale_by_std, self.std_epsilon)
        ]


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
