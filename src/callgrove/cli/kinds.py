"""What kind of file a path holds, read from its first record, so a wrong kind gets a hint.

Only JSON Lines files are sniffed (binary episode files are callgrove's own). The first line
that parses as a JSON object decides; a file nothing recognises is left to the reader, whose
errors name the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from callgrove.formats.jsonl import open_binary

EPISODE_FORMAT_PREFIX = "callgrove.episode/"
SNIFF_LINES = 5
SNIFF_BYTES = 1 << 20

# What reads each kind, said once for every command that meets it.
KIND_HINTS = {
    "codex": "a Codex rollout, not an episode file: `callgrove import codex FILE` turns it into episodes",
    "claude-code": "a Claude Code session, not an episode file: "
    "`callgrove import claude-code FILE` turns it into episodes",
    "verifiers": "verifiers traces, not an episode file: "
    "`callgrove convert FILE --from verifiers --to callgrove OUT.jsonl` turns them into episodes",
    "gym": "a NeMo Gym token capture, not an episode file: "
    "`callgrove convert FILE --from gym --to callgrove OUT.jsonl` turns it into episodes",
}


def file_kind(path: Path) -> str | None:
    """ "callgrove", "codex", "claude-code", "verifiers", "gym", or None when unsure."""
    if not path.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".json")):
        return None
    try:
        with open_binary(path) as stream:
            for _ in range(SNIFF_LINES):
                line = stream.readline(SNIFF_BYTES)
                if not line:
                    return None
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a line cut by the size limit, or a bad line: the reader says
                if isinstance(record, dict):
                    return _kind_of(record)
    except (OSError, EOFError):
        return None  # the reader reports an unreadable file with its own words
    return None


def _kind_of(record: dict[str, Any]) -> str | None:
    form = record.get("format")
    if isinstance(form, str) and form.startswith(EPISODE_FORMAT_PREFIX):
        return "callgrove"
    if record.get("type") in ("session_meta", "response_item", "turn_context", "event_msg"):
        return "codex"
    if "sessionId" in record and ("uuid" in record or record.get("type") == "summary"):
        return "claude-code"
    if "traces" in record and "format" not in record:
        return "verifiers"
    if "rollout_id" in record and "format" not in record:
        return "gym"
    return None


def file_kind_hint(path: Path) -> str | None:
    """What to run instead, for a file that is recognisably not a callgrove episode file."""
    kind = file_kind(path)
    return KIND_HINTS.get(kind) if kind is not None else None
