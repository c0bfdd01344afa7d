"""What a stream of episodes holds, tallied one episode at a time.

Episodes, agents by name (seat), calls, tokens, errors by type, the ok rate and how far
off-policy the episodes are. Memory does not grow with the stream: `Stats.add` keeps counts
only. An episode with no agents (cancelled, or failed before the env ran) is counted under
errors and never appears in the per-agent tallies.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from callgrove.episode.record import Episode
from callgrove.episode.staleness import off_policy_steps


@dataclass
class AgentTally:
    """Totals over every agent of one name (one seat)."""

    agents: int = 0
    trainable: int = 0
    calls: int = 0
    kept_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0


@dataclass
class Spread:
    """Episodes by how many weight updates they missed (`off_policy_steps`)."""

    by_total: Counter[int] = field(default_factory=Counter)
    in_flight: Counter[int] = field(default_factory=Counter)
    in_queue: Counter[int] = field(default_factory=Counter)
    frozen: int = 0
    unknown_step: int = 0


@dataclass
class Stats:
    """Running totals; `add` one episode at a time."""

    episodes: int = 0
    ok: int = 0
    without_agents: int = 0
    with_errors: int = 0
    calls: int = 0
    kept_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stored_tokens: int = 0
    # A mixture of experts' routes as held (each call's own, `routes_from` on): their bytes,
    # and the distinct stored tokens of the calls that hold them
    route_bytes: int = 0
    routed_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    agents: dict[str, AgentTally] = field(default_factory=dict)
    run_types: Counter[str] = field(default_factory=Counter)
    spread: Spread = field(default_factory=Spread)

    def add(self, episode: Episode, training_step: int | None = None) -> None:
        """Tally one episode; `training_step` defaults to the step it was dispatched at."""
        self.episodes += 1
        self.ok += episode.ok
        self.errors.update(error.type for error in episode.errors)
        self.with_errors += bool(episode.errors) or not episode.ok
        if not episode.agents:
            self.without_agents += 1
        names = {agent.id: agent.name for agent in episode.agents}
        for error in episode.errors:
            if isinstance(error.agent, str) and error.agent in names:
                self._seat(names[error.agent]).errors += 1
        for agent in episode.agents:
            tally = self._seat(agent.name)
            tally.agents += 1
            tally.trainable += agent.trainable
            for call in agent.calls:
                prompt, completion = call.prompt_len, len(call.completion_ids)
                tally.calls += 1
                tally.kept_calls += call.kept
                tally.prompt_tokens += prompt
                tally.completion_tokens += completion
                self.calls += 1
                self.kept_calls += call.kept
                self.prompt_tokens += prompt
                self.completion_tokens += completion
                self.stored_tokens += len(call.prompt_suffix) + completion
                if call.routes is not None:
                    self.route_bytes += call.routes.nbytes
                    self.routed_tokens += len(call.prompt_suffix) + completion
        self._add_staleness(episode, training_step)

    @property
    def route_bytes_per_token(self) -> float:
        """Bytes of routes held per distinct stored token of the calls holding them."""
        return self.route_bytes / self.routed_tokens if self.routed_tokens else math.nan

    def _seat(self, name: str) -> AgentTally:
        return self.agents.setdefault(name, AgentTally())

    def _add_staleness(self, episode: Episode, training_step: int | None) -> None:
        run = episode.run
        self.run_types[run.type if run is not None else "none"] += 1
        if run is None or run.policy is None:
            self.spread.frozen += 1
            return
        step = training_step if training_step is not None else run.step
        if step is None:
            self.spread.unknown_step += 1
            return
        steps = off_policy_steps(episode, step)
        self.spread.by_total[steps.total] += 1
        self.spread.in_flight[steps.in_flight] += 1
        self.spread.in_queue[steps.in_queue] += 1
