"""Algorithms score a group's episodes; `finalize_group` writes the resulting credit onto calls.

The unit that receives one advantage is a `Trace`: the kept calls of one agent of an episode (a
seat's trace), or of all the trainable agents of an episode when the episode is scored as a
whole. An algorithm turns the group's traces into `Credit` (a baseline and an advantage per
trace); `finalize_group` lays the resulting values out per episode, one slot per call in ledger
order (`Call.index`): the trace's value on the calls it credits, `None` on everything else, and
only once the whole group is checked writes each episode's array onto its calls
(`Episode.set_advantages`). `None` means "no advantage" and is never the same thing as an
assigned 0.0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.errors import InvalidValue

Advantage = float | np.ndarray


def agent_reward(episode: Episode, agent: Agent) -> float:
    """The reward of one agent's trace.

    The sum of the agent's own `rewards` when it has them (an empty dict counts as present and
    sums to 0.0), else the episode reward. This is the rule docs/episode-format.md (rows, reward) applies to a row whose leaf
    belongs to the agent, so a seat's trace is judged by the same number its rows carry.

    Credit follows the call's own agent, not the row: a call trained in a row whose leaf is
    another agent's (a leader call that only a fork's leaf continues) gets its own agent's
    advantage, while that row's `reward` is the leaf agent's.
    """
    return episode.reward_of(agent)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """What one advantage is given to: the kept calls of `agents` in `episode`.

    `seat` is the agents' name (`leader`, `solver`, ...) for a seat's trace, None when the trace
    is the whole episode.
    """

    episode: Episode
    agents: tuple[Agent, ...]
    seat: str | None
    reward: float

    def __repr__(self) -> str:
        agents = [agent.id for agent in self.agents]
        where = f"episode={self.episode.id!r}, agents={agents}"
        return f"Trace({where}, seat={self.seat!r}, reward={self.reward})"

    def calls(self) -> Iterator[Call]:
        for agent in self.agents:
            yield from (call for call in agent.calls if call.kept)


@dataclass(frozen=True, slots=True, eq=False)
class Credit:
    """A trace's advantage and the baseline it was measured against."""

    trace: Trace
    baseline: float
    advantage: float


def shares_episode_reward(trace: Trace) -> bool:
    """Whether `trace` is a subagent's scored by the episode's reward: one agent's trace, the
    agent not the leader (started as `root`) and without rewards of its own. Its reward is then
    the outcome of every seat's work, not of its own calls alone."""
    return (
        trace.seat is not None
        and len(trace.agents) == 1
        and trace.agents[0].start != "root"
        and trace.agents[0].rewards is None
    )


def seat_traces(episode: Episode) -> list[Trace]:
    """One trace per trainable agent of a completed episode, rewarded by `agent_reward`."""
    if not episode.ok:
        return []
    return [
        Trace(episode, (agent,), agent.name, agent_reward(episode, agent))
        for agent in episode.agents
        if agent.trainable
    ]


def episode_trace(episode: Episode) -> list[Trace]:
    """The completed episode as one trace of all its trainable agents, at the episode reward.

    Agents' own `rewards` are not consulted: scoring per episode means the episode is the unit.
    """
    trainable = tuple(agent for agent in episode.agents if agent.trainable)
    if not episode.ok or not trainable:
        return []
    return [Trace(episode, trainable, None, episode.reward)]


class Algorithm:
    """Turns a group of episodes into credit on their calls.

    `score_episode` says which traces of one episode take part and what each earned;
    `score_group` compares them (within an episode, across the group, or against state the
    algorithm keeps) and returns their `Credit`; `call_advantages` spreads a trace's advantage
    over its calls (the same scalar on each by default; override it for per-token values).
    Errored episodes (`ok` false) and untrainable agents take no part: `finalize_group`
    refuses credit for them.
    """

    __slots__ = ()  # the built-in algorithms are msgspec structs: their settings are the config

    def score_episode(self, episode: Episode) -> list[Trace]:
        return seat_traces(episode)

    def score_group(self, episodes: Sequence[Episode]) -> list[Credit]:
        raise NotImplementedError(f"{type(self).__name__} must define score_group")

    def state_dict(self) -> dict[str, Any]:
        """What the algorithm learnt from earlier groups (plain data, for a checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict`."""
        if state:
            raise InvalidValue(f"{type(self).__name__} keeps no state, got {sorted(state)}")

    def call_advantages(self, credit: Credit) -> Iterator[tuple[Call, Advantage]]:
        for call in credit.trace.calls():
            yield call, credit.advantage


@dataclass
class GroupCredit:
    """What `finalize_group` did: the credit given, how many calls got none and why, and per
    episode of the group (in the order given) every call's advantage in ledger order."""

    credits: list[Credit]
    assigned_calls: int = 0
    unassigned_calls: Counter[str] = field(default_factory=Counter)
    advantages: list[list[Advantage | None]] = field(default_factory=list)

    def __repr__(self) -> str:
        # The advantages of every call are thousands of numbers: a summary reads better.
        reasons = ", ".join(f"{why} {n}" for why, n in self.unassigned_calls.most_common())
        return (
            f"GroupCredit({len(self.credits)} credits over {len(self.advantages)} episodes, "
            f"{self.assigned_calls} calls assigned, {sum(self.unassigned_calls.values())} "
            f"unassigned{f' ({reasons})' if reasons else ''})"
        )


def finalize_group(algorithm: Algorithm, episodes: Sequence[Episode]) -> GroupCredit:
    """Run `algorithm` on one group and set `advantages` on every call of its episodes.

    A call ends with exactly what this run gave it: a float or an array per completion token
    where credited, `None` elsewhere (errored episodes, untrainable agents, calls not kept,
    traces the algorithm left out). Nothing is written until the whole group's credit is
    checked, so a refused group leaves every call as it was. Supervised episodes (imported
    transcripts) are refused rather than given zeros.
    """
    _check_group(episodes)
    ledgers = [episode.ledger() for episode in episodes]
    report = GroupCredit(algorithm.score_group(episodes))
    report.advantages = [[None] * len(ledger) for ledger in ledgers]
    for credit in report.credits:
        member = _member(credit.trace, episodes)
        episode, ledger, values = episodes[member], ledgers[member], report.advantages[member]
        for call, value in algorithm.call_advantages(credit):
            if not (0 <= call.index < len(ledger) and ledger[call.index] is call):
                raise InvalidValue(f"episode {episode.id}: call {call.id} is not one of its calls")
            if values[call.index] is not None:
                raise InvalidValue(f"episode {episode.id}: call {call.id} was credited twice")
            values[call.index] = _checked_value(value, episode, call)
            report.assigned_calls += 1
    for episode, ledger, values in zip(episodes, ledgers, report.advantages, strict=True):
        episode.set_advantages(values)
        for call, value in zip(ledger, values, strict=True):
            if value is None:
                report.unassigned_calls[_why_unassigned(episode, call)] += 1
    return report


def _check_group(episodes: Sequence[Episode]) -> None:
    groups = {episode.group for episode in episodes}
    if len(groups) > 1:
        names = ", ".join(sorted(str(g) for g in groups))
        raise InvalidValue(f"finalize_group got episodes of several groups: {names}")
    seen: set[str] = set()
    for episode in episodes:
        if episode.supervised:
            raise InvalidValue(
                f"episode {episode.id!r} is for supervised training (objective: supervised, no "
                "sampling logprobs): it takes no advantages; train it with objective sft"
            )
        if episode.id in seen:
            # Baselines are keyed by episode id, so two episodes sharing one would be merged.
            raise InvalidValue(
                f"episode id {episode.id!r} appears twice in group {episode.group!r}"
            )
        seen.add(episode.id)


def _member(trace: Trace, episodes: Sequence[Episode]) -> int:
    """The trace's episode's place in the group, once it may take credit."""
    episode = trace.episode
    member = next((i for i, e in enumerate(episodes) if e is episode), -1)
    if member < 0:
        raise InvalidValue(f"credit for episode {episode.id}, which is not in the group")
    if not episode.ok:
        raise InvalidValue(f"episode {episode.id} did not complete (ok false); it takes no credit")
    for agent in trace.agents:
        if not agent.trainable:
            raise InvalidValue(
                f"episode {episode.id}: agent {agent.id} is not trainable; it takes no credit"
            )
    return member


def _checked_value(value: Advantage, episode: Episode, call: Call) -> Advantage:
    if isinstance(value, np.ndarray):
        array = np.asarray(value, dtype=np.float64)
        if array.shape != call.completion_ids.shape:
            raise InvalidValue(
                f"episode {episode.id}, call {call.id}: {array.size} advantages for "
                f"{call.completion_ids.size} completion tokens"
            )
        if not np.all(np.isfinite(array)):
            raise InvalidValue(f"episode {episode.id}, call {call.id}: advantage is not finite")
        return array
    number = float(value)
    if not math.isfinite(number):
        raise InvalidValue(f"episode {episode.id}, call {call.id}: advantage is not finite")
    return number


def _why_unassigned(episode: Episode, call: Call) -> str:
    if not episode.ok:
        return "errored episode"
    if not episode.agent_of(call).trainable:
        return "untrainable agent"
    if not call.kept:
        return "not kept"
    return "not credited"


def relative_credit(
    traces: Sequence[Trace], scale_by_std: bool, std_epsilon: float, leave_one_out: bool = False
) -> list[Credit]:
    """Each trace's reward minus the mean of `traces` (with `leave_one_out`, the mean of the
    others), divided by their std when asked.

    The std is the population std (ddof 0) of all of `traces`, so a pool of one gets advantage
    0.0 rather than NaN, with or without `leave_one_out`.
    """
    if not traces:
        return []
    rewards = np.array([trace.reward for trace in traces], dtype=np.float64)
    if leave_one_out and len(rewards) > 1:
        baselines = (rewards.sum() - rewards) / (len(rewards) - 1)
    else:
        baselines = np.full_like(rewards, rewards.mean())
    advantages = rewards - baselines
    if scale_by_std:
        advantages /= float(rewards.std()) + std_epsilon
    return [
        Credit(trace, float(baseline), float(advantage))
        for trace, baseline, advantage in zip(traces, baselines, advantages, strict=True)
    ]
