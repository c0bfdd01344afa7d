"""The hard cases of exactly-once, one small seeded episode each: what every row builder is
measured on (`callgrove audit`, benchmarks/audit_stacks.py).

Each episode has a leader whose turns extend its own history (a user message between turns),
and one shape that builders get wrong: a fork (its first call resends the leader's history), a
fork of a fork, a background agent whose answer the leader never reads, two compactions (each
next turn starts from the summary), a rejected compaction (`kept: false`, the leader goes on
with its history), twins (two fresh subagents with the same task and the same answer), a
resumed session (a new agent resending the leader's whole history), and a fork whose first call
is not an exact copy (one token of the system prompt differs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.synth.workload import VOCAB

TURN_TOKENS = 12  # a completion's length
MESSAGE_TOKENS = 6  # a user message or tool result between turns
SYSTEM_TOKENS = 10


class _Writer:
    """Builds one episode call by call: seeded tokens, `seq` in recording order."""

    def __init__(self, name: str, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.episode = Episode(name, rewards={"score": 1.0})
        self.seq = 0

    def tokens(self, count: int) -> np.ndarray:
        return self.rng.integers(1, VOCAB, count, dtype=np.int32)

    def agent(
        self, agent_id: str, name: str, start: str = "root", parent: str | None = None
    ) -> Agent:
        agent = Agent(agent_id, name, parent=parent, start=start)
        self.episode.agents.append(agent)
        self.episode.ledger()
        return agent

    def call(
        self, agent: Agent, prompt: np.ndarray, *, kept: bool = True, purpose: str = "turn"
    ) -> Call:
        self.seq += 1
        completion = self.tokens(TURN_TOKENS)
        logprobs = -self.rng.random(TURN_TOKENS).astype(np.float32)
        call = Call.make(
            f"{agent.id}.{len(agent.calls)}",
            self.seq,
            prompt,
            completion,
            logprobs,
            kept=kept,
            purpose=purpose,
        )
        agent.add(call)
        self.episode.ledger()
        return call

    def next_prompt(self, call: Call) -> np.ndarray:
        """The history after `call`: its full sequence and a message."""
        return np.concatenate([self.episode.full_ids(call), self.tokens(MESSAGE_TOKENS)])

    def turns(self, agent: Agent, prompt: np.ndarray, count: int) -> Call:
        """`count` turns of `agent` from `prompt`, each extending the last; the last call."""
        call = self.call(agent, prompt)
        for _ in range(count - 1):
            call = self.call(agent, self.next_prompt(call))
        return call


def _fresh_prompt(writer: _Writer) -> np.ndarray:
    return writer.tokens(SYSTEM_TOKENS + MESSAGE_TOKENS)


def _opening(name: str, seed: int, turns: int) -> tuple[_Writer, Agent, Call]:
    """An episode whose leader has taken `turns` turns from a fresh prompt: the writer, the
    leader and its last call."""
    w = _Writer(name, seed)
    leader = w.agent("L", "leader")
    return w, leader, w.turns(leader, _fresh_prompt(w), turns)


def fork(seed: int = 0) -> Episode:
    w, leader, last = _opening("fork", seed, 2)
    forked = w.agent("F", "fork", start="fork", parent="L")
    w.turns(forked, w.next_prompt(last), 2)
    w.turns(leader, w.next_prompt(last), 2)
    return w.episode


def fork_of_fork(seed: int = 0) -> Episode:
    w, leader, last = _opening("fork-of-fork", seed, 2)
    forked = w.agent("F", "fork", start="fork", parent="L")
    fork_last = w.turns(forked, w.next_prompt(last), 2)
    inner = w.agent("G", "fork-of-fork", start="fork", parent="F")
    w.turns(inner, w.next_prompt(fork_last), 2)
    w.turns(forked, w.next_prompt(fork_last), 1)
    w.turns(leader, w.next_prompt(last), 1)
    return w.episode


def background(seed: int = 0) -> Episode:
    w, leader, last = _opening("background", seed, 2)
    helper = w.agent("B", "background", start="background", parent="L")
    w.turns(helper, _fresh_prompt(w), 2)  # its answer never reaches the leader
    w.turns(leader, w.next_prompt(last), 2)
    return w.episode


def _compaction(w: _Writer, agent: Agent, last: Call, *, kept: bool = True) -> Call:
    return w.call(agent, w.next_prompt(last), kept=kept, purpose="compaction")


def _from_summary(w: _Writer, summary: Call) -> np.ndarray:
    """A fresh history: a system prompt, the summary, a message."""
    return np.concatenate(
        [w.tokens(SYSTEM_TOKENS), summary.completion_ids, w.tokens(MESSAGE_TOKENS)]
    )


def two_compactions(seed: int = 0) -> Episode:
    w, leader, last = _opening("two-compactions", seed, 2)
    for _ in range(2):
        summary = _compaction(w, leader, last)
        last = w.turns(leader, _from_summary(w, summary), 2)
    return w.episode


def rejected_compaction(seed: int = 0) -> Episode:
    w, leader, last = _opening("rejected-compaction", seed, 2)
    _compaction(w, leader, last, kept=False)  # refused: the leader goes on with its history
    last = w.turns(leader, w.next_prompt(last), 1)
    summary = _compaction(w, leader, last)
    w.turns(leader, _from_summary(w, summary), 2)
    return w.episode


def twins(seed: int = 0) -> Episode:
    w, leader, last = _opening("twins", seed, 2)
    task = _fresh_prompt(w)
    first = w.agent("T1", "explore", start="fresh", parent="L")
    w.turns(first, task, 2)
    second = w.agent("T2", "explore", start="fresh", parent="L")
    for call in first.calls:  # the same prompts, the same answers
        w.seq += 1
        twin = Call.make(
            f"T2.{len(second.calls)}",
            w.seq,
            w.episode.prompt_ids(call),
            call.completion_ids,
            call.logprobs,
        )
        second.add(twin)
    w.episode.ledger()
    w.turns(leader, w.next_prompt(last), 1)
    return w.episode


def resumed_session(seed: int = 0) -> Episode:
    w, _, last = _opening("resumed-session", seed, 3)
    resumed = w.agent("R", "leader", start="root")  # a new process resending the whole history
    w.turns(resumed, w.next_prompt(last), 2)
    return w.episode


def inexact_fork(seed: int = 0) -> Episode:
    w, leader, last = _opening("inexact-fork", seed, 2)
    history = w.next_prompt(last)
    history[0] = history[0] % (VOCAB - 1) + 1  # one system-prompt token differs
    forked = w.agent("F", "fork", start="fork", parent="L")
    w.turns(forked, history, 2)
    w.turns(leader, w.next_prompt(last), 1)
    return w.episode


HARD_CASES: dict[str, Callable[[int], Episode]] = {
    "fork": fork,
    "fork of a fork": fork_of_fork,
    "background": background,
    "two compactions": two_compactions,
    "rejected compaction": rejected_compaction,
    "twins": twins,
    "resumed session": resumed_session,
    "inexact fork": inexact_fork,
}
"""Each hard case by name, a seed to its episode."""
