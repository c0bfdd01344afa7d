"""What a file that should be JSON Lines looks like when it is not: one message for the file
instead of one decode error per line (a README, a CSV, a picture given as episodes)."""

from __future__ import annotations

import re

# Bytes read from a file's start to tell what it is (decompressed, for .gz and .zst): by every
# content test, from the JSON Lines check here to the file kinds registry's (`episode.files`).
HEAD_BYTES = 1 << 16
# Non-blank lines looked at: a file none of whose first lines opens a JSON object is not JSON Lines.
LINES_LOOKED_AT = 5
_SHOWN_CHARS = 60
_SETTING = re.compile(r"^(\[[\w.\- \"]+\]|[\w.\-\"]+\s*=\s*\S)")

JSON_LINES = "the file should hold one JSON object per line"
# The binary forms callgrove reads, by their first bytes: what they are and the name ending
# that reads them.
READ_FORMS = (
    (b"PAR1", "Parquet data", ".parquet"),
    (b"ARROW1", "Arrow IPC data", ".arrow"),
    (b"\x1f\x8b", "gzip data", ".jsonl.gz"),
    (b"\x28\xb5\x2f\xfd", "zstd data", ".jsonl.zst"),
)
# Binary forms by their first bytes, with what to do instead.
_MAGIC = (
    *((magic, f"{what} (name the file {suffix})") for magic, what, suffix in READ_FORMS),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x7fELF", "an executable"),
)


# Any ATIF version, so that one its reader does not know is read as ATIF and refused by name.
_ATIF_VERSION = re.compile(rb'"schema_version"\s*:\s*"ATIF-v')


def names_atif(head: bytes) -> bool:
    """ATIF trajectories (Harbor's): the head (a JSON Lines file's first line, or the top of a
    pretty-printed document) names an ATIF `schema_version`. Here, beneath the stages, since
    naming a standard input's copy needs it as much as the episode format registry does."""
    return _ATIF_VERSION.search(head) is not None


def suffix_by_content(head: bytes) -> str:
    """The name ending that reads data starting with `head`: a binary form's; `.json` for one
    ATIF trajectory document spread over many lines (its reader reads a `.json` file whole,
    and a `.jsonl` one line by line); else `.jsonl`."""
    binary = next((suffix for magic, _what, suffix in READ_FORMS if head.startswith(magic)), None)
    if binary is not None:
        return binary
    return ".json" if _spread_document(head) and names_atif(head) else ".jsonl"


def _spread_document(head: bytes) -> bool:
    """A JSON object written over many lines: its first non-blank line opens it and does not
    close it (a JSON Lines file's first line is a whole object)."""
    lines = head.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    first = next((line.strip() for line in lines if line.strip()), b"")
    return first.startswith(b"{") and not first.endswith(b"}")


def not_json_lines(head: bytes) -> tuple[str, int] | None:
    """For the first bytes of a file that is not JSON Lines (one JSON object per line): what
    it looks like and the line (from 1) that shows it; None for JSON Lines, and for an empty
    file (no lines is valid JSON Lines). A file whose first lines are all broken JSON objects
    is JSON Lines gone wrong, and left to the line-by-line reader, which says what is wrong
    with each."""
    head = head.removeprefix(b"\xef\xbb\xbf")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{what}, not JSON Lines; {JSON_LINES}", 1
    lines = [
        (number, line.strip())
        for number, line in enumerate(head.decode("utf-8", "replace").split("\n"), start=1)
        if line.strip()
    ][:LINES_LOOKED_AT]
    if not lines:
        return None
    opened = lines[0][1] in ("{", "[")  # a JSON document written over many lines
    if not opened and any(line.startswith("{") for _number, line in lines):
        return None  # damaged bytes in JSON Lines (a NUL included) are the lines' to report
    if b"\x00" in head or not _is_text(head):
        shown = head[:8].hex(" ")
        return f"binary data, not JSON Lines (it starts {shown}); {JSON_LINES}", 1
    number, first = lines[0]
    kind = _kind(first, [line for _n, line in lines])
    return f"{kind}, not JSON Lines ({_shown(first)}); {JSON_LINES}", number


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start >= len(head) - 3  # a character cut by the end of the head
    return True


def _kind(first: str, lines: list[str]) -> str:
    if first == "{":
        return "one JSON document spread over many lines (pretty-printed)"
    if first.startswith("["):
        return "a JSON array" + (" spread over many lines" if first == "[" else "")
    if first.startswith("<"):
        return "HTML or XML"
    if any(_SETTING.match(line) for line in lines):
        return "TOML or INI settings"
    if first.startswith(("#", "---", "```", "- ", "* ", "|", "![", "> ")):
        return "Markdown"
    for separator, name in (("\t", "tab-separated values"), (",", "CSV")):
        counts = {line.count(separator) for line in lines}
        if len(counts) == 1 and counts != {0}:
            return name if len(lines) > 1 else f"{name} (one line)"
    return "plain text"


def _shown(line: str) -> str:
    clipped = line if len(line) <= _SHOWN_CHARS else line[: _SHOWN_CHARS - 1] + "…"
    return f"it starts {clipped!r}"
