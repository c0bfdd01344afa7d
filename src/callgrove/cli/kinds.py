"""What a file given to a command holds, so a wrong kind gets a hint instead of an error per line.

Two facts decide, each kept where it belongs: the episode format registry (`format_for`) knows
every form the commands read (callgrove's own, verifiers traces, NeMo Gym captures), and the
transcript importers' `sniff` knows harness transcripts, which must be imported first.
"""

from __future__ import annotations

from pathlib import Path

from callgrove.episode import format_for
from callgrove.transcripts.accounting import CLAUDE_CODE, CODEX, import_hint, sniff

HARNESS_KINDS = (CLAUDE_CODE, CODEX)
# verifiers names the file inside a run's results folder
VERIFIERS_FILE = "traces.jsonl"


def harness_kind(path: Path) -> str | None:
    """CLAUDE_CODE or CODEX for a harness transcript that would otherwise be read as episodes."""
    if not path.is_file() or format_for(path).name != "callgrove":
        return None
    if path.name.endswith((".parquet", ".arrow")):
        return None
    found = sniff(path)
    return found if found in HARNESS_KINDS else None


def harness_hint(path: Path) -> str | None:
    """For a harness transcript: what it is and which command turns it into episodes."""
    kind = harness_kind(path)
    if kind is None:
        return None
    return f"a {kind}, not an episode file: {import_hint(kind)}"
