"""A small builder for hand-made episodes: agents, calls that extend histories, fresh tokens."""

from __future__ import annotations

import itertools

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.episode.record import concat, segments


class EpisodeBuilder:
    """Calls get the next `seq` unless one is given; `fresh(n)` gives never-used token ids."""

    def __init__(self, episode_id: str = "ep"):
        self.episode_id = episode_id
        self.agents: list[Agent] = []
        self._seq = itertools.count(1)
        self._token = itertools.count(1000)

    def fresh(self, n: int = 3) -> list[int]:
        return [next(self._token) for _ in range(n)]

    def full_ids(self, call: Call) -> np.ndarray:
        """A call's prompt and completion, before the episode is made."""
        return concat(segments(call, {c.id: c for a in self.agents for c in a.calls}.get))

    def prompt_ids(self, call: Call) -> np.ndarray:
        return self.full_ids(call)[: call.prompt_len]

    def agent(
        self, agent_id: str, parent: str | None = None, start: str = "root", **extra
    ) -> Agent:
        agent = Agent(
            agent_id, extra.pop("name", agent_id.lower()), parent=parent, start=start, **extra
        )
        self.agents.append(agent)
        return agent

    def call(
        self,
        agent: Agent,
        history: Call | list[int] | None = None,
        new: list[int] | None = None,
        completion: list[int] | None = None,
        *,
        seq: int | None = None,
        call_id: str | None = None,
        **extra,
    ) -> Call:
        seq = next(self._seq) if seq is None else seq
        before = (
            self.full_ids(history).tolist() if isinstance(history, Call) else list(history or [])
        )
        prompt = before + (self.fresh() if new is None else new)
        completion = self.fresh(2) if completion is None else completion
        logprobs = [-0.5] * len(completion)
        call = Call.make(call_id or f"C{seq}", seq, prompt, completion, logprobs, **extra)
        return agent.add(call)

    def episode(self, **extra) -> Episode:
        return Episode(self.episode_id, agents=self.agents, **extra)


def ids(calls) -> list[str]:
    return [c.id for c in calls]
