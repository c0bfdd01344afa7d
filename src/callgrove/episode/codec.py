"""Between the wire form (`formats.wire`) and the typed record, validating at the edge.

The JSON-only rules (the format string, token ids that fit, one complete prompt form) are
checked here; every other rule by `episode.checks`, which the binary reader and the writers
share. Errors name the file, line, episode and call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from callgrove.episode.checks import (
    TOKEN_MAX,
    CallColumns,
    ListColumn,
    call_problems,
    check_agents,
    check_present,
    check_routes,
    check_run,
    check_unique_calls,
    fail,
    negative_token,
    not_a_token_id,
    raise_first,
    resolve_prompts,
)
from callgrove.episode.provenance import gaps_from_json, gaps_to_json, join_spawn, split_spawn
from callgrove.episode.record import (
    LOGPROB_DTYPE,
    ROUTE_DTYPE,
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


def token_array(values: Any, episode: str, call: str, field: str) -> np.ndarray:
    """Token ids as an int32 array; every id must be a non-negative int32.

    `values` is a sequence of ints, or the raw JSON text of one (`msgspec.Raw`), which is
    parsed directly when it holds only digits and commas.
    """
    if isinstance(values, msgspec.Raw):
        parsed = _parse_raw_numbers(values, _DIGITS, np.int64)
        if parsed is not None and (not parsed.size or parsed.max() <= TOKEN_MAX):
            return parsed.astype(TOKEN_DTYPE)
        values = _decode_raw_list(values, int, episode, call, field)
    try:
        array = np.asarray(values, dtype=TOKEN_DTYPE)
    except (OverflowError, ValueError, TypeError):
        raise fail(not_a_token_id(field), episode, call) from None
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
    read = _calls_in_one_buffer(wire)
    if read is None:  # a call the one-buffer path cannot take: built one by one, named exactly
        calls_of = [[_call_from_wire(c, wire.id) for c in a.calls] for a in wire.agents]
        columns = CallColumns.of_calls([call for calls in calls_of for call in calls])
    else:
        calls_of, columns = read
    agents = [_agent_from_wire(a, calls) for a, calls in zip(wire.agents, calls_of, strict=True)]
    calls = [call for agent in agents for call in agent.calls]
    check_unique_calls(calls, wire.id)
    raise_first(call_problems(columns), columns.ids, 0, len(calls), wire.id)
    prompt_from = [
        None if c.prompt_from is UNSET else c.prompt_from for a in wire.agents for c in a.calls
    ]
    resolve_prompts(calls, prompt_from, wire.id)
    shape_empty_routes(calls)
    check_routes(calls, wire.id)
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


def _agent_from_wire(wire: WireAgent, calls: list[Call]) -> Agent:
    spawn, meta = split_spawn(None if wire.meta is UNSET else wire.meta)
    return Agent(
        id=wire.id,
        name=wire.name,
        parent=wire.parent,
        start=wire.start,  # type: ignore[arg-type]  # checked by check_agents
        trainable=wire.trainable,
        calls=calls,
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
    "routes",
    "routes_from",
}
PLAIN_CALL_FIELDS: tuple[msgspec.structs.FieldInfo, ...] = tuple(
    f
    for f in msgspec.structs.fields(WireCall)
    if f.name not in _SHAPED_CALL_FIELDS and f.name in Call.__struct_fields__
)


# Each plain field's name, and whether the wire leaves it out (UNSET) when the record holds None.
_PLAIN_OMITTED = tuple((f.name, f.default is UNSET) for f in PLAIN_CALL_FIELDS)


def plain_call_values(call: Call) -> dict[str, Any]:
    """The call's plain fields as `WireCall` holds them (None left out where it can be)."""
    return {
        name: UNSET if omitted and value is None else value
        for name, omitted in _PLAIN_OMITTED
        for value in (getattr(call, name),)
    }


def _calls_in_one_buffer(wire: WireEpisode) -> tuple[list[list[Call]], CallColumns] | None:
    """Every call of the episode with its token ids and logprobs as views into one buffer each,
    parsed in one pass, and the columns the rules are checked on (no copy of either).

    None when some call holds anything the buffers cannot take as it is (both prompt forms, a
    prompt form incomplete, or a token list with more than plain non-negative int32 ids): the
    call-by-call path then builds the episode and names the call and field that is wrong.
    """
    calls = [call for agent in wire.agents for call in agent.calls]
    prompts = [_compact_prompt(call) for call in calls]
    if None in prompts or any(call.routes not in (UNSET, None) for call in calls):
        return None
    count = len(calls)
    token_lists = [prompt for _base_len, prompt in prompts]  # type: ignore[misc]
    token_lists += [call.completion_ids for call in calls]
    parsed = _token_lists(token_lists)
    if parsed is None:
        return None
    tokens, offsets = parsed
    logprobs = _float_lists([None if c.logprobs is UNSET else c.logprobs for c in calls])
    advantages = [None if c.advantages is UNSET else c.advantages for c in calls]
    per_token = _float_lists([a if isinstance(a, list) else None for a in advantages])
    split, no_nulls = offsets[count], np.zeros(count, dtype=bool)
    prompt_column = ListColumn(tokens[:split], offsets[: count + 1], no_nulls)
    completion_column = ListColumn(tokens[split:], offsets[count:] - split, no_nulls)
    logprob_views, per_token_views = logprobs.views(), per_token.views()
    plain = [
        {
            f.name: None if (value := getattr(call, f.name)) is UNSET else value
            for f in PLAIN_CALL_FIELDS
        }
        for call in calls
    ]
    built = [
        Call(
            id=call.id,
            seq=call.seq,
            completion_ids=completion,
            prompt_suffix=prompt,
            prompt_from_len=base_len,  # type: ignore[arg-type]
            logprobs=logprob,
            advantages=_advantage(value, per_token_view),
            **values,
        )
        for call, (base_len, _), prompt, completion, logprob, value, per_token_view, values in zip(
            calls,
            prompts,
            prompt_column.views(),
            completion_column.views(),
            logprob_views,
            advantages,
            per_token_views,
            plain,
            strict=True,
        )
    ]
    calls_of, first = [], 0
    for agent in wire.agents:
        calls_of.append(built[first : first + len(agent.calls)])
        first += len(agent.calls)
    columns = CallColumns(
        ids=[c.id for c in built],
        seqs=[c.seq for c in built],
        policy_versions=[c.policy_version for c in built],
        purposes=[c.purpose for c in built],
        kept=[c.kept for c in built],
        advantage=[a if isinstance(a, float) else None for a in (c.advantages for c in built)],
        prompt_suffix_ids=prompt_column,
        completion_ids=completion_column,
        logprobs=logprobs,
        advantages=per_token,
        sampling=[c.sampling for c in built],
    )
    return calls_of, columns


def _compact_prompt(call: WireCall) -> tuple[int, msgspec.Raw] | None:
    """The prompt's reference length and its token list as given (either form), or None when
    the call holds both forms or an incomplete one."""
    if call.prompt_ids is not UNSET:
        complete = call.prompt_from is call.prompt_from_len is call.prompt_suffix_ids is UNSET
        return (0, call.prompt_ids) if complete else None  # type: ignore[return-value]
    if UNSET in (call.prompt_from, call.prompt_from_len, call.prompt_suffix_ids):
        return None
    return call.prompt_from_len, call.prompt_suffix_ids  # type: ignore[return-value]


def _advantage(value: float | list[float] | None, per_token: np.ndarray | None) -> Any:
    """A call's advantages as the record holds them: a float, its per-token view, or None."""
    if isinstance(value, list):
        return per_token
    return None if value is None else float(value)


def _token_lists(lists: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray] | None:
    """JSON lists of token ids (raw text) parsed by numpy into one int32 buffer and offsets
    (list i is `values[offsets[i]:offsets[i + 1]]`). None when any list holds more than
    non-negative int32 ids written plainly, or is not raw text.

    msgspec has checked each list is valid JSON; numpy refuses anything but numbers between
    the commas, and a list opening with a digit holds at least one (a list of blanks would
    read as a zero).
    """
    arrays = []
    try:
        for raw in lists:
            if type(raw) is not msgspec.Raw:  # lists built in code rather than read
                return None
            text = bytes(raw)
            if len(text) == 2:
                arrays.append(_NO_IDS)
            elif 48 <= text[1] <= 57:  # a digit
                arrays.append(np.fromstring(text[1:-1], dtype=np.int64, sep=","))
            else:
                return None
    except ValueError:  # anything but plain ids
        return None
    values = np.concatenate(arrays) if arrays else _NO_IDS
    if values.size and (values.min() < 0 or values.max() > TOKEN_MAX):
        return None
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, arrays), np.int64, len(arrays)), out=offsets[1:])
    return values.astype(TOKEN_DTYPE), offsets


_NO_IDS = np.zeros(0, dtype=np.int64)


def _float_lists(lists: list[list[float] | None]) -> ListColumn:
    """Lists of floats (None for a missing one) as one float64 buffer with offsets."""
    lengths = np.fromiter((0 if v is None else len(v) for v in lists), np.int64, len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = chain.from_iterable(v for v in lists if v is not None)
    values = np.fromiter(present, LOGPROB_DTYPE, int(offsets[-1]))
    null = np.fromiter((v is None for v in lists), bool, len(lists))
    return ListColumn(values, offsets, null)


def _call_from_wire(wire: WireCall, episode: str) -> Call:
    """The call as given; its values are checked with its episode's (`checks.call_problems`)."""
    base_len, suffix = _prompt_from_wire(wire, episode)
    value = wire.advantages
    return Call(
        id=wire.id,
        seq=wire.seq,
        completion_ids=token_array(wire.completion_ids, episode, wire.id, "completion_ids"),
        prompt_suffix=suffix,
        prompt_from_len=base_len,
        logprobs=_floats(wire.logprobs),
        routes=_routes(wire.routes),
        routes_from=0 if wire.routes_from is UNSET else wire.routes_from,
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


def _routes(routes: Any) -> np.ndarray | None:
    """A call's routes as an array; their shape is checked with the episode's (an empty list,
    routes over no position, takes its layers and experts there: `shape_empty_routes`)."""
    if routes is UNSET or routes is None:
        return None
    return np.asarray(routes, dtype=ROUTE_DTYPE)


def shape_empty_routes(calls: Sequence[Call]) -> None:
    """Routes over no position, which a JSON list cannot shape, as (0, layers, k) of the
    episode's other calls ((0, 0, 0) when none has any)."""
    shaped = next(
        (c.routes.shape[1:] for c in calls if c.routes is not None and c.routes.ndim == 3),
        (0, 0),
    )
    for call in calls:
        if call.routes is not None and call.routes.size == 0 and call.routes.ndim != 3:
            call.routes = call.routes.reshape(0, *shaped)


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


# How a token or value array goes onto the wire: a list (the default), or, for encoding only,
# its JSON text (`formats.jsonl.json_numbers`).
Numbers = Callable[[np.ndarray], Any]


def episode_to_wire(episode: Episode, numbers: Numbers = np.ndarray.tolist) -> WireEpisode:
    """The wire form; prompts are written compactly wherever the record holds a base.
    `numbers` turns each token or value array into its wire value."""
    return WireEpisode(
        format=FORMAT,
        errors=list(episode.errors),
        rewards=dict(episode.rewards),
        agents=[_agent_to_wire(a, numbers) for a in episode.agents],
        gaps=UNSET if episode.gaps is None else gaps_to_json(episode.gaps),
        **{name: getattr(episode, name) for name in _PLAIN_EPISODE_FIELDS},
        **{name: _unset_if_none(getattr(episode, name)) for name in _OPTIONAL_EPISODE_FIELDS},
    )


def _agent_to_wire(agent: Agent, numbers: Numbers) -> WireAgent:
    return WireAgent(
        id=agent.id,
        name=agent.name,
        parent=agent.parent,
        start=agent.start,
        trainable=agent.trainable,
        calls=[_call_to_wire(c, numbers) for c in agent.calls],
        rewards=UNSET if agent.rewards is None else agent.rewards,
        meta=UNSET
        if agent.spawn is None and agent.meta is None
        else join_spawn(agent.spawn, agent.meta),
    )


def _call_to_wire(call: Call, numbers: Numbers) -> WireCall:
    wire = WireCall(
        id=call.id,
        seq=call.seq,
        completion_ids=numbers(call.completion_ids),
        logprobs=None if call.logprobs is None else numbers(call.logprobs),
        **plain_call_values(call),
    )
    if call.prompt_from is None:
        wire.prompt_ids = numbers(call.prompt_suffix)
    else:
        wire.prompt_from = call.prompt_from
        wire.prompt_from_len = call.prompt_from_len
        wire.prompt_suffix_ids = numbers(call.prompt_suffix)
    if call.routes is not None:
        wire.routes = numbers(call.routes)
        if call.routes_from:
            wire.routes_from = call.routes_from
    if call.advantages is not None:
        advantages = call.advantages
        wire.advantages = (
            numbers(advantages) if isinstance(advantages, np.ndarray) else float(advantages)
        )
    return wire
