"""Every rule of one episode (docs/episode-format.md, "What a reader checks"), each with its
message, written once.

The JSON reader, the binary reader and the writers (`save`, `open_writer`) all check through
here. Call rules run column-wise: a batch of calls is a few numpy buffers plus offsets
(`CallColumns`), each rule is tested over the whole batch at once, and only a batch that breaks
one is searched for the calls that do. The binary reader hands its Arrow buffers over without a
copy; records are gathered into the same columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np
from msgspec import UNSET

from callgrove.episode.record import (
    AGENT_STARTS,
    NO_ROUTE,
    PURPOSES,
    RUN_TYPES,
    TOKEN_DTYPE,
    Call,
    Episode,
    check_distribution,
    not_an_earlier_call,
)
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.wire import WireEpisode, WireRun

EMPTY_COMPLETION = "completion_ids is empty (a call samples at least one token)"

# The fields the format requires (docs/episode-format.md, section 1) that a record might lack:
# a JSON line that leaves one out, or a null in a binary column that holds no nulls. The rest
# (`format`, the ids, `seq`, `completion_ids`, an error's `type`) the JSON
# decoder requires by itself. Only `kept` has a default (true); `rewards` of an agent, and
# callgrove's extras, are optional.
REQUIRED_EPISODE = ("group", "env", "task", "run", "ok", "errors", "rewards", "agents")
REQUIRED_ENV = ("id", "name")
REQUIRED_RUN = ("id", "type", "step", "policy")
REQUIRED_ERROR = ("message",)
REQUIRED_AGENT = ("name", "parent", "start", "trainable", "calls")
REQUIRED_CALL = ("logprobs", "policy_version", "purpose")


def fail(message: str, episode: str | None, call: str | None = None) -> InputError:
    return InputError(Problem(message, episode=episode, call=call))


def unexpected(subject: str, value: object, allowed: Sequence[str]) -> str:
    return f"{subject} {value!r}, expected one of {', '.join(allowed)}"


def lacks(subject: str, names: Sequence[str]) -> str:
    plural = "s" if len(names) > 1 else ""
    return f"{subject} lacks required field{plural} {', '.join(names)} (nothing is filled in)"


def check_present(wire: WireEpisode) -> None:
    """Every field the format requires is in the record; the reading form (`formats.wire`)
    leaves a field the line lacks unset."""

    def require(record: object, names: Sequence[str], subject: str, call: str | None = None):
        gone = [name for name in names if getattr(record, name) is UNSET]
        if gone:
            raise fail(lacks(subject, gone), wire.id, call)

    require(wire, REQUIRED_EPISODE, "episode")
    if wire.env is not None:
        require(wire.env, REQUIRED_ENV, "env")
    if wire.run is not None:
        require(wire.run, REQUIRED_RUN, "run")
    for index, error in enumerate(wire.errors):
        require(error, REQUIRED_ERROR, f"errors[{index}]")
    for agent in wire.agents:
        require(agent, REQUIRED_AGENT, f"agent {agent.id!r}")
        for call in agent.calls:
            require(call, REQUIRED_CALL, "call", call.id)


# Token ids are stored as signed 32-bit integers in every form.
TOKEN_MAX = int(np.iinfo(TOKEN_DTYPE).max)


def negative_token(field: str) -> str:
    return f"{field} holds a negative token id"


def not_a_token_id(field: str) -> str:
    return f"{field} holds a value that is not a token id in [0, {TOKEN_MAX}]"


def not_finite(field: str, per_token: bool = True) -> str:
    if per_token:
        return f"{field} holds a value that is not a finite number"
    return f"{field} is not a finite number"


# Integers are stored as signed 64-bit values in the binary form and by every consumer of the
# format; JSON alone could carry more.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def out_of_range(field: str, value: int) -> str:
    return f"{field} {value} does not fit a signed 64-bit integer"


def fits_int64(values: Sequence[int | None]) -> bool:
    present = [v for v in values if v is not None]
    return not present or (min(present) >= INT64_MIN and max(present) <= INT64_MAX)


POSITIVE_LOGPROB = "logprobs holds a value above 0 (a log-probability is at most 0)"


def wrong_length(field: str, values: int, tokens: int) -> str:
    return f"{field} has {values} values but completion_ids has {tokens} tokens"


_NO_FLAGS = np.zeros(0, dtype=bool)


def _nothing(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


def _narrowed(arrays: Sequence[np.ndarray], dtype: np.dtype) -> bool:
    """Whether casting `arrays` to the integer `dtype` would change a value (a token id past
    what the stored type holds would wrap around)."""
    if dtype.kind not in "iu":
        return False
    wide = np.result_type(*arrays)
    if wide.kind not in "iu" or np.can_cast(wide, dtype):
        return False
    limits = np.iinfo(dtype)
    return any(a.size and (a.min() < limits.min or a.max() > limits.max) for a in arrays)


class ListColumn:
    """One list field of a batch of calls: a flat numpy buffer, offsets, and which items are
    null (None). Item i is `values[offsets[i]:offsets[i + 1]]`."""

    def __init__(
        self,
        values: np.ndarray,
        offsets: np.ndarray,
        null: np.ndarray,
        bad_values: np.ndarray | None = None,
    ):
        self.values = values
        self.offsets = offsets
        self.lengths = offsets[1:] - offsets[:-1]
        self.null = null
        # values the source marked missing (a null inside an Arrow list), where it can
        self.bad_values = _NO_FLAGS if bad_values is None else bad_values

    @classmethod
    def of(
        cls,
        arrays: Sequence[np.ndarray | None],
        dtype: type,
        room: Callable[[int], np.ndarray] | None = None,
    ) -> ListColumn:
        """The column of `arrays` (None: a null list): their lengths counted and their values
        copied into one buffer, one numpy call each for the whole batch. `room(n)`, where
        given, is where the n values go (a writer's batch buffer, cast to its type)."""
        count = len(arrays)
        nulls = [a is None for a in arrays]
        present = [a for a in arrays if a is not None] if any(nulls) else arrays
        lengths = np.fromiter(map(len, present), np.int64, len(present))
        offsets = np.zeros(count + 1, dtype=np.int64)
        if len(present) == count:
            np.cumsum(lengths, out=offsets[1:])
        elif present:
            spread = np.zeros(count, dtype=np.int64)
            spread[~np.array(nulls)] = lengths
            np.cumsum(spread, out=offsets[1:])
        if room is not None:
            values = room(int(offsets[-1]))
            if present and _narrowed(present, values.dtype):
                # kept wide, out of the room: the rules flag it and nothing is written
                return cls(np.concatenate(present), offsets, np.array(nulls, dtype=bool))
            if present:
                np.concatenate(present, out=values)
        else:
            values = np.concatenate(present) if present else _nothing(dtype)
        return cls(values, offsets, np.array(nulls, dtype=bool))

    def views(self) -> list[np.ndarray | None]:
        """Item i as a view into the buffer, None where the list is null."""
        values, bounds = self.values, self.offsets.tolist()
        return [
            None if null else values[start:end]
            for start, end, null in zip(bounds[:-1], bounds[1:], self.null.tolist(), strict=True)
        ]

    def items_where(self, flagged_values: np.ndarray) -> np.ndarray:
        """Indices of the items that hold a flagged value."""
        positions = np.flatnonzero(flagged_values)
        return np.unique(np.searchsorted(self.offsets, positions, side="right") - 1)


@dataclass
class CallColumns:
    """The checked fields of a batch of calls, one entry (or list item) per call."""

    ids: list[str | None]
    seqs: list[int | None]
    policy_versions: list[int | None]
    purposes: list[str | None]
    kept: list[bool | None]
    advantage: list[float | None]  # the scalar advantages
    prompt_suffix_ids: ListColumn
    completion_ids: ListColumn
    logprobs: ListColumn
    advantages: ListColumn  # the per-token advantages
    sampling: list[object]  # each call's `sampling` as given (None: unknown)

    @classmethod
    def of_calls(cls, calls: Sequence[Call], room: Room | None = None) -> CallColumns:
        """The calls' checked fields; `room(field, n)`, where given, is where a list field's
        n values go (`ListColumn.of`)."""
        per_token = [c.advantages if isinstance(c.advantages, np.ndarray) else None for c in calls]
        return cls(
            ids=[c.id for c in calls],
            seqs=[c.seq for c in calls],
            policy_versions=[c.policy_version for c in calls],
            purposes=[c.purpose for c in calls],
            kept=[c.kept for c in calls],
            advantage=[
                None
                if c.advantages is None or isinstance(c.advantages, np.ndarray)
                else c.advantages
                for c in calls
            ],
            prompt_suffix_ids=prompt_suffix_column(calls, room),
            completion_ids=ListColumn.of(
                [c.completion_ids for c in calls], np.int64, _into(room, "completion_ids")
            ),
            logprobs=ListColumn.of(
                [c.logprobs for c in calls], np.float64, _into(room, "logprobs")
            ),
            advantages=ListColumn.of(per_token, np.float64, _into(room, "advantages")),
            sampling=[c.sampling for c in calls],
        )


# Where a writer gathers a list field's values: `room(field, n)` is an array of n values.
Room = Callable[[str, int], np.ndarray]


def _into(room: Room | None, field: str) -> Callable[[int], np.ndarray] | None:
    return None if room is None else partial(room, field)


def prompt_suffix_column(calls: Iterable[Call], room: Room | None = None) -> ListColumn:
    """The stored prompt tokens of `calls` (each call's suffix after its base)."""
    suffixes = [c.prompt_suffix for c in calls]
    return ListColumn.of(suffixes, np.int64, _into(room, "prompt_suffix_ids"))


def _holds_past_token_max(values: np.ndarray) -> bool:
    """Only an array of a type the stored one cannot hold can (one built in code)."""
    return (
        values.size > 0 and not np.can_cast(values.dtype, TOKEN_DTYPE) and values.max() > TOKEN_MAX
    )


def call_problems(columns: CallColumns) -> dict[int, str]:
    """The first problem of each call that has one, by its index in the batch."""
    problems: dict[int, str] = {}

    def flag(indices: Iterable[int], message: str) -> None:
        for index in indices:
            problems.setdefault(int(index), message)

    # Each rule is first tested over the whole batch; only one that fails is searched.
    for name in ("prompt_suffix_ids", "completion_ids"):
        column: ListColumn = getattr(columns, name)
        if column.null.any():
            flag(np.flatnonzero(column.null), f"{name} is missing")
        if column.bad_values.any():
            flag(column.items_where(column.bad_values), f"{name} holds a null token id")
        if column.values.size and column.values.min() < 0:
            flag(column.items_where(column.values < 0), negative_token(name))
        if _holds_past_token_max(column.values):
            flag(column.items_where(column.values > TOKEN_MAX), not_a_token_id(name))
    completion = columns.completion_ids
    if completion.lengths.size and completion.lengths.min() == 0:
        flag(np.flatnonzero(completion.lengths == 0), EMPTY_COMPLETION)
    for name in ("logprobs", "advantages"):
        column = getattr(columns, name)
        mismatched = ~column.null & (column.lengths != completion.lengths)
        if mismatched.any():
            for index in np.flatnonzero(mismatched):
                flag([index], wrong_length(name, column.lengths[index], completion.lengths[index]))
        if column.bad_values.any() or not np.isfinite(column.values).all():
            bad = ~np.isfinite(column.values)
            if column.bad_values.size:
                bad |= column.bad_values
            flag(column.items_where(bad), not_finite(name))
    positive = columns.logprobs.values > 0
    if positive.any():
        flag(columns.logprobs.items_where(positive), POSITIVE_LOGPROB)
    for index, sampling in enumerate(columns.sampling):
        if sampling is not None and (problem := sampling_problem(sampling)) is not None:
            flag([index], problem)
    if (
        set(columns.purposes) <= set(PURPOSES)
        and all(a is None for a in columns.advantage)
        and None not in columns.ids
        and None not in columns.seqs
        and None not in columns.kept
        and fits_int64(columns.seqs)
        and fits_int64(columns.policy_versions)
    ):
        return problems
    for index, purpose in enumerate(columns.purposes):
        advantage = columns.advantage[index]
        seq, version = columns.seqs[index], columns.policy_versions[index]
        # only a binary column can hold such nulls: the JSON decoder requires these fields
        values = {"id": columns.ids[index], "seq": seq, "purpose": purpose}
        values["kept"] = columns.kept[index]
        gone = [name for name, value in values.items() if value is None]
        if gone:
            flag([index], lacks("call", gone))
        elif not fits_int64([seq]):
            flag([index], out_of_range("seq", seq))  # type: ignore[arg-type]
        elif not fits_int64([version]):
            flag([index], out_of_range("policy_version", version))  # type: ignore[arg-type]
        elif purpose not in PURPOSES:
            flag([index], unexpected("purpose is", purpose, PURPOSES))
        elif advantage is not None and not columns.advantages.null[index]:
            flag([index], "call has both a scalar and a per-token advantage")
        elif advantage is not None and not math.isfinite(advantage):
            flag([index], not_finite("advantages", per_token=False))
    return problems


def sampling_problem(sampling: object) -> str | None:
    """What is wrong with a call's `sampling` (docs/episode-format.md), or None: an object
    whose `temperature` is a finite number >= 0 (0: greedy), `top_p` a number in (0, 1] and
    `top_k`, when given, an int >= 1 or null (no top-k cut); other keys are free."""
    if not isinstance(sampling, dict):
        return f"sampling must be an object or null, not {sampling!r}"
    missing = [key for key in ("temperature", "top_p") if key not in sampling]
    if missing:
        return lacks("sampling", missing)
    try:
        check_distribution(
            sampling["temperature"], sampling["top_p"], sampling.get("top_k"), "sampling."
        )
    except ValueError as error:
        return str(error)
    return None


def check_run(episode: str, run: WireRun | None, rewards: dict[str, float]) -> None:
    """Rewards are finite; the run's type is known and its policy span runs forward."""
    for name, value in rewards.items():
        if not math.isfinite(value):
            raise fail(f"reward {name!r} is not a finite number", episode)
    if run is None:
        return
    if run.type not in RUN_TYPES:
        raise fail(unexpected("run.type is", run.type, RUN_TYPES), episode)
    numbers = {"run.step": run.step}
    if run.policy is not None:
        numbers.update({"run.policy.start": run.policy.start, "run.policy.end": run.policy.end})
    for name, value in numbers.items():
        if value is not None and not fits_int64([value]):
            raise fail(out_of_range(name, value), episode)
    if run.policy is not None and run.policy.end < run.policy.start:
        raise fail(
            f"run.policy.end ({run.policy.end}) is before run.policy.start ({run.policy.start})",
            episode,
        )


class _AgentLike(Protocol):
    id: str
    parent: str | None
    start: str


def check_agents(agents: Sequence[_AgentLike], episode: str) -> None:
    """Agent starts are known, ids unique, and every `parent` names another agent."""
    seen: set[str] = set()
    for agent in agents:
        if agent.start not in AGENT_STARTS:
            raise fail(
                unexpected(f"agent {agent.id!r} has start", agent.start, AGENT_STARTS), episode
            )
        if agent.id in seen:
            raise fail(f"agent id {agent.id!r} appears twice", episode)
        seen.add(agent.id)
    for agent in agents:
        if agent.parent is not None and agent.parent not in seen:
            raise fail(
                f"agent {agent.id!r} names parent agent {agent.parent!r}, which is not in the episode",
                episode,
            )
        if agent.parent == agent.id:
            raise fail(f"agent {agent.id!r} names itself as its parent", episode)


def check_unique_calls(calls: Sequence[Call], episode: str) -> None:
    """No call id or `seq` appears twice in the episode."""
    if len({c.id for c in calls}) == len({c.seq for c in calls}) == len(calls):
        return
    ids: set[str] = set()
    seqs: dict[int, str] = {}
    for call in calls:
        if call.id in ids:
            raise fail(f"call id {call.id!r} appears twice", episode, call.id)
        ids.add(call.id)
        if call.seq in seqs:
            raise fail(
                f"seq {call.seq} is used by both {seqs[call.seq]!r} and {call.id!r}",
                episode,
                call.id,
            )
        seqs[call.seq] = call.id


DUPLICATE = "duplicate"  # the kind of problem of a second copy of an episode id


def duplicate_episode(episode: str, first: str, file: str, line: int | None = None) -> Problem:
    """An episode id seen earlier in the same file (`first` says where): the later copy is
    not used."""
    return Problem(
        f"episode id appears twice in the file (first at {first}); this copy is not used",
        file=file,
        line=line,
        episode=episode,
        kind=DUPLICATE,
    )


def read_twice(episode: str, why: str, file: str, line: int | None = None) -> Problem:
    """An episode read before in another input (or the same input given twice; `why` says
    where, and by what it is the same): the later copy is not used."""
    return Problem(
        f"{why}: read twice, its calls would train twice; this copy is not used",
        file=file,
        line=line,
        episode=episode,
        kind=DUPLICATE,
        group=None,  # not a lost episode (its first copy is used): no group is refused for it
    )


def resolve_prompts(calls: Sequence[Call], prompt_from: Sequence[str | None], episode: str) -> None:
    """Set each compact prompt's reference to the earlier call it starts from (`prompt_from[i]`
    names call i's), checking that it is an earlier call of the episode and long enough."""
    if not any(prompt_from):
        return
    by_id = {c.id: c for c in calls}
    for call, source_id in zip(calls, prompt_from, strict=True):
        if source_id is None:
            continue
        source = by_id.get(source_id)
        if source is None or source.seq >= call.seq:
            raise fail(not_an_earlier_call(source_id), episode, call.id)
        if not 0 <= call.prompt_from_len <= source.full_len:
            raise fail(
                f"prompt_from_len {call.prompt_from_len} is outside [0, {source.full_len}], "
                f"the length of {source.id!r}'s full sequence",
                episode,
                call.id,
            )
        call.prompt_from = source_id if call.prompt_from_len else None


def check_routes(calls: Sequence[Call], episode: str) -> None:
    """Each call's routes (after `resolve_prompts`): three dimensions, one per position from
    `routes_from` to the full sequence's last token but one, the same layers and experts per
    token in every call of the episode, each an expert index (`NO_ROUTE`: none); `routes_from`
    within the prompt it resends."""
    shape = None
    for call in calls:
        routes = call.routes
        limit = max(call.prompt_from_len - 1, 0) if call.prompt_from is not None else 0
        if not 0 <= call.routes_from <= limit:
            raise fail(
                f"routes_from {call.routes_from} is outside [0, {limit}] (it counts positions "
                "of the resent prompt_from call)",
                episode,
                call.id,
            )
        if routes is None:
            continue
        wanted = call.full_len - 1 - call.routes_from
        if routes.ndim != 3 or len(routes) != wanted:
            raise fail(
                f"routes have shape {list(routes.shape)}: expected [{wanted}, layers, experts "
                "per token] (the full sequence from routes_from, but its last token)",
                episode,
                call.id,
            )
        if shape is not None and routes.shape[1:] != shape:
            raise fail(
                f"routes of {list(routes.shape[1:])} layers x experts where an earlier call "
                f"has {list(shape)}",
                episode,
                call.id,
            )
        shape = routes.shape[1:]
        if routes.size and routes.min() < NO_ROUTE:
            raise fail(f"routes hold an expert index below {NO_ROUTE}", episode, call.id)


def raise_first(
    problems: dict[int, str],
    ids: Sequence[str | None],
    first: int,
    end: int,
    episode: str | None = None,
) -> None:
    """Raise the first problem among calls `first`..`end - 1` (one episode's calls)."""
    for index in range(first, end):
        if index in problems:
            raise fail(problems[index], episode, ids[index])


def check_episode(episode: Episode, room: Room | None = None) -> CallColumns:
    """Every rule, over a record built in code or read from a file; raises `InputError`
    naming the episode and the call. Returns the calls gathered into the columns the rules
    ran on; with `room`, a writer's buffers hold their values (`CallColumns.of_calls`), so
    it writes the very values checked."""
    check_run(episode.id, episode.run, episode.rewards)
    check_agents(episode.agents, episode.id)
    calls = list(episode.calls())
    check_unique_calls(calls, episode.id)
    columns = CallColumns.of_calls(calls, room)
    raise_first(call_problems(columns), columns.ids, 0, len(calls), episode.id)
    resolve_prompts(calls, [c.prompt_from for c in calls], episode.id)
    check_routes(calls, episode.id)
    return columns
