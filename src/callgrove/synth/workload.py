"""Synthetic multi-agent episodes of a chosen shape, seeded and reproducible.

A leader agent runs `leader_calls` calls; along the way it starts fresh subagents (their own
context), forks (whose first call resends the leader's exact history, so the forest makes them
its children; a fork may fork again, down to `fork_depth`), background agents (fresh context,
their answer never read back) and twins (a fresh subagent repeated token for token, the case of
duplicate rows). Every agent compacts `compactions` times: the compaction call continues its
history, the call after it starts again from the system prompt and the summary (a new root).

Histories grow from `system` prompt tokens to about `context` tokens within each stretch
between compactions. Prompts are held as references into the previous call plus what they add,
as read episodes hold them, so memory grows with the distinct tokens. The same `Shape` and seed
give the same episodes, token for token, on every machine (numpy's PCG64 stream).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import numpy as np

from callgrove.episode import LOGPROB_DTYPE, TOKEN_DTYPE, Agent, Call, Episode
from callgrove.errors import InvalidValue
from callgrove.formats.wire import WireEnv, WirePolicy, WireRun

VOCAB = 151_000  # token ids are drawn below this by default (a Qwen-sized vocabulary)


@dataclass(frozen=True)
class Shape:
    """What each synthetic episode looks like. Counts are per episode; lengths in tokens."""

    leader_calls: int = 16
    fresh: int = 2
    forks: int = 2
    fork_depth: int = 1
    background: int = 1
    twins: int = 1
    subagent_calls: int = 4
    compactions: int = 1
    context: int = 4096
    system: int = 0
    """First prompt of every agent; 0 means an eighth of `context`."""
    completion_share: float = 0.25
    """Of what each call adds to the history, the share the model samples."""
    group_size: int = 8
    """Episodes per group (GRPO scores within a group)."""
    vocab: int = VOCAB
    """Token ids are drawn from 1 to `vocab` - 1 (a small one fits a tiny test model)."""

    def __post_init__(self) -> None:
        if self.leader_calls < 1 or self.subagent_calls < 1:
            raise InvalidValue("every agent makes at least one call")
        if min(self.fresh, self.forks, self.background, self.twins, self.compactions) < 0:
            raise InvalidValue("agent and compaction counts cannot be negative")
        if self.twins > self.fresh:
            raise InvalidValue(f"twins ({self.twins}) repeat fresh subagents ({self.fresh})")
        if self.fork_depth < 1 and self.forks:
            raise InvalidValue("forks need a fork depth of at least 1")
        if self.context < 64:
            raise InvalidValue("context must be at least 64 tokens")
        if not 0 < self.completion_share < 1:
            raise InvalidValue("completion_share is a fraction between 0 and 1")
        if self.group_size < 1:
            raise InvalidValue("group_size must be at least 1")
        if self.vocab < 2:
            raise InvalidValue("vocab must hold at least one token id besides 0")

    @property
    def system_tokens(self) -> int:
        return self.system or self.context // 8

    @property
    def agents(self) -> int:
        """Agents per episode, the leader included."""
        return 1 + self.fresh + self.twins + self.background + self.forks * self.fork_depth

    @property
    def calls(self) -> int:
        """Calls per episode."""
        return self.leader_calls + (self.agents - 1) * self.subagent_calls


PRESETS: dict[str, Shape] = {
    "4k": Shape(context=4096),
    "16k": Shape(context=16_384),
}
"""The shapes the benchmark measures: 40 calls over 9 agents at 4k- and 16k-token contexts."""


@dataclass
class _Plan:
    """One agent being generated: its calls with their (fractional) time in the ledger."""

    agent: Agent
    times: list[float] = field(default_factory=list)


class _Generator:
    def __init__(self, shape: Shape, seed: int):
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.system = self._tokens(shape.system_tokens)
        self.plans: list[_Plan] = []
        # Every agent's history grows by the same step a call; the leader's reaches the context.
        stretch = -(-shape.leader_calls // (shape.compactions + 1))
        grow = max(2, (shape.context - shape.system_tokens) // stretch)
        self.completion = max(1, round(grow * shape.completion_share))
        self.added = max(1, grow - self.completion)

    def _tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(1, self.shape.vocab, size=n, dtype=TOKEN_DTYPE)

    def _jitter(self, n: int) -> int:
        return max(1, int(n * self.rng.uniform(0.75, 1.25)))

    def agent(
        self, agent: Agent, calls: int, begin: float, base: Call | None, forks_left: int
    ) -> _Plan:
        """Generate an agent's calls, starting at ledger time `begin`, its first prompt
        extending `base`'s full sequence (a fork) or starting afresh."""
        plan = _Plan(agent)
        self.plans.append(plan)
        stretches = np.array_split(np.arange(calls), self.shape.compactions + 1)
        fork_at = {calls // 2} if forks_left else set()
        previous, summary = base, None
        number = 0
        for stretch in stretches:
            if not len(stretch):
                continue
            for position, _ in enumerate(stretch):
                time = begin + number
                if previous is None:
                    opening = [self.system] if summary is None else [self.system, summary]
                    suffix = np.concatenate([*opening, self._tokens(self._jitter(self.added))])
                else:
                    suffix = self._tokens(self._jitter(self.added))
                last = position == len(stretch) - 1 and stretch[-1] != calls - 1
                call = self._call(agent, number, previous, suffix, last)
                plan.times.append(time)
                if number in fork_at:
                    self.fork(agent, call, time, forks_left - 1)
                number += 1
                previous = call
                if last:  # the compaction's summary opens the next stretch, a new root
                    previous, summary = None, call.completion_ids
        return plan

    def _call(
        self,
        agent: Agent,
        number: int,
        previous: Call | None,
        suffix: np.ndarray,
        compaction: bool,
    ) -> Call:
        sampled = self._jitter(self.completion)
        return agent.add(
            Call(
                id=f"{agent.id}.{number}",
                seq=0,  # numbered once every agent is placed in the ledger
                completion_ids=self._tokens(sampled),
                prompt_suffix=suffix,
                prompt_from=None if previous is None else previous.id,
                prompt_from_len=0 if previous is None else previous.full_len,
                logprobs=-self.rng.exponential(0.4, sampled).astype(LOGPROB_DTYPE),
                purpose="compaction" if compaction else "turn",
            )
        )

    def fork(self, parent: Agent, at: Call, time: float, forks_left: int) -> None:
        agent = Agent(f"{parent.id}f", "fork", parent=parent.id, start="fork")
        self.agent(agent, self.shape.subagent_calls, time + 0.5, at, forks_left)


def synth_episode(shape: Shape, seed: int, episode_id: str | None = None) -> Episode:
    """One episode of `shape`; the same seed gives the same episode."""
    gen = _Generator(shape, seed)
    leader = Agent("L", "leader")
    gen.agent(leader, shape.leader_calls, 0.0, None, 0)
    starts = np.linspace(
        0, shape.leader_calls - 1, shape.fresh + shape.background + shape.forks + 2
    )
    spawn = iter(starts[1:-1])
    leader_calls = leader.calls
    for number in range(shape.fresh):
        at = next(spawn)
        fresh = gen.agent(
            Agent(f"S{number}", "explore", parent="L", start="fresh"),
            shape.subagent_calls,
            at + 0.25,
            None,
            0,
        )
        if number < shape.twins:
            gen.plans.append(_twin(fresh, f"T{number}", shift=0.125))
    for number in range(shape.background):
        at = next(spawn)
        gen.agent(
            Agent(f"B{number}", "background", parent="L", start="background"),
            shape.subagent_calls,
            at + 0.25,
            None,
            0,
        )
    for number in range(shape.forks):
        at = int(next(spawn))
        if leader_calls[at].purpose == "compaction":  # fork from a turn, not from a summary
            at = max(at - 1, 0)
        agent = Agent(f"F{number}", "fork", parent="L", start="fork")
        gen.agent(agent, shape.subagent_calls, at + 0.5, leader_calls[at], shape.fork_depth - 1)
    _number_calls(gen.plans)
    rng = gen.rng
    group = seed // shape.group_size
    start = int(rng.integers(0, 3))
    for plan in gen.plans:
        for call in plan.agent.calls:
            call.policy_version = start + int(rng.integers(0, 2))
    return Episode(
        id=episode_id or f"synth-{seed}",
        agents=[plan.agent for plan in gen.plans],
        group=f"group-{group}",
        env=WireEnv(id="synth", name="synthetic"),
        task={"seed": seed},
        run=WireRun(
            id="synth", type="train", step=start + 2, policy=WirePolicy(start=start, end=start + 1)
        ),
        rewards={"score": float(rng.random())},
    )


def _twin(plan: _Plan, agent_id: str, shift: float) -> _Plan:
    """A copy of a fresh subagent, token for token (the same task, the same answers)."""
    source = plan.agent
    twin = Agent(agent_id, source.name, parent=source.parent, start=source.start)
    copies: dict[str, Call] = {}  # by the source call's id
    for call in source.calls:
        base = None if call.prompt_from is None else copies[call.prompt_from].id
        copy = msgspec.structs.replace(
            call, id=f"{agent_id}{call.id[len(source.id) :]}", prompt_from=base
        )
        copies[call.id] = twin.add(copy)
    return _Plan(twin, [t + shift for t in plan.times])


def _number_calls(plans: list[_Plan]) -> None:
    """Ledger order: every call by its time, from seq 1."""
    timed = sorted(
        (
            (time, index, call)
            for index, plan in enumerate(plans)
            for time, call in zip(plan.times, plan.agent.calls, strict=True)
        ),
        key=lambda item: (item[0], item[1]),
    )
    for seq, (_time, _index, call) in enumerate(timed, start=1):
        call.seq = seq


def synth_episodes(shape: Shape, episodes: int, seed: int = 0) -> Iterator[Episode]:
    """`episodes` episodes of `shape`, episode i from seed `seed + i`."""
    for index in range(episodes):
        yield synth_episode(shape, seed + index)


def call_tokens(episode: Episode) -> int:
    """Tokens the policy processed for the episode: every kept call's prompt and completion."""
    return sum(call.full_len for call in episode.calls() if call.kept)
