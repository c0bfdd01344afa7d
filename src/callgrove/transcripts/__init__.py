"""Harness transcripts (Claude Code, Codex) as episodes: import, render to tokens, join a capture."""

from callgrove.transcripts.accounting import ImportReport
from callgrove.transcripts.claude_code import import_claude_code
from callgrove.transcripts.codex import import_codex
from callgrove.transcripts.render import TranscriptRenderer
from callgrove.transcripts.turns import Transcript, TranscriptAgent, TranscriptCall

__all__ = [
    "ImportReport",
    "Transcript",
    "TranscriptAgent",
    "TranscriptCall",
    "TranscriptRenderer",
    "import_claude_code",
    "import_codex",
]
