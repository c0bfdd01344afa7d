"""Between the wire form (`formats.wire`) and the typed record, validating at the edge.

Every rule docs/episode-format.md states about a single episode is checked here, once, with an error that
names the file, line, episode and call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from callgrove.episode.provenance import gaps_from_json, gaps_to_json, join_spawn, split_spawn
from callgrove.episode.record import (
    AGENT_STARTS,
    LOGPROB_DTYPE,
    PURPOSES,
    RUN_TYPES,
    TOKEN_DTYPE,
    Agent,
    Call,
    Episode,
)
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.wire import FORMAT, WireAgent, WireCall, WireEpisode, WireRun

_TOKEN_MAX = np.iinfo(TOKEN_DTYPE).max


def _fail(message: str, episode: str | None, call: str | None = None) -> InputError:
    return InputError(Problem(message, episode=episode, call=call))


def token_array(values: Any, episode: str, call: str, field: str) -> np.ndarray:
    """Token ids as an int32 array; every id must be a non-negative int32.

    `values` is a sequence of ints, or the raw JSON text of one (`msgspec.Raw`), which is
    parsed directly when it holds only digits and commas.
    """
    if isinstance(values, msgspec.Raw):
        parsed = _parse_raw_numbers(values, _DIGITS, np.int64)
        if parsed is not None and (not parsed.size or parsed.max() <= _TOKEN_MAX):
            return parsed.astype(TOKEN_DTYPE)
        values = _decode_raw_list(values, int, episode, call, field)
    try:
        array = np.asarray(values, dtype=TOKEN_DTYPE)
    except (OverflowError, ValueError, TypeError):
        raise _fail(
            f"{field} holds a value that is not a token id in [0, {_TOKEN_MAX}]", episode, call
        ) from None
    if array.ndim != 1:
        raise _fail(f"{field} must be a flat list of token ids", episode, call)
    if array.size and array.min() < 0:
        raise _fail(f"{field} holds a negative token id", episode, call)
    return array


_DIGITS = b"0123456789,"


def _parse_raw_numbers(raw: msgspec.Raw, allowed: bytes, dtype: type) -> np.ndarray | None:
    """A JSON list of numbers written only with `allowed` bytes, parsed by numpy in one pass;
    None for anything else (the strict decoder then judges it and names what is wrong).

    msgspec has already checked that the text is valid JSON, so a list of only these bytes
    has exactly one number between commas.
    """
    text = bytes(raw)
    if not (text.startswith(b"[") and text.endswith(b"]")):
        return None
    inner = text[1:-1]
    if inner.translate(None, allowed).strip():
        return None
    if not inner.strip():
        return np.zeros(0, dtype=dtype)
    return np.fromstring(inner, dtype=dtype, sep=",")


def _decode_raw_list(raw: msgspec.Raw, kind: type, episode: str, call: str, field: str) -> list:
    try:
        return msgspec.json.decode(raw, type=list[kind])
    except msgspec.ValidationError as error:
        raise _fail(f"{field}: {error}", episode, call) from None


def _float_array(
    values: list[float], episode: str, call: str, field: str, length: int
) -> np.ndarray:
    array = np.asarray(values, dtype=LOGPROB_DTYPE)
    if len(array) != length:
        raise _fail(
            f"{field} has {len(array)} values but completion_ids has {length} tokens", episode, call
        )
    if not np.all(np.isfinite(array)):
        raise _fail(f"{field} holds a value that is not a finite number", episode, call)
    return array


def episode_from_wire(wire: WireEpisode) -> Episode:
    """Build and validate the record. Raises `InputError` naming the episode and call."""
    if wire.format != FORMAT:
        raise _fail(f"format is {wire.format!r}, expected {FORMAT!r}", wire.id)
    check_run(wire.id, wire.run, wire.rewards)
    agents = [_agent_shell(a, wire.id) for a in wire.agents]
    check_agent_links(agents, wire.id)
    by_seq = sorted((c for a in wire.agents for c in a.calls), key=lambda c: c.seq)
    check_unique_calls(by_seq, wire.id)
    built: dict[str, Call] = {}
    for wire_call in by_seq:
        built[wire_call.id] = _call_from_wire(wire_call, built, wire.id)
    for agent, wire_agent in zip(agents, wire.agents, strict=True):
        for wire_call in wire_agent.calls:
            agent.add(built[wire_call.id])
    share_histories(agents)
    return Episode(
        id=wire.id,
        agents=agents,
        group=wire.group,
        env=wire.env,
        task=wire.task,
        run=wire.run,
        ok=wire.ok,
        errors=list(wire.errors),
        rewards=dict(wire.rewards),
        objective=None if wire.objective is UNSET else wire.objective,
        gaps=None if wire.gaps is UNSET else gaps_from_json(wire.gaps, wire.id),
        meta=None if wire.meta is UNSET else wire.meta,
    )


def share_histories(agents: list[Agent]) -> None:
    """Hold a full prompt that resends its agent's previous call as a reference plus a suffix.

    Only an encoding: the forest still decides parents from the tokens. It keeps memory linear
    in the distinct tokens when a file gives every prompt in full.
    """
    for agent in agents:
        previous: Call | None = None
        for call in sorted(agent.calls, key=lambda c: c.seq):
            if (
                previous is not None
                and call.prompt_base is None
                and _starts_with(call.prompt_suffix, previous)
            ):
                call.prompt_suffix = call.prompt_suffix[previous.full_len :].copy()
                call.prompt_base, call.prompt_base_len = previous, previous.full_len
            previous = call


def _starts_with(tokens: np.ndarray, call: Call) -> bool:
    if len(tokens) < call.full_len:
        return False
    position = 0
    for piece in call.segments():
        if not np.array_equal(tokens[position : position + len(piece)], piece):
            return False
        position += len(piece)
    return True


def check_run(episode: str, run: WireRun | None, rewards: dict[str, float]) -> None:
    """Rewards are finite; the run's type is known and its policy span runs forward."""
    for name, value in rewards.items():
        if not math.isfinite(value):
            raise _fail(f"reward {name!r} is not a finite number", episode)
    if run is None:
        return
    if run.type not in RUN_TYPES:
        raise _fail(f"run.type is {run.type!r}, expected one of {', '.join(RUN_TYPES)}", episode)
    if run.policy is not None and run.policy.end < run.policy.start:
        raise _fail(
            f"run.policy.end ({run.policy.end}) is before run.policy.start ({run.policy.start})",
            episode,
        )


def _agent_shell(wire: WireAgent, episode: str) -> Agent:
    if wire.start not in AGENT_STARTS:
        raise _fail(
            f"agent {wire.id!r} has start {wire.start!r}, expected one of {', '.join(AGENT_STARTS)}",
            episode,
        )
    spawn, meta = split_spawn(None if wire.meta is UNSET else wire.meta)
    return Agent(
        id=wire.id,
        name=wire.name,
        parent=wire.parent,
        start=wire.start,
        trainable=wire.trainable,
        rewards=None if wire.rewards is UNSET else dict(wire.rewards),
        meta=meta,
        spawn=spawn,
    )


def check_agent_links(agents: list[Agent], episode: str) -> None:
    """Agent ids are unique and every `parent` names another agent of the episode."""
    ids = [a.id for a in agents]
    seen: set[str] = set()
    for agent_id in ids:
        if agent_id in seen:
            raise _fail(f"agent id {agent_id!r} appears twice", episode)
        seen.add(agent_id)
    for agent in agents:
        if agent.parent is not None and agent.parent not in seen:
            raise _fail(
                f"agent {agent.id!r} names parent agent {agent.parent!r}, which is not in the episode",
                episode,
            )
        if agent.parent == agent.id:
            raise _fail(f"agent {agent.id!r} names itself as its parent", episode)


def check_unique_calls(calls: Sequence[WireCall | Call], episode: str) -> None:
    """No call id or `seq` appears twice in the episode."""
    ids: set[str] = set()
    seqs: dict[int, str] = {}
    for call in calls:
        if call.id in ids:
            raise _fail(f"call id {call.id!r} appears twice", episode, call.id)
        ids.add(call.id)
        if call.seq in seqs:
            raise _fail(
                f"seq {call.seq} is used by both {seqs[call.seq]!r} and {call.id!r}",
                episode,
                call.id,
            )
        seqs[call.seq] = call.id


def _call_from_wire(wire: WireCall, earlier: dict[str, Call], episode: str) -> Call:
    completion = token_array(wire.completion_ids, episode, wire.id, "completion_ids")
    if completion.size == 0:
        raise _fail("completion_ids is empty (a call samples at least one token)", episode, wire.id)
    if wire.purpose not in PURPOSES:
        raise _fail(
            f"purpose is {wire.purpose!r}, expected one of {', '.join(PURPOSES)}", episode, wire.id
        )
    base, base_len, suffix = _prompt_from_wire(wire, earlier, episode)
    logprobs = (
        None
        if wire.logprobs is None
        else _float_array(wire.logprobs, episode, wire.id, "logprobs", completion.size)
    )
    return Call(
        id=wire.id,
        seq=wire.seq,
        completion_ids=completion,
        prompt_suffix=suffix,
        prompt_base=base,
        prompt_base_len=base_len,
        logprobs=logprobs,
        policy_version=wire.policy_version,
        purpose=wire.purpose,
        kept=wire.kept,
        advantages=_advantages_from_wire(wire, episode, completion.size),
        content=None if wire.content is UNSET else wire.content,
    )


def _prompt_from_wire(
    wire: WireCall, earlier: dict[str, Call], episode: str
) -> tuple[Call | None, int, np.ndarray]:
    compact = (wire.prompt_from, wire.prompt_from_len, wire.prompt_suffix_ids)
    given = [part is not UNSET for part in compact]
    if wire.prompt_ids is not UNSET:
        if any(given):
            raise _fail(
                "call has both prompt_ids and prompt_from/prompt_from_len/prompt_suffix_ids",
                episode,
                wire.id,
            )
        return None, 0, token_array(wire.prompt_ids, episode, wire.id, "prompt_ids")
    if not all(given):
        missing = [
            n
            for n, g in zip(
                ("prompt_from", "prompt_from_len", "prompt_suffix_ids"), given, strict=True
            )
            if not g
        ]
        raise _fail(f"call has no prompt_ids and lacks {', '.join(missing)}", episode, wire.id)
    source = earlier.get(wire.prompt_from)  # type: ignore[arg-type]
    if source is None:
        raise _fail(
            f"prompt_from names {wire.prompt_from!r}, which is not an earlier call (lower seq) of the episode",
            episode,
            wire.id,
        )
    length = wire.prompt_from_len
    if not 0 <= length <= source.full_len:  # type: ignore[operator]
        raise _fail(
            f"prompt_from_len {length} is outside [0, {source.full_len}], the length of {source.id!r}'s full sequence",
            episode,
            wire.id,
        )
    suffix = token_array(wire.prompt_suffix_ids, episode, wire.id, "prompt_suffix_ids")
    return (source, length, suffix) if length else (None, 0, suffix)  # type: ignore[return-value]


def _advantages_from_wire(wire: WireCall, episode: str, length: int) -> float | np.ndarray | None:
    value = wire.advantages
    if value is UNSET or value is None:
        return None
    if isinstance(value, list):
        return _float_array(value, episode, wire.id, "advantages", length)
    if not math.isfinite(value):
        raise _fail("advantages is not a finite number", episode, wire.id)
    return float(value)


def episode_to_wire(episode: Episode) -> WireEpisode:
    """The wire form; prompts are written compactly wherever the record holds a base."""
    return WireEpisode(
        format=FORMAT,
        id=episode.id,
        group=episode.group,
        env=episode.env,
        task=episode.task,
        run=episode.run,
        ok=episode.ok,
        errors=list(episode.errors),
        rewards=dict(episode.rewards),
        agents=[_agent_to_wire(a) for a in episode.agents],
        objective=UNSET if episode.objective is None else episode.objective,
        gaps=UNSET if episode.gaps is None else gaps_to_json(episode.gaps),
        meta=UNSET if episode.meta is None else episode.meta,
    )


def _agent_to_wire(agent: Agent) -> WireAgent:
    return WireAgent(
        id=agent.id,
        name=agent.name,
        parent=agent.parent,
        start=agent.start,
        trainable=agent.trainable,
        calls=[_call_to_wire(c) for c in agent.calls],
        rewards=UNSET if agent.rewards is None else agent.rewards,
        meta=UNSET
        if agent.spawn is None and agent.meta is None
        else join_spawn(agent.spawn, agent.meta),
    )


def _call_to_wire(call: Call) -> WireCall:
    wire = WireCall(
        id=call.id,
        seq=call.seq,
        completion_ids=call.completion_ids.tolist(),
        logprobs=None if call.logprobs is None else call.logprobs.tolist(),
        policy_version=call.policy_version,
        purpose=call.purpose,
        kept=call.kept,
        content=UNSET if call.content is None else call.content,
    )
    if call.prompt_base is None:
        wire.prompt_ids = call.prompt_suffix.tolist()
    else:
        wire.prompt_from = call.prompt_base.id
        wire.prompt_from_len = call.prompt_base_len
        wire.prompt_suffix_ids = call.prompt_suffix.tolist()
    if call.advantages is not None:
        advantages = call.advantages
        wire.advantages = (
            advantages.tolist() if isinstance(advantages, np.ndarray) else float(advantages)
        )
    return wire
