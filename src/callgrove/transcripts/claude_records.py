"""Claude Code session lines as typed records, decoded once where a line is read.

Every line is a JSON object tagged by `type`. `user`, `assistant`, `system` and
`fork-context-ref` lines are Structs of a tagged union; message content is a list of typed
blocks (a block of a kind not listed here is an `OtherBlock` naming its kind, so nothing of it
goes unseen). Any other kind (attachments, queue operations, request logs...) is an
`OtherLine`: it is no model message, but its `uuid`/`parentUuid` still link the tree. A line of
a known kind whose fields have unexpected types is an `OtherLine` carrying the reason.
"""

from __future__ import annotations

from typing import Any

import msgspec

# ---------------------------------------------------------------------------------------------
# Content blocks


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    text: str = ""


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    pass


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str | None = None
    name: str = ""
    input: Any = None


class ServerToolUseBlock(ToolUseBlock, tag="server_tool_use"):
    """A tool the API ran itself (web search); written like a tool call."""


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str | None = None
    content: Any = None  # a string or a list of blocks
    is_error: bool | None = None


class OtherBlock(msgspec.Struct, tag_field="type", tag="other"):
    """A block of another kind (image, document, a result of a server tool...)."""

    kind: str


Block = (
    TextBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ServerToolUseBlock
    | ToolResultBlock
    | OtherBlock
)
_BLOCK_KINDS = frozenset(
    {"text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "tool_result"}
)


def decode_block(value: Any) -> Block:
    """A content block as its typed record; a string is text."""
    if isinstance(value, str):
        return TextBlock(value)
    if not isinstance(value, dict):
        return OtherBlock(type(value).__name__)
    kind = value.get("type")
    if kind in _BLOCK_KINDS:
        try:
            return msgspec.convert(value, Block)  # type: ignore[arg-type]
        except msgspec.ValidationError:
            pass
    return OtherBlock(str(kind or "untyped"))


def decode_content(content: Any) -> list[Block]:
    """Message content (a string or a list of blocks) as typed blocks; an empty string or a
    missing content is no block."""
    if isinstance(content, list):
        return [decode_block(block) for block in content]
    return [TextBlock(content)] if isinstance(content, str) and content else []


def block_text(block: Block) -> str:
    """What a block reads as in plain text (a tool result's text or a user message)."""
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, OtherBlock):
        return f"[{block.kind}]"
    return f"[{block.__struct_config__.tag}]"


def content_text(content: Any) -> str:
    """Plain text of message or tool-result content; anything but a string or a list of
    blocks is written as JSON."""
    if content is None or isinstance(content, str | list):
        return "\n".join(block_text(block) for block in decode_content(content))
    return msgspec.json.encode(content).decode()


SPAWN_TOOLS = frozenset({"Agent", "Task"})
"""The tools a Claude Code leader starts a subagent with (releases have named it both ways)."""


class SpawnArguments(msgspec.Struct, kw_only=True):
    """The input of a Task/Agent tool call: the subagent it asks for."""

    prompt: str | None = None
    description: str | None = None
    subagent_type: str | None = None
    run_in_background: bool | None = None

    @classmethod
    def of(cls, arguments: Any) -> SpawnArguments:
        """The arguments as the model wrote them; fields of other types count as absent."""
        if not isinstance(arguments, dict):
            return cls()
        texts = {
            name: value
            for name in ("prompt", "description", "subagent_type")
            if isinstance(value := arguments.get(name), str)
        }
        background = arguments.get("run_in_background")
        return cls(**texts, run_in_background=background if isinstance(background, bool) else None)

    def start(
        self,
        *,
        ran_in_background: bool | None = None,
        forked: bool = False,
        version: str | None = None,
    ) -> str:
        """The started subagent's `start`, one rule for the gateway and the importer:
        `background` when it ran alongside its parent (as the harness reported it, else as the
        call asked, else the default of the CLI `version`), a fork that ran in the background
        included; else `fork` when it started from its parent's conversation (`forked`, or the
        `fork` subagent type); else `fresh`."""
        background = ran_in_background
        if background is None:
            background = self.run_in_background
        if background is None:
            background = background_by_default(version)
        if background:
            return "background"
        return "fork" if forked or self.subagent_type == "fork" else "fresh"


# Claude Code runs an Agent call that leaves out `run_in_background` in the foreground through
# 2.1.197 and in the background from the 2.1.198 line on.
BACKGROUND_BY_DEFAULT_SINCE = (2, 1, 198)


def background_by_default(version: str | None) -> bool:
    """Whether Claude Code `version` ("2.1.332") runs an Agent call in the background when the
    call does not say; an unknown version: no (it is not claimed without evidence)."""
    parts = (version or "").split(".")
    if len(parts) < 3 or not all(part.isdigit() for part in parts[:3]):
        return False
    return tuple(int(part) for part in parts[:3]) >= BACKGROUND_BY_DEFAULT_SINCE


# ---------------------------------------------------------------------------------------------
# Lines


class UserMessage(msgspec.Struct, kw_only=True):
    content: str | list[Block] = []  # always blocks once decoded (a string: one text block)

    def __post_init__(self) -> None:
        if isinstance(self.content, str):
            self.content = decode_content(self.content)


class AssistantMessage(msgspec.Struct, kw_only=True):
    id: str | None = None
    model: str | None = None
    content: str | list[Block] = []  # always blocks once decoded
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.content, str):
            self.content = decode_content(self.content)


class PreservedMessages(msgspec.Struct, kw_only=True, rename="camel"):
    uuids: list[str] = []
    anchor_uuid: str | None = None


class PreservedSegment(msgspec.Struct, kw_only=True, rename="camel"):
    """The newest messages a compaction kept verbatim after its summary: from `head` to
    `tail`. The summary was written without them."""

    head_uuid: str | None = None
    tail_uuid: str | None = None


class CompactMetadata(msgspec.Struct, kw_only=True, rename="camel"):
    trigger: str | None = None
    preserved_messages: PreservedMessages | None = None
    preserved_segment: PreservedSegment | None = None

    def first_kept(self) -> str | None:
        """The first message kept after the summary, if any was."""
        if self.preserved_segment is not None and self.preserved_segment.head_uuid:
            return self.preserved_segment.head_uuid
        kept = self.preserved_messages.uuids if self.preserved_messages is not None else []
        return kept[0] if kept else None


class LineLinks(msgspec.Struct, kw_only=True, rename="camel"):
    """What every line may carry: its place in the tree, its time, and what it retracts."""

    uuid: str | None = None
    parent_uuid: str | None = None
    timestamp: str | None = None
    is_sidechain: bool = False
    session_id: str | None = None
    agent_id: str | None = None
    version: str | None = None
    supersedes_uuids: list[str] = []
    retracted_message_uuids: list[str] = []


class UserLine(LineLinks, tag_field="type", tag="user"):
    message: UserMessage | None = None
    is_compact_summary: bool = False
    tool_use_result: Any = None  # the tool's own result; a subagent's names `agentId`

    def spawned_agent(self) -> tuple[str, str | None] | None:
        """(the subagent's id, its launch status) when this is a Task/Agent tool's result."""
        result = self.tool_use_result
        if not isinstance(result, dict) or not isinstance(result.get("agentId"), str):
            return None
        status = result.get("status")
        return result["agentId"], status if isinstance(status, str) else None


class AssistantLine(LineLinks, tag_field="type", tag="assistant"):
    message: AssistantMessage | None = None
    request_id: str | None = None
    # The session that made the request, written (2.1.332) on a response another session's
    # file repeats: `claude --continue --fork-session` copies the earlier session's lines.
    request_session_id: str | None = None
    is_api_error_message: bool = False
    is_aborted_mid_stream: bool = False

    def response_key(self) -> str | None:
        """What names the API response this line is a block of: `message.id`, else
        `requestId`."""
        return (self.message.id if self.message else None) or self.request_id

    def is_synthetic(self) -> bool:
        """An error the CLI wrote itself, not a model response."""
        return self.is_api_error_message or (
            self.message is not None and self.message.model == "<synthetic>"
        )


class SystemLine(LineLinks, tag_field="type", tag="system"):
    subtype: str | None = None
    logical_parent_uuid: str | None = None  # a compact boundary: the line it summarised up to
    compact_metadata: CompactMetadata | None = None

    @property
    def is_compact_boundary(self) -> bool:
        return self.subtype == "compact_boundary"


class ForkContextRef(LineLinks, tag_field="type", tag="fork-context-ref"):
    """A fork's first line: its history is its parent's, up to `parentLastUuid`."""

    parent_session_id: str | None = None
    parent_last_uuid: str | None = None


class OtherLine(LineLinks, kw_only=True):
    """A line of another kind, or of a known kind with fields of unexpected types."""

    kind: str
    problem: str | None = None  # why a line of a known kind could not be read as one


SessionLine = UserLine | AssistantLine | SystemLine | ForkContextRef
_LINE_KINDS = frozenset({"user", "assistant", "system", "fork-context-ref"})


class _Typed(LineLinks, kw_only=True):
    type: Any = None


_TYPED = msgspec.json.Decoder(SessionLine)
_LINKS = msgspec.json.Decoder(_Typed)


def links_of(raw: bytes) -> LineLinks | None:
    """A line's links (its session, time, place in the tree), read without decoding the rest
    of it; None for a line that is no JSON object of the expected shape."""
    try:
        return _LINKS.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode_raw(raw: bytes) -> SessionLine | OtherLine | None:
    """The typed record of one line, straight from its bytes; None when the line needs the
    slower reading of `decode_line` (a block of another kind, fields of other types, a line
    that is not a JSON object)."""
    try:
        return _TYPED.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    try:
        found = _LINKS.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if found.type in _LINE_KINDS:
        return None
    kind = found.type if isinstance(found.type, str) and found.type else "untyped"
    links = {f: getattr(found, f) for f in LineLinks.__struct_fields__}
    return OtherLine(kind=kind, **links)


def decode_line(data: dict[str, Any]) -> SessionLine | OtherLine:
    """The typed record of one session line read as a JSON object."""
    kind = data.get("type")
    label = kind if isinstance(kind, str) and kind else "untyped"
    problem = None
    if kind in _LINE_KINDS:
        message = data.get("message")
        if isinstance(message, dict) and "content" in message:
            data = {**data, "message": {**message, "content": decode_content(message["content"])}}
        try:
            return msgspec.convert(data, SessionLine)  # type: ignore[arg-type]
        except msgspec.ValidationError as error:
            problem = f"{label} line of an unexpected shape ({error})"
    link = {k: v for k, v in data.items() if k in _LINK_KEYS}
    try:
        return msgspec.convert({**link, "kind": label, "problem": problem}, OtherLine)
    except msgspec.ValidationError as error:  # even its links are unreadable
        return OtherLine(
            kind=label, problem=problem or f"{label} line with unreadable links ({error})"
        )


_LINK_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(LineLinks))
