"""The JSON contract of `callgrove.episode/1` as msgspec Structs.

These mirror docs/episode-format.md field for field. They are what bytes decode into and encode from; the
typed in-memory record (numpy tokens, resolved prompt references) lives in `callgrove.episode`.
Fields typed with `UnsetType` are left out of the JSON when unset, so a call never carries both
prompt forms and optional extras stay optional.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

FORMAT = "callgrove.episode/1"


class CallFields(msgspec.Struct, kw_only=True):
    """The call's fields that the file and the in-memory record hold alike: `WireCall` and
    `callgrove.episode.Call` both inherit them. A new such field is one line here (and its
    docs): the JSON codec, the Arrow schema, the binary writer and reader take it from here
    (`episode.codec.PLAIN_CALL_FIELDS`)."""

    id: str
    seq: int
    policy_version: int | None = None  # the policy that sampled it
    purpose: str = "turn"  # `turn`, or `compaction` for a summary of the agent's history
    kept: bool = True  # False: sampled but not continued (a dropped compaction attempt)


class WireCall(CallFields, kw_only=True):
    """A call as the file holds it: tokens as lists, the prompt in one of its two forms."""

    prompt_ids: list[int] | UnsetType = UNSET
    prompt_from: str | UnsetType = UNSET
    prompt_from_len: int | UnsetType = UNSET
    prompt_suffix_ids: list[int] | UnsetType = UNSET
    completion_ids: list[int]
    logprobs: list[float] | None = None
    # Project extras: credit written back onto the call (a scalar or one value per completion
    # token), and message-level content kept by transcript importers for display.
    advantages: float | list[float] | UnsetType | None = UNSET
    content: Any | UnsetType = UNSET
    # Which distribution `logprobs` are under (`SAMPLING_KEYS`, more keys allowed): absent or
    # null means unknown, and nothing assumes a value for it (`episode.checks` holds its rules).
    sampling: dict[str, Any] | UnsetType | None = UNSET
    # A mixture of experts' routes: per forwarded token from `routes_from` (the full sequence
    # but its last token), per MoE layer, the experts its router chose.
    routes: list[list[list[int]]] | UnsetType | None = UNSET
    # The first position `routes` covers (absent: 0); those before are `prompt_from`'s routes.
    routes_from: int | UnsetType = UNSET


# The keys of a call's `sampling` that name its distribution; any others are carried as they are.
SAMPLING_KEYS = ("temperature", "top_p", "top_k")


class WireAgent(msgspec.Struct, kw_only=True):
    id: str
    name: str
    parent: str | None = None
    start: str = "root"
    trainable: bool = True
    calls: list[WireCall] = []
    rewards: dict[str, float] | UnsetType = UNSET
    meta: dict[str, Any] | UnsetType = UNSET


class WireEnv(msgspec.Struct, kw_only=True):
    id: str | None = None
    name: str | None = None


class WirePolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):  # read as it is
    start: int
    end: int


class WireRun(msgspec.Struct, kw_only=True):
    id: str | None = None
    type: str = "train"
    step: int | None = None
    policy: WirePolicy | None = None


class WireError(msgspec.Struct, kw_only=True):
    type: str
    message: str = ""
    agent: str | UnsetType = UNSET
    call: str | UnsetType = UNSET


class WireEpisode(msgspec.Struct, kw_only=True):
    format: str
    id: str
    group: str | None = None
    env: WireEnv | None = None
    task: Any = None
    run: WireRun | None = None
    ok: bool = True
    errors: list[WireError] = []
    rewards: dict[str, float] = {}
    agents: list[WireAgent] = []
    # Project extras: what the rows are for (`rl`, or `supervised` for transcripts without
    # sampling logprobs), and links an importer could not recover.
    objective: str | UnsetType = UNSET
    gaps: list[dict[str, Any]] | UnsetType = UNSET
    meta: dict[str, Any] | UnsetType = UNSET


# The reading forms: every field the format requires but the structs above default (so that
# code can build records briefly) is unset when a line lacks it, and `episode.checks` refuses
# the record naming the field; nothing is filled in. A field the format does not have is not
# passed over quietly either: decoding stops at it, and `formats.jsonl` names every such field.
class _ReadCall(WireCall, kw_only=True, forbid_unknown_fields=True):
    # Token lists are kept as their raw JSON text when reading: `episode.codec.token_array`
    # parses them straight into numpy, much faster than building Python int lists first.
    prompt_ids: msgspec.Raw | UnsetType = UNSET
    prompt_suffix_ids: msgspec.Raw | UnsetType = UNSET
    completion_ids: msgspec.Raw
    logprobs: list[float] | UnsetType | None = UNSET
    policy_version: int | UnsetType | None = UNSET
    purpose: str | UnsetType = UNSET


class _ReadAgent(WireAgent, kw_only=True, forbid_unknown_fields=True):
    name: str | UnsetType = UNSET
    parent: str | UnsetType | None = UNSET
    start: str | UnsetType = UNSET
    trainable: bool | UnsetType = UNSET
    calls: list[_ReadCall] | UnsetType = UNSET


class _ReadEnv(WireEnv, kw_only=True, forbid_unknown_fields=True):
    id: str | UnsetType | None = UNSET
    name: str | UnsetType | None = UNSET


class _ReadRun(WireRun, kw_only=True, forbid_unknown_fields=True):
    id: str | UnsetType | None = UNSET
    type: str | UnsetType = UNSET
    step: int | UnsetType | None = UNSET
    policy: WirePolicy | UnsetType | None = UNSET


class _ReadError(WireError, kw_only=True, forbid_unknown_fields=True):
    message: str | UnsetType = UNSET


class _ReadEpisode(WireEpisode, kw_only=True, forbid_unknown_fields=True):
    group: str | UnsetType | None = UNSET
    env: _ReadEnv | UnsetType | None = UNSET
    task: Any = UNSET
    run: _ReadRun | UnsetType | None = UNSET
    ok: bool | UnsetType = UNSET
    errors: list[_ReadError] | UnsetType = UNSET
    rewards: dict[str, float] | UnsetType = UNSET
    agents: list[_ReadAgent] | UnsetType = UNSET


episode_decoder = msgspec.json.Decoder(_ReadEpisode)
episode_encoder = msgspec.json.Encoder()

# Where each object of an episode line sits and the struct that lists its fields: the objects
# whose keys the format names (the others, `task`, `meta`, `gaps`, `content` and the reward
# maps, are free-form).
KNOWN_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(kind.__struct_fields__)
    for name, kind in (
        ("episode", WireEpisode),
        ("env", WireEnv),
        ("run", WireRun),
        ("policy", WirePolicy),
        ("error", WireError),
        ("agent", WireAgent),
        ("call", WireCall),
    )
}
