"""Harness transcripts (Claude Code, Codex) as episodes: import, render to tokens, join a capture."""

from callgrove.transcripts.accounting import ImportReport
from callgrove.transcripts.claude_code import import_claude_code
from callgrove.transcripts.codex import import_codex
from callgrove.transcripts.model import (
    Message,
    ToolCall,
    Transcript,
    TranscriptAgent,
    TranscriptCall,
)
from callgrove.transcripts.render import (
    BuiltinFormat,
    ByteTokenizer,
    JinjaFormat,
    TranscriptRenderer,
)

__all__ = [
    "BuiltinFormat",
    "ByteTokenizer",
    "ImportReport",
    "JinjaFormat",
    "Message",
    "ToolCall",
    "Transcript",
    "TranscriptAgent",
    "TranscriptCall",
    "TranscriptRenderer",
    "import_claude_code",
    "import_codex",
]
