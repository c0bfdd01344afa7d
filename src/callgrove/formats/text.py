"""Text from input made safe to show: ids, names and paths may hold any character."""

from __future__ import annotations

import re

# C0 and C1 control characters and DEL: raw, they move a terminal's cursor, recolour it or
# ring it, split a one-line message, and make XML (SVG) malformed.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def printable(text: str, lines: bool = False) -> str:
    """`text` with each control character written as its Python escape (`\\n`, `\\x1b`);
    with `lines`, tabs and line breaks are kept as they are (multi-line text, XML)."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    return pattern.sub(lambda found: repr(found.group())[1:-1], text)
