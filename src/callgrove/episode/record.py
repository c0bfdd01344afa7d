"""The typed episode record: agents and their calls, tokens as numpy arrays.

A call's prompt is held as the file holds it: the id of an earlier call whose full sequence it
starts with, how much of it, and the tokens it adds (`prompt_from`, `prompt_from_len`,
`prompt_suffix`), never as a fresh copy of its history: memory grows with the distinct tokens of
an episode. The reference is a name, not an object: a call's tokens are read through the calls
it may refer to (`Episode.segments`, `Episode.full_ids`; before an episode exists,
`segments(call, calls_by_id.get)`), so records copy, pickle and filter without hidden links. A
call read with a full `prompt_ids` simply has no base until `callgrove.forest.compact_prompts`
rebases it onto its parent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import msgspec
import numpy as np

from callgrove.episode.provenance import Gap, Spawn
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.ranges import check_range
from callgrove.formats.wire import CallFields, WireEnv, WireError, WirePolicy, WireRun

# The episode's small parts are the wire structs themselves, under the names a user builds with.
EnvInfo = WireEnv  # which environment an episode came from (the environment protocol is
# `callgrove.orchestrator.Environment`)
Run = WireRun
PolicySpan = WirePolicy
EpisodeError = WireError

TOKEN_DTYPE = np.int32
LOGPROB_DTYPE = np.float64  # exact JSON round trips; the binary form stores float32
EMPTY_TOKENS = np.zeros(0, dtype=TOKEN_DTYPE)
# A call's routes (mixture-of-experts models): per forwarded token, per MoE layer, the experts
# its router chose; NO_ROUTE where a token has none.
ROUTE_DTYPE = np.int16
NO_ROUTE = -1

# The enumerated values (docs/episode-format.md); readers check them with a message naming the
# value, the writers before writing.
AgentStart = Literal["root", "fresh", "fork", "background"]
Purpose = Literal["turn", "compaction"]
RunType = Literal["train", "eval"]
AGENT_STARTS: tuple[str, ...] = get_args(AgentStart)
PURPOSES: tuple[str, ...] = get_args(Purpose)
RUN_TYPES: tuple[str, ...] = get_args(RunType)


class Call(CallFields, kw_only=True, eq=False):
    """One model call: what the model was given and what it sampled.

    The fields the file holds as they are (`id`, `seq`, `policy_version`, `purpose`, `kept`)
    come from `formats.wire.CallFields`, shared with the wire form; here are those the record
    holds its own way.
    """

    completion_ids: np.ndarray
    prompt_suffix: np.ndarray = msgspec.field(default_factory=lambda: EMPTY_TOKENS)
    # The id of the earlier call of the same episode whose full sequence the prompt starts with
    # (None: `prompt_suffix` is the whole prompt), and how many of its tokens it resends.
    prompt_from: str | None = None
    prompt_from_len: int = 0
    logprobs: np.ndarray | None = None
    purpose: Purpose = "turn"  # the wire's `str`, narrowed once checked
    advantages: float | np.ndarray | None = None
    content: Any = None
    sampling: dict[str, Any] | None = None
    """How the completion was sampled: `temperature`, `top_p` and `top_k` (None: no top-k cut)
    of the distribution its `logprobs` are under, as `sampling_record` writes it, plus any keys
    a source added. None: unknown (imported calls; a source that could not tell)."""
    routes: np.ndarray | None = None
    """A mixture of experts' routes (`ROUTE_DTYPE`): per position of the full sequence from
    `routes_from` to its last token but one (the last is never forwarded), per MoE layer, the
    experts its router chose; the positions before come from `prompt_from`'s
    (`Episode.routes`). None: not recorded (a dense model; a source without them)."""
    routes_from: int = 0
    # The call's place in its episode's ledger (every call, kept or not, in `seq` order), set by
    # `Episode.ledger()`: what per-call arrays and tables of the later stages are indexed by.
    index: int = -1
    # Its agent's place in `Episode.agents` (`Episode.agent_of`), set with the ledger: a call
    # holds no reference to its agent, so copies, pickles and filters carry no hidden cycle.
    agent_index: int = -1

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
        if extra.get("routes") is not None:
            extra["routes"] = np.asarray(extra["routes"], dtype=ROUTE_DTYPE)
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
        return self.prompt_from_len + len(self.prompt_suffix)

    @property
    def full_len(self) -> int:
        return self.prompt_len + len(self.completion_ids)

    def __repr__(self) -> str:
        prompt = f"{self.prompt_len}"
        if self.prompt_from is not None:
            prompt += f" ({self.prompt_from}[:{self.prompt_from_len}] + {len(self.prompt_suffix)})"
        extras = "" if self.kept else ", kept=False"
        extras += "" if self.purpose == "turn" else f", purpose={self.purpose!r}"
        return (
            f"Call({self.id!r}, seq={self.seq}, prompt={prompt}, "
            f"completion={len(self.completion_ids)}, policy_version={self.policy_version}{extras})"
        )


def sampling_record(temperature: float, top_p: float = 1.0, top_k: int | None = None) -> dict:
    """A call's `sampling`: the distribution its logprobs are under (docs/episode-format.md)."""
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": top_k}


def check_distribution(temperature: Any, top_p: Any, top_k: Any, prefix: str = "") -> None:
    """The bounds of a sampling distribution, an `InvalidValue` naming the first one broken:
    `temperature` a finite number >= 0 (0: greedy), `top_p` in (0, 1], `top_k` an int >= 1
    or None (no top-k cut). A run's `[sampling]` and every recorded call's `sampling` alike."""
    check_range(f"{prefix}temperature", temperature, at_least=0)
    check_range(f"{prefix}top_p", top_p, above=0, at_most=1)
    if top_k is None:
        return
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise InvalidValue(f"{prefix}top_k must be an int or null (no cut), not {top_k!r}")
    check_range(f"{prefix}top_k", top_k, at_least=1)


def not_an_earlier_call(source_id: str) -> str:
    """The message for a prompt that refers to no earlier call of its episode."""
    return (
        f"prompt_from names {source_id!r}, which is not an earlier call (lower seq) of the episode"
    )


def base_of(
    call: Call, find: Callable[[str], Call | None], episode: str | None = None
) -> Call | None:
    """The call whose full sequence `call`'s prompt starts with (None when it has none), found
    by id with `find`; an `InputError` naming the episode and call when that is no earlier call."""
    if call.prompt_from is None:
        return None
    base = find(call.prompt_from)
    if base is None or base.seq >= call.seq:
        raise InputError(
            Problem(not_an_earlier_call(call.prompt_from), episode=episode, call=call.id)
        )
    return base


def segments(
    call: Call,
    find: Callable[[str], Call | None],
    length: int | None = None,
    start: int = 0,
    episode: str | None = None,
) -> list[np.ndarray]:
    """Array views that concatenate to the call's full sequence `[start:length]`, sharing memory
    with the history; `find` gives a call by id (every call the prompt refers to, directly or
    through others). In an episode, `Episode.segments`."""
    remaining = call.full_len if length is None else length
    reversed_parts: list[np.ndarray] = []
    current: Call | None = call
    while current is not None and remaining > start:
        suffix_start = current.prompt_from_len
        completion_start = suffix_start + len(current.prompt_suffix)
        for piece_start, piece in (
            (completion_start, current.completion_ids),
            (suffix_start, current.prompt_suffix),
        ):
            if remaining > piece_start:
                skip = max(start - piece_start, 0)
                reversed_parts.append(piece[skip : remaining - piece_start])
                remaining = piece_start
        current = base_of(current, find, episode) if remaining > start else None
    reversed_parts.reverse()
    return reversed_parts


def route_pieces(
    call: Call, find: Callable[[str], Call | None], episode: str | None = None
) -> list[np.ndarray] | None:
    """Arrays that concatenate to the call's routes over its full sequence but the last token,
    following `routes_from` down its prompt references; None where a call on the way holds
    none. In an episode, `Episode.routes`."""
    pieces: list[np.ndarray] = []
    current: Call | None = call
    needed: int | None = None  # positions still wanted, from 0 (None: all of the call's)
    while current is not None:
        if current.routes is None:
            return None
        start = current.routes_from
        if needed is None:
            pieces.append(current.routes)
        elif needed > start:  # a prompt may resend less than its base's own routes begin at
            pieces.append(current.routes[: needed - start])
        needed = start if needed is None else min(needed, start)
        if needed == 0:
            break
        current = base_of(current, find, episode)
        if current is None:
            raise InputError(
                Problem("routes_from without prompt_from", episode=episode, call=call.id)
            )
    pieces.reverse()
    return pieces


def share_routes(call: Call, routes: np.ndarray | None, find: Callable[[str], Call | None]) -> None:
    """Hold `routes` (the call's whole routes) as its prompt base's where they agree: the
    positions the base covers taken from it, the rest its own. Where they differ (the call's
    forward routed the shared prefix otherwise), the call keeps them whole."""
    call.routes, call.routes_from = routes, 0
    base = None if call.prompt_from is None else find(call.prompt_from)
    if routes is None or base is None:
        return
    below = route_pieces(base, find)
    cut = call.prompt_from_len - 1
    if below is None or cut <= 0 or len(routes) < cut:
        return
    if np.array_equal(concat(below)[:cut], routes[:cut]):
        call.routes, call.routes_from = routes[cut:].copy(), cut


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """One array of `segments`' views (the view itself when there is only one)."""
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
    index: int = field(default=-1, repr=False)  # its place in `Episode.agents`, set with the ledger

    def __post_init__(self) -> None:
        for call in self.calls:
            call.agent_index = self.index

    def add(self, call: Call) -> Call:
        call.agent_index = self.index
        self.calls.append(call)
        return call

    def __repr__(self) -> str:
        parent = "" if self.parent is None else f", parent={self.parent!r}"
        trainable = "" if self.trainable else ", trainable=False"
        return (
            f"Agent({self.id!r}, {self.name!r}, start={self.start!r}{parent}{trainable}, "
            f"calls={len(self.calls)})"
        )


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
    # Every call by id, where prompt references are looked up: made on first use, again by
    # `ledger()` and whenever an id is not found in it (a call added since).
    _by_id: dict[str, Call] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.ledger()

    def ledger(self) -> list[Call]:
        """Every call, kept or not, in `seq` order (agent order among equal `seq`), each given
        its place here as `index` (and each agent its place in `agents`). Built at
        construction; call it again after adding agents or calls."""
        self._by_id = None
        for number, agent in enumerate(self.agents):
            agent.index = number
            for call in agent.calls:
                call.agent_index = number
        ordered = sorted(self.calls(), key=lambda c: c.seq)
        for index, call in enumerate(ordered):
            call.index = index
        return ordered

    def set_advantages(self, values: Sequence[float | np.ndarray | None]) -> None:
        """Every call's `advantages` from one array in ledger order (`Call.index`), the form
        credit computes them in."""
        ledger = self.ledger()
        if len(values) != len(ledger):
            raise InvalidValue(
                f"episode {self.id}: {len(values)} advantages for {len(ledger)} calls"
            )
        for call, value in zip(ledger, values, strict=True):
            call.advantages = value

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

    def agent_of(self, call: Call) -> Agent:
        """The agent that made `call` (by `Call.agent_index`)."""
        if not 0 <= call.agent_index < len(self.agents):
            raise InvalidValue(
                f"episode {self.id}: call {call.id} has no agent here; "
                "call ledger() after adding agents or calls"
            )
        return self.agents[call.agent_index]

    def find(self, call_id: str) -> Call | None:
        """The call with this id, or None."""
        found = None if self._by_id is None else self._by_id.get(call_id)
        if found is None:
            self._by_id = {call.id: call for call in self.calls()}
            found = self._by_id.get(call_id)
        return found

    def base_of(self, call: Call) -> Call | None:
        """The call whose full sequence `call`'s prompt starts with (`Call.prompt_from`), or
        None; an `InputError` naming the episode and call when it is no earlier call here."""
        return base_of(call, self.find, self.id)

    def segments(self, call: Call, length: int | None = None, start: int = 0) -> list[np.ndarray]:
        """Array views that concatenate to `full_ids(call)[start:length]`, sharing memory with
        the history (no copy)."""
        return segments(call, self.find, length, start, self.id)

    def prompt_ids(self, call: Call) -> np.ndarray:
        """The call's whole prompt."""
        return concat(self.segments(call, call.prompt_len))

    def full_ids(self, call: Call) -> np.ndarray:
        """The call's prompt then its completion."""
        return concat(self.segments(call))

    def routes(self, call: Call) -> np.ndarray | None:
        """The call's routes over its full sequence but the last token (tokens - 1, layers,
        k), or None where it has none."""
        pieces = route_pieces(call, self.find, self.id)
        return None if pieces is None else concat(pieces)

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

    def __repr__(self) -> str:
        calls = sum(len(agent.calls) for agent in self.agents)
        errors = f", errors={len(self.errors)}" if self.errors else ""
        return (
            f"Episode({self.id!r}, group={self.group!r}, ok={self.ok}, "
            f"agents={len(self.agents)}, calls={calls}, reward={self.reward:g}{errors})"
        )

    def summary(self) -> str:
        """A few lines for a notebook or a log: the episode, then one line per agent."""
        lines = [repr(self)]
        for agent in self.agents:
            tokens = sum(len(c.completion_ids) for c in agent.calls)
            kept = sum(c.kept for c in agent.calls)
            lines.append(
                f"  {agent.id} ({agent.name}, {agent.start}): {len(agent.calls)} calls, "
                f"{kept} kept, {tokens} completion tokens"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())

    def filter(self, keep: Callable[[Call], bool]) -> Episode:
        """A new episode holding only the calls `keep` accepts (agents keep their place, even
        when left without calls). This episode is not changed; the new one shares its token
        arrays, and a call whose prompt referenced a dropped call holds it by its own tokens."""
        copies: dict[str, Call] = {}
        for call in sorted((c for c in self.calls() if keep(c)), key=lambda c: c.seq):
            if call.prompt_from is None or call.prompt_from in copies:
                copies[call.id] = msgspec.structs.replace(call)
            else:
                copies[call.id] = msgspec.structs.replace(
                    call, prompt_suffix=self.prompt_ids(call), prompt_from=None, prompt_from_len=0
                )
        agents = [
            replace(agent, calls=[copies[c.id] for c in agent.calls if c.id in copies])
            for agent in self.agents
        ]
        share_histories(agents)
        return replace(self, agents=agents, errors=list(self.errors), rewards=dict(self.rewards))


def share_histories(agents: list[Agent]) -> int:
    """Hold a full prompt that resends an earlier call as a reference plus a suffix: its
    agent's previous call, or for a fork's first call the longest earlier call of the agent
    that started it. Returns how many prompts it made compact.

    Only an encoding: the forest still decides parents from the tokens. It keeps memory and
    files linear in the distinct tokens when every prompt is given in full.
    """
    by_id = {agent.id: agent for agent in agents}
    find = {call.id: call for agent in agents for call in agent.calls}.get
    shared = 0
    for agent in agents:
        previous: Call | None = None
        for call in sorted(agent.calls, key=lambda c: c.seq):
            if call.prompt_from is None:
                forked = agent.start == "fork" and agent.parent is not None
                starter = by_id.get(agent.parent) if forked else None  # type: ignore[arg-type]
                candidates = [previous] if previous is not None else _earlier(starter, call)
                for source in candidates:
                    if _starts_with(call.prompt_suffix, source, find):
                        call.prompt_suffix = call.prompt_suffix[source.full_len :].copy()
                        call.prompt_from, call.prompt_from_len = source.id, source.full_len
                        share_routes(call, call.routes, find)
                        shared += 1
                        break
            previous = call
    return shared


def _earlier(agent: Agent | None, call: Call) -> list[Call]:
    """`agent`'s calls before `call`, longest full sequence first."""
    if agent is None:
        return []
    earlier = [c for c in agent.calls if c.seq < call.seq and c.full_len]
    return sorted(earlier, key=lambda c: -c.full_len)


def _starts_with(tokens: np.ndarray, call: Call, find: Callable[[str], Call | None]) -> bool:
    if len(tokens) < call.full_len:
        return False
    position = 0
    for piece in segments(call, find):
        if not np.array_equal(tokens[position : position + len(piece)], piece):
            return False
        position += len(piece)
    return True
