"""Between the wire form (`formats.wire`) and the typed record, validating at the edge.

The JSON-only rules (the format string, token ids that fit, one complete prompt form) are
checked here; every other rule by `episode.checks`, which the binary reader and the writers
share. Errors name the file, line, episode and call.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from callgrove.episode.checks import (
    CallColumns,
    call_problems,
    check_agents,
    check_present,
    check_run,
    check_unique_calls,
    fail,
    negative_token,
    raise_first,
    resolve_prompts,
)
from callgrove.episode.provenance import gaps_from_json, gaps_to_json, join_spawn, split_spawn
from callgrove.episode.record import (
    LOGPROB_DTYPE,
    TOKEN_DTYPE,
    Agent,
    Call,
    Episode,
    share_histories,
)
from callgrove.formats.wire import (
    FORMAT,
    WireAgent,
    WireCall,
    WireEnv,
    WireEpisode,
    WireError,
    WireRun,
)

_TOKEN_MAX = np.iinfo(TOKEN_DTYPE).max


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
        raise fail(
            f"{field} holds a value that is not a token id in [0, {_TOKEN_MAX}]", episode, call
        ) from None
    if array.ndim != 1:
        raise fail(f"{field} must be a flat list of token ids", episode, call)
    if array.size and array.min() < 0:
        raise fail(negative_token(field), episode, call)
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
        raise fail(f"{field}: {error}", episode, call) from None


def _floats(values: list[float] | None) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=LOGPROB_DTYPE)


# Episode fields the record and the wire hold alike, and those the wire leaves out when unset.
_PLAIN_EPISODE_FIELDS = ("id", "group", "env", "task", "run", "ok")
_OPTIONAL_EPISODE_FIELDS = ("objective", "meta")


def _none_if_unset(value: Any) -> Any:
    return None if value is UNSET else value


def _unset_if_none(value: Any) -> Any:
    return UNSET if value is None else value


def episode_from_wire(wire: WireEpisode) -> Episode:
    """Build and validate the record. Raises `InputError` naming the episode and the call."""
    if wire.format != FORMAT:
        raise fail(f"format is {wire.format!r}, expected {FORMAT!r}", wire.id)
    check_present(wire)
    check_run(wire.id, wire.run, wire.rewards)
    check_agents(wire.agents, wire.id)
    agents = [_agent_from_wire(a, wire.id) for a in wire.agents]
    calls = [call for agent in agents for call in agent.calls]
    check_unique_calls(calls, wire.id)
    columns = CallColumns.of_calls(calls)
    raise_first(call_problems(columns), columns.ids, 0, len(calls), wire.id)
    prompt_from = [
        None if c.prompt_from is UNSET else c.prompt_from for a in wire.agents for c in a.calls
    ]
    resolve_prompts(calls, prompt_from, wire.id)
    share_histories(agents)
    return Episode(
        agents=agents,
        errors=[_plain(error) for error in wire.errors],
        rewards=dict(wire.rewards),
        gaps=None if wire.gaps is UNSET else gaps_from_json(wire.gaps, wire.id),
        **{name: _plain(getattr(wire, name)) for name in _PLAIN_EPISODE_FIELDS},
        **{name: _none_if_unset(getattr(wire, name)) for name in _OPTIONAL_EPISODE_FIELDS},
    )


_PARTS = (WireEnv, WireRun, WireError)


def _plain(value: Any) -> Any:
    """A part decoded in its reading form (`formats.wire`) as the struct code builds; any other
    value as it is."""
    for kind in _PARTS:
        if isinstance(value, kind) and type(value) is not kind:
            return kind(**msgspec.structs.asdict(value))
    return value


def _agent_from_wire(wire: WireAgent, episode: str) -> Agent:
    spawn, meta = split_spawn(None if wire.meta is UNSET else wire.meta)
    return Agent(
        id=wire.id,
        name=wire.name,
        parent=wire.parent,
        start=wire.start,  # type: ignore[arg-type]  # checked by check_agents
        trainable=wire.trainable,
        calls=[_call_from_wire(c, episode) for c in wire.calls],
        rewards=None if wire.rewards is UNSET else dict(wire.rewards),
        meta=meta,
        spawn=spawn,
    )


# The call fields every form copies as they are: those of `WireCall` that `Call` has too, but
# for the ones each form spells its own way. A new such field is a line in `CallFields` (and its
# docs), which both inherit: the JSON and binary paths pick it up from here.
_SHAPED_CALL_FIELDS = {
    "id",
    "seq",
    "prompt_ids",
    "prompt_from",
    "prompt_from_len",
    "prompt_suffix_ids",
    "completion_ids",
    "logprobs",
    "advantages",
}
PLAIN_CALL_FIELDS: tuple[msgspec.structs.FieldInfo, ...] = tuple(
    f
    for f in msgspec.structs.fields(WireCall)
    if f.name not in _SHAPED_CALL_FIELDS and f.name in Call.__struct_fields__
)


def plain_call_values(call: Call) -> dict[str, Any]:
    """The call's plain fields as `WireCall` holds them (None left out where it can be)."""
    return {
        f.name: UNSET if value is None and f.default is UNSET else value
        for f in PLAIN_CALL_FIELDS
        for value in (getattr(call, f.name),)
    }


def _call_from_wire(wire: WireCall, episode: str) -> Call:
    """The call as given; its values are checked with its episode's (`checks.call_problems`)."""
    base_len, suffix = _prompt_from_wire(wire, episode)
    value = wire.advantages
    return Call(
        id=wire.id,
        seq=wire.seq,
        completion_ids=token_array(wire.completion_ids, episode, wire.id, "completion_ids"),
        prompt_suffix=suffix,
        prompt_base_len=base_len,
        logprobs=_floats(wire.logprobs),
        advantages=(
            None
            if value is UNSET or value is None
            else _floats(value)
            if isinstance(value, list)
            else float(value)
        ),
        **{  # purpose and the like are checked with the episode (`checks.call_problems`)
            f.name: None if (value := getattr(wire, f.name)) is UNSET else value
            for f in PLAIN_CALL_FIELDS
        },
    )


def _prompt_from_wire(wire: WireCall, episode: str) -> tuple[int, np.ndarray]:
    """The prompt's reference length and suffix; the reference is resolved with the episode's."""
    compact = {
        "prompt_from": wire.prompt_from,
        "prompt_from_len": wire.prompt_from_len,
        "prompt_suffix_ids": wire.prompt_suffix_ids,
    }
    if wire.prompt_ids is not UNSET:
        if any(part is not UNSET for part in compact.values()):
            raise fail(
                "call has both prompt_ids and prompt_from/prompt_from_len/prompt_suffix_ids",
                episode,
                wire.id,
            )
        return 0, token_array(wire.prompt_ids, episode, wire.id, "prompt_ids")
    missing = [name for name, part in compact.items() if part is UNSET]
    if missing:
        raise fail(f"call has no prompt_ids and lacks {', '.join(missing)}", episode, wire.id)
    suffix = token_array(wire.prompt_suffix_ids, episode, wire.id, "prompt_suffix_ids")
    return wire.prompt_from_len, suffix  # type: ignore[return-value]


def episode_to_wire(episode: Episode) -> WireEpisode:
    """The wire form; prompts are written compactly wherever the record holds a base."""
    return WireEpisode(
        format=FORMAT,
        errors=list(episode.errors),
        rewards=dict(episode.rewards),
        agents=[_agent_to_wire(a) for a in episode.agents],
        gaps=UNSET if episode.gaps is None else gaps_to_json(episode.gaps),
        **{name: getattr(episode, name) for name in _PLAIN_EPISODE_FIELDS},
        **{name: _unset_if_none(getattr(episode, name)) for name in _OPTIONAL_EPISODE_FIELDS},
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
        **plain_call_values(call),
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
