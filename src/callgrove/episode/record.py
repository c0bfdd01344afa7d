"""The typed episode record: agents and their calls, tokens as numpy arrays.

A call's prompt is held as a reference into an earlier call's full sequence plus the tokens it
adds (`prompt_base`, `prompt_base_len`, `prompt_suffix`), never as a fresh copy of its history:
memory grows with the distinct tokens of an episode, as the compact file form does. A call read
with a full `prompt_ids` simply has no base until `callgrove.forest.compact_prompts` rebases it
onto its parent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from callgrove.episode.provenance import Gap, Spawn
from callgrove.formats.wire import WireEnv, WireError, WirePolicy, WireRun

# The episode's small parts are the wire structs themselves, under the names a user builds with.
Env = WireEnv
Run = WireRun
PolicySpan = WirePolicy
EpisodeError = WireError

TOKEN_DTYPE = np.int32
LOGPROB_DTYPE = np.float64  # exact JSON round trips; the binary form stores float32
EMPTY_TOKENS = np.zeros(0, dtype=TOKEN_DTYPE)

# The enumerated values (docs/episode-format.md); readers check them with a message naming the
# value, the writers before writing.
AgentStart = Literal["root", "fresh", "fork", "background"]
Purpose = Literal["turn", "compaction"]
RunType = Literal["train", "eval"]
AGENT_STARTS: tuple[str, ...] = get_args(AgentStart)
PURPOSES: tuple[str, ...] = get_args(Purpose)
RUN_TYPES: tuple[str, ...] = get_args(RunType)


@dataclass(slots=True, eq=False)
class Call:
    """One model call: what the model was given and what it sampled."""

    id: str
    seq: int
    completion_ids: np.ndarray
    prompt_suffix: np.ndarray = field(default_factory=lambda: EMPTY_TOKENS)
    prompt_base: Call | None = None
    prompt_base_len: int = 0
    logprobs: np.ndarray | None = None
    policy_version: int | None = None
    purpose: Purpose = "turn"
    kept: bool = True
    advantages: float | np.ndarray | None = None
    content: Any = None
    agent: Agent | None = field(default=None, repr=False)

    @classmethod
    def make(
        cls,
        id: str,
        seq: int,
        prompt_ids: Sequence[int] | np.ndarray,
        completion_ids: Sequence[int] | np.ndarray,
        logprobs: Sequence[float] | np.ndarray | None = None,
        **extra: Any,
    ) -> Call:
        """A call with its whole prompt given (convenient in code and tests)."""
        return cls(
            id=id,
            seq=seq,
            completion_ids=np.asarray(completion_ids, dtype=TOKEN_DTYPE),
            prompt_suffix=np.asarray(prompt_ids, dtype=TOKEN_DTYPE),
            logprobs=None if logprobs is None else np.asarray(logprobs, dtype=LOGPROB_DTYPE),
            **extra,
        )

    @property
    def prompt_len(self) -> int:
        return self.prompt_base_len + len(self.prompt_suffix)

    @property
    def full_len(self) -> int:
        return self.prompt_len + len(self.completion_ids)

    def segments(self, length: int | None = None, start: int = 0) -> list[np.ndarray]:
        """Array views that concatenate to `full_ids()[start:length]`, sharing memory with the history."""
        remaining = self.full_len if length is None else length
        reversed_parts: list[np.ndarray] = []
        call: Call | None = self
        while call is not None and remaining > start:
            suffix_start = call.prompt_base_len
            completion_start = suffix_start + len(call.prompt_suffix)
            for piece_start, piece in (
                (completion_start, call.completion_ids),
                (suffix_start, call.prompt_suffix),
            ):
                if remaining > piece_start:
                    skip = max(start - piece_start, 0)
                    reversed_parts.append(piece[skip : remaining - piece_start])
                    remaining = piece_start
            call = call.prompt_base
        reversed_parts.reverse()
        return reversed_parts

    def prompt_ids(self) -> np.ndarray:
        return _concat(self.segments(self.prompt_len))

    def full_ids(self) -> np.ndarray:
        return _concat(self.segments())


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return EMPTY_TOKENS
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(slots=True, eq=False)
class Agent:
    """One agent of the episode (the leader or a subagent) with its kept calls in its own order."""

    id: str
    name: str
    parent: str | None = None
    start: AgentStart = "root"
    trainable: bool = True
    calls: list[Call] = field(default_factory=list)
    rewards: dict[str, float] | None = None
    meta: dict[str, Any] | None = None
    spawn: Spawn | None = None  # the call that started this agent, when recorded

    def __post_init__(self) -> None:
        for call in self.calls:
            call.agent = self

    def add(self, call: Call) -> Call:
        call.agent = self
        self.calls.append(call)
        return call


@dataclass(slots=True, eq=False)
class Episode:
    """The unit that is dispatched, scored, written and read back, errors and all."""

    id: str
    agents: list[Agent] = field(default_factory=list)
    group: str | None = None
    env: WireEnv | None = None
    task: Any = None
    run: WireRun | None = None
    ok: bool = True
    errors: list[WireError] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    objective: str | None = None
    gaps: list[Gap] | None = None
    meta: dict[str, Any] | None = None

    @property
    def supervised(self) -> bool:
        """`objective: supervised` (imported transcripts, no sampling logprobs): its rows train
        by cross-entropy, never by advantages."""
        return self.objective == "supervised"

    @property
    def reward(self) -> float:
        """The episode reward: the sum of its named rewards."""
        return float(sum(self.rewards.values()))

    @property
    def scored(self) -> bool:
        """Whether any reward was recorded: imported (supervised) episodes and ones that failed
        before scoring have none, and views say "no reward" rather than a made-up 0."""
        return bool(self.rewards) or any(agent.rewards is not None for agent in self.agents)

    def reward_of(self, agent: Agent | None) -> float:
        """An agent's reward (docs/episode-format.md, rows): the sum of its own `rewards` when it has them (an empty
        dict counts, summing to 0.0), else the episode reward. Rows and credit both use it."""
        if agent is not None and agent.rewards is not None:
            return float(sum(agent.rewards.values()))
        return self.reward

    def calls(self) -> Iterator[Call]:
        """Every call of every agent, kept or not, agent by agent."""
        for agent in self.agents:
            yield from agent.calls

    def kept_calls(self) -> list[Call]:
        """The kept calls, in ledger (`seq`) order."""
        return sorted((c for c in self.calls() if c.kept), key=lambda c: c.seq)

    def agent(self, agent_id: str) -> Agent:
        for agent in self.agents:
            if agent.id == agent_id:
                return agent
        raise KeyError(agent_id)

    def call(self, call_id: str) -> Call:
        for call in self.calls():
            if call.id == call_id:
                return call
        raise KeyError(call_id)
