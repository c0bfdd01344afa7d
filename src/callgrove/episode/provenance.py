"""Where an episode's parts came from: recorded gaps and the calls that started subagents.

Importers and converters meet sources that cannot always give every call or link. What they
could not give is a `Gap` on the episode, never dropped in silence; the call that started a
subagent is its agent's `Spawn`. Both are typed in memory and plain JSON objects in files (the
gap list is the episode's `gaps`; a spawn is kept in the agent's `meta` under `spawned_by`,
`tool_use_id`, `link` and `description`), so files written before either was typed still read.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from callgrove.formats.problems import InputError, Problem


class Gap(msgspec.Struct, frozen=True, kw_only=True):
    """A part of the source that could not become a call or a link, and why."""

    kind: str  # a stable name to count by, e.g. `subagent_file_missing`
    reason: str | UnsetType = UNSET  # for a person: what is missing and what was done instead
    agent: str | UnsetType | None = UNSET  # the agent it concerns, when one does
    call: str | UnsetType | None = UNSET  # the call it concerns, when one does
    calls: list[str] | UnsetType = UNSET  # several calls it concerns
    file: str | UnsetType | None = UNSET  # the source file it was found in
    line: int | UnsetType | None = UNSET  # the line of that file
    detail: dict[str, Any] = {}  # any other field the source wrote, kept as written

    def to_json(self) -> dict[str, Any]:
        out = {**self.detail, **msgspec.to_builtins(self)}
        out.pop("detail", None)
        return out


# Gap kinds that say a model call the policy sampled did not become a call that can train (its
# tokens were not recorded, or the file holding it is not there): the input accounting counts
# each as a lost call, and no command says "each trained exactly once" while one is there. Every
# other kind records a link, a label or text that was not recovered; the calls are all there.
LOST_CALL_GAPS = frozenset(
    (
        "atif_step_without_token_ids",
        "atif_aggregated_step",
        "atif_continuation_missing",
        "subagent_file_missing",
        "subagent_transcript_missing",
        "delta_chain_unreconstructable",
    )
)

_GAP_FIELDS = frozenset(Gap.__struct_fields__) - {"detail"}


def gap_from_json(value: Any, episode: str | None = None) -> Gap:
    """A gap read from a file: fields it names are checked, others kept in `detail`."""
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise InputError(
            Problem(f"a gap must be an object with a string kind, found {value!r}", episode=episode)
        )
    known = {k: v for k, v in value.items() if k in _GAP_FIELDS}
    try:
        found = msgspec.convert(known, Gap)
    except msgspec.ValidationError as error:
        raise InputError(Problem(f"gap {value['kind']!r}: {error}", episode=episode)) from None
    detail = {k: v for k, v in value.items() if k not in _GAP_FIELDS}
    return msgspec.structs.replace(found, detail=detail) if detail else found


def gaps_from_json(value: Any, episode: str | None = None) -> list[Gap] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError(Problem(f"gaps must be a list, found {value!r}", episode=episode))
    return [gap_from_json(item, episode) for item in value]


def gaps_to_json(gaps: list[Gap] | None) -> list[dict[str, Any]] | None:
    return None if gaps is None else [gap.to_json() for gap in gaps]


class Spawn(msgspec.Struct, frozen=True, kw_only=True):
    """The call that started a subagent, and how the link was found."""

    call: str  # id of the parent agent's call that started it
    tool_call_id: str | None = None  # the spawning tool call inside that call's answer
    link: str | None = None  # what in the source tied them together
    description: str | None = None  # the task description the parent wrote, when given


_SPAWN_KEYS = {
    "spawned_by": "call",
    "tool_use_id": "tool_call_id",
    "link": "link",
    "description": "description",
}


def split_spawn(
    meta: dict[str, Any] | None,
) -> tuple[Spawn | None, dict[str, Any] | None]:
    """An agent's spawn out of its file `meta`, and the rest of the meta."""
    if not meta or not isinstance(meta.get("spawned_by"), str):
        return None, meta
    values = {field: meta[key] for key, field in _SPAWN_KEYS.items() if key in meta}
    if not all(isinstance(v, str) for v in values.values()):
        return None, meta  # not written by callgrove: left as the source wrote it
    rest = {k: v for k, v in meta.items() if k not in _SPAWN_KEYS}
    return Spawn(**values), rest or None


def join_spawn(spawn: Spawn | None, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The file `meta` of an agent: its meta with its spawn's fields."""
    if spawn is None:
        return meta
    fields = {key: getattr(spawn, field) for key, field in _SPAWN_KEYS.items()}
    return {**(meta or {}), **{k: v for k, v in fields.items() if v is not None}}
