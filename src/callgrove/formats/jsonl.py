"""JSON Lines episode files: plain, `.gz` and `.zst`, streamed line by line.

Reading never holds more than one line. A malformed line is reported with its number (and the
episode and call it names, when those can be found). A line cut off mid-write (the trace of a
crash, or of a file still being written), in the middle or at the end, is an error: its episode
is lost, whatever the lines around it hold, and those are still read.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec
import numpy as np
import orjson
from msgspec import UNSET, UnsetType

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

from callgrove.formats.looks import HEAD_BYTES, LINES_LOOKED_AT, not_json_lines
from callgrove.formats.output import NewFile, open_locked_append
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.streams import readable
from callgrove.formats.wire import (
    FORMAT,
    KNOWN_FIELDS,
    WireEpisode,
    episode_decoder,
    episode_encoder,
)

_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")
Row = TypeVar("Row")


def open_binary(path: str | os.PathLike[str], mode: str = "rb") -> IO[bytes]:
    """Open a file for binary reading or writing, compressed by its extension.

    Reading streams with bounded buffers whatever the compression ratio, across every gzip
    member and zstd frame (appends add them). A compressed file that ends early (a crash
    mid-write) raises `EOFError` at its end, for gzip and zstd alike, once every complete byte
    has been read; data that is not gzip or zstd raises `CompressedDataError`. An input that
    can be read only once (a pipe, a FIFO, `-`) is read through its copy (`formats.streams`).
    """
    name = str(readable(path) if mode == "rb" else path)
    if name.endswith(".gz"):
        return gzip.open(name, mode)  # type: ignore[return-value]
    if name.endswith(".zst"):
        return zstd.ZstdFile(name, mode)  # type: ignore[return-value]
    return open(name, mode)


# What the decompressors raise for bytes that are not what the extension promises.
CompressedDataError = (gzip.BadGzipFile, zlib.error, zstd.ZstdError)


def iter_lines(
    path: str | os.PathLike[str], byte_range: tuple[int, int] | None = None
) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (line number from 1, line as read, ended-with-newline) for non-blank lines.

    A compressed file cut short raises `InputError` (a `truncated` error) after its last
    complete line; compressed data that is damaged, or is not of its extension's kind, raises
    an `InputError` naming the line it stopped at.
    `byte_range` (start, end), in a plain file, reads only the lines that start in it (a
    shard; both ends on line starts), numbered from 1 at `start`.
    """
    if byte_range is not None:
        yield from _range_lines(path, *byte_range)
        return
    number = 0
    try:
        with open_binary(path) as raw:
            stream = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)  # type: ignore[arg-type]
            # A plain file is read in blocks; a compressed one line by line, so that when its
            # data ends early every line before the cut has been handed out.
            plain = isinstance(raw, io.BufferedReader)
            for number, line in enumerate(_block_lines(stream) if plain else stream, start=1):
                if not line.isspace():  # JSON decoders skip the trailing newline: no copy
                    yield number, line, line.endswith(b"\n")
    except EOFError:
        if os.path.getsize(readable(path)) == 0:
            return  # an empty file holds no lines, compressed or not
        raise InputError(
            Problem(
                "compressed file ends early (cut off mid-write); what follows is lost",
                file=str(path),
                line=number + 1,
                kind="truncated",
            )
        ) from None
    except CompressedDataError as error:
        kind = "gzip" if str(path).endswith(".gz") else "zstd"
        what = f"not {kind} data" if number == 0 else f"damaged {kind} data or trailing bytes"
        raise InputError(
            Problem(
                f"{what} ({error}); nothing from here on is read",
                file=str(path),
                line=number + 1,
                kind="malformed",
            )
        ) from None


_BLOCK_BYTES = 1 << 16  # small enough that a progress bar following the offset moves smoothly


def _block_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's lines, newline kept, read a block at a time: episode lines are long, and
    one large read and one slice per line is several times quicker than reading line by line.
    Memory holds one block plus the line being put together."""
    pending: list[bytes] = []  # the start of a line that runs past its block
    while block := stream.read(_BLOCK_BYTES):
        start = 0
        while (end := block.find(b"\n", start)) >= 0:
            line = block[start : end + 1]
            if pending:
                line = b"".join([*pending, line])
                pending.clear()
            yield line
            start = end + 1
        if start < len(block):
            pending.append(block[start:])
    if pending:
        yield b"".join(pending)


class _Named(msgspec.Struct):
    """Just the id and group of a line's object: decodes lines whose other fields do not."""

    id: Any = None
    group: Any = UNSET


_ID_FIELD = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){1,200}")')
_GROUP_FIELD = re.compile(rb'"group"\s*:\s*("(?:[^"\\]|\\.){0,200}"|null)')


def _named(line: bytes) -> tuple[str | None, str | UnsetType | None]:
    """The episode id and group a line names, best effort, even when the line is not valid
    JSON (one cut off mid-write): None for an id not found, `UNSET` for a group not found."""
    try:
        named = msgspec.json.decode(line, type=_Named)
        episode, group = named.id, named.group
    except (msgspec.DecodeError, RecursionError):
        episode, group = _field(_ID_FIELD, line, None), _field(_GROUP_FIELD, line, UNSET)
    return (
        episode if isinstance(episode, str) else None,
        group if group is None or isinstance(group, str) else UNSET,
    )


def _field(pattern: re.Pattern[bytes], line: bytes, missing: object) -> Any:
    found = pattern.search(line)
    if found is None:
        return missing
    try:
        return msgspec.json.decode(found.group(1))
    except msgspec.DecodeError:  # an escape cut in two
        return missing


def _range_lines(
    path: str | os.PathLike[str], start: int, end: int
) -> Iterator[tuple[int, bytes, bool]]:
    with open(path, "rb") as stream:
        stream.seek(start)
        remaining = end - start
        for number, line in enumerate(stream, start=1):
            if remaining <= 0:
                return
            remaining -= len(line)
            if not line.isspace():
                yield number, line, line.endswith(b"\n")


def _locate_in_json(line: bytes, path: str) -> str | None:
    """Best-effort call id for a msgspec error path like `$.agents[0].calls[2].seq`."""
    try:
        node: Any = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    call = None
    previous_key = None
    for key, index in _PATH_PART.findall(path):
        try:
            node = node[key] if key else node[int(index)]
        except (KeyError, IndexError, TypeError):
            break
        if index and previous_key == "calls" and isinstance(node, dict):
            call = node.get("id")
        previous_key = key or None
    return call if isinstance(call, str) else None


class ReadWithWarnings(Exception):
    """A line that was read (`row`) with `problems` worth reporting: `read_rows` reports them
    and goes on with the row. (Not a `CallgroveError`: it carries a result, and never leaves
    this module's readers.)"""

    def __init__(self, row: Any, problems: list[Problem]):
        super().__init__(row, problems)
        self.row = row
        self.problems = problems


def unknown_field(path: str, episode: str | None, call: str | None) -> Problem:
    return Problem(
        f"field {path} is not part of {FORMAT}; it is not read",
        episode=episode,
        call=call,
        severity="warning",
        kind="unknown_field",
    )


def _strip_unknown(line: bytes) -> tuple[bytes, list[Problem]]:
    """The line without the fields the format does not have, and a warning naming each."""
    value = msgspec.json.decode(line)
    episode = value.get("id") if isinstance(value, dict) else None
    episode = episode if isinstance(episode, str) else None
    found: list[Problem] = []

    def strip(obj: Any, kind: str, path: str, call: str | None = None) -> None:
        if not isinstance(obj, dict):
            return  # the decoder names a wrong shape
        for key in [key for key in obj if key not in KNOWN_FIELDS[kind]]:
            found.append(unknown_field(f"{path}{key}", episode, call))
            del obj[key]

    def each(obj: Any, name: str) -> list[tuple[int, Any]]:
        items = obj.get(name) if isinstance(obj, dict) else None
        return list(enumerate(items)) if isinstance(items, list) else []

    strip(value, "episode", "")
    for name in ("env", "run"):
        strip(value.get(name), name, f"{name}.")
    run = value.get("run")
    strip(run.get("policy") if isinstance(run, dict) else None, "policy", "run.policy.")
    for i, error in each(value, "errors"):
        strip(error, "error", f"errors[{i}].")
    for i, agent in each(value, "agents"):
        strip(agent, "agent", f"agents[{i}].")
        for j, call in each(agent, "calls"):
            name = call.get("id") if isinstance(call, dict) else None
            strip(call, "call", f"agents[{i}].calls[{j}].", name if isinstance(name, str) else None)
    return msgspec.json.encode(value), found


def decode_episode_line(line: bytes) -> WireEpisode:
    """Decode one line into a `WireEpisode`; `InputError` names the episode and call it can.

    Fields the format does not have are left out and named (`ReadWithWarnings`), never
    passed over quietly.
    """
    try:
        wire = episode_decoder.decode(line)
    except msgspec.ValidationError as error:
        if str(error).startswith("Object contains unknown field"):
            known, found = _strip_unknown(line)
            raise ReadWithWarnings(decode_episode_line(known), found) from None
        text = str(error)
        path = text.rsplit(" - at `", 1)[1].rstrip("`") if " - at `" in text else ""
        episode, group = _named(line)
        call = _locate_in_json(line, path)
        problem = Problem(text, episode=episode, call=call, kind="invalid", group=group)
        raise InputError(problem) from None
    except (msgspec.DecodeError, RecursionError) as error:
        episode, group = _named(line)
        raise InputError(replace(_as_problem(error, line), episode=episode, group=group)) from None
    if wire.format != FORMAT:
        message = f"format is {wire.format!r}, expected {FORMAT!r}"
        raise InputError(Problem(message, episode=wire.id, kind="invalid", group=wire.group))
    return wire


# A writer's line starts so: where one follows a cut line on the same line, it is recovered.
_LINE_START = b'{"format":'
_BOM = b"\xef\xbb\xbf"
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")
_NOT_JSON_NUMBERS = (b"-Infinity", b"Infinity", b"-NaN", b"NaN")


def read_rows(
    path: str | os.PathLike[str],
    decode: Callable[[bytes], Row],
    diagnostics: Diagnostics | None = None,
    byte_range: tuple[int, int] | None = None,
    other_kind: Callable[[bytes], tuple[str, int] | None] | None = None,
) -> Iterator[tuple[int, Row]]:
    """Stream `(line number, decode(line))` from any JSON Lines file.

    A file that is not JSON Lines, or whose first lines `other_kind` (given the file's head)
    finds to be records of another kind, is one problem for the file (saying what it holds
    and at which line), not an error per line.

    `decode` may raise msgspec's errors or `InputError`; either becomes a problem located at
    the file and line. Without `diagnostics` the first bad line raises `InputError`; with it,
    bad lines are recorded there and skipped, and reading goes on. A line whose JSON stops
    short is the trace of a write cut off (by a crash, or still going on): a `truncated` error
    naming its line, wherever it is and however it was later ended (by a newline, or by the
    next episode written straight after it, which is then read), for its episode is lost.
    """
    file = str(path)
    if byte_range is None or byte_range[0] == 0:
        head = _head(path)
        looks, kind = not_json_lines(head), "not_json_lines"
        if looks is None and other_kind is not None:
            looks, kind = other_kind(head), "other_kind"
        if looks is not None:  # one message for the file, not an error per line
            what, line = looks
            report(InputError(Problem(what, file=file, line=line, kind=kind)), diagnostics)
            return
    lines = iter_lines(path, byte_range)
    while True:
        try:
            number, line, complete = next(lines)
        except StopIteration:
            return
        except InputError as damaged:  # compressed data that ends early or is damaged
            report(damaged, diagnostics)
            return
        try:
            row = _decoded(decode, line, file=file, number=number, diagnostics=diagnostics)
        except _Refused:
            continue
        except (msgspec.DecodeError, InputError, RecursionError) as error:
            problem = _as_problem(error, line)
            recovered = (
                _after_cut(
                    line,
                    partial(_decoded, decode, file=file, number=number, diagnostics=diagnostics),
                )
                if problem.kind == "malformed"
                else ()
            )
            if recovered or (problem.kind == "malformed" and _cut_off(line, problem)):
                problem = replace(
                    problem,
                    message=(
                        "truncated final line (no newline, incomplete JSON: cut off mid-write, "
                        "or still being written); its episode is lost"
                        if not complete
                        else "truncated line (incomplete JSON, cut off mid-write and ended by "
                        "a later write); its episode is lost"
                    ),
                    kind="truncated",
                )
            report(
                InputError(replace(problem, file=problem.file or file, line=number)), diagnostics
            )
            for row in recovered:
                yield number, row
            continue
        yield number, row


def _head(path: str | os.PathLike[str]) -> bytes:
    """The file's first bytes as its reader sees them (decompressed); what cannot be read
    (damaged compression) is left for `iter_lines` to report where it stops."""
    try:
        with open_binary(path) as stream:
            return stream.read(HEAD_BYTES)
    except (OSError, EOFError, *CompressedDataError):
        return b""


def _decoded(
    decode: Callable[[bytes], Row],
    line: bytes,
    *,
    file: str,
    number: int,
    diagnostics: Diagnostics | None,
) -> Row:
    """`decode(line)`, with the warnings of a line read with them reported at its place (a
    line whose warnings `diagnostics` refuses is not used: `_Refused`)."""
    try:
        return decode(line)
    except ReadWithWarnings as read:
        for problem in read.problems:
            report(InputError(replace(problem, file=file, line=number)), diagnostics)
        if diagnostics is not None and diagnostics.refuses(read.problems):
            raise _Refused from None
        return read.row


class _Refused(Exception):
    """A line read with a warning its reader refuses (recorded as an error): not used. (Not a
    `CallgroveError`: the problem is already recorded; this only skips the line.)"""


def _cut_off(line: bytes, problem: Problem) -> bool:
    """Does the line's JSON stop short (rather than hold something wrong)?"""
    if "truncated" in problem.message:
        return True
    at = _ERROR_BYTE.search(problem.message)
    return at is not None and int(at.group(1)) >= len(line.rstrip())


def _after_cut(line: bytes, decode: Callable[[bytes], Row]) -> tuple[Row] | tuple[()]:
    """A whole row written straight after a cut one, on the same line; () when there is none."""
    start = line.find(_LINE_START, 1) if line.startswith(b"{") else -1
    while start > 0:
        try:
            return (decode(line[start:]),)
        except (msgspec.DecodeError, InputError, RecursionError, _Refused):
            start = line.find(_LINE_START, start + 1)
    return ()


def _as_problem(error: msgspec.DecodeError | InputError | RecursionError, line: bytes) -> Problem:
    if isinstance(error, InputError):
        return error.problem
    if isinstance(error, RecursionError):
        return Problem("not valid JSON: nested too deeply to decode", kind="malformed")
    if isinstance(error, msgspec.ValidationError):
        return Problem(f"unexpected shape: {error}", kind="invalid")
    return Problem(f"not valid JSON: {_cause(error, line)}", kind="malformed")


def _cause(error: msgspec.DecodeError, line: bytes) -> str:
    """msgspec's message, with the cause named where a common one explains it."""
    if line.startswith(_BOM):
        return "the line starts with a UTF-8 byte order mark (BOM); write the file without one"
    at = _ERROR_BYTE.search(str(error))
    if at is not None:
        byte = int(at.group(1))
        rest = line[byte - 1 if line[byte - 1 : byte] == b"-" else byte :]
        literal = next((word for word in _NOT_JSON_NUMBERS if rest.startswith(word)), None)
        if literal is not None:
            return (
                f"{literal.decode()} at byte {byte} is not a JSON number (Python's "
                "json.dumps writes it unless allow_nan=False); write null or a finite number"
            )
    return str(error)


def read_wire_episodes(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    byte_range: tuple[int, int] | None = None,
) -> Iterator[tuple[int, WireEpisode]]:
    """Stream `(line number, WireEpisode)` from an episode file (see `read_rows`)."""
    return read_rows(path, decode_episode_line, diagnostics, byte_range, _not_episodes)


def _not_episodes(head: bytes) -> tuple[str, int] | None:
    """For JSON Lines whose first records are objects none of which has a `format` field
    (rows, samples, a gateway's calls, metrics): what they hold, and the first one's line;
    None for episodes, and for lines the reader should judge one by one."""
    records: list[tuple[int, dict[str, Any]]] = []
    pieces = head.split(b"\n")
    for number, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            if number == len(pieces) and records:
                break  # the line the head cuts
            return None
        if not isinstance(value, dict) or "format" in value:
            return None
        records.append((number, value))
        if len(records) == LINES_LOOKED_AT:
            break
    if not records:
        return None
    number, first = records[0]
    keys = ", ".join(list(first)[:_KEYS_SHOWN]) + (", ..." if len(first) > _KEYS_SHOWN else "")
    message = (
        f"JSON Lines of another kind, not {FORMAT} episodes: no record has a `format` field "
        f"(the first holds {keys or 'nothing'})"
    )
    return message, number


_KEYS_SHOWN = 8


class InputWarning(UserWarning):
    """Input that was read with something worth knowing about (a field the format does not
    have, left out)."""


def report(error: InputError, diagnostics: Diagnostics | None) -> None:
    """Record a problem; with nowhere to record it, raise an error or emit an `InputWarning`."""
    if diagnostics is not None:
        diagnostics.add(error.problem)
    elif error.problem.severity == "warning":
        warnings.warn(str(error.problem), InputWarning, stacklevel=3)
    else:
        raise error


def encode_wire_episode(wire: WireEpisode) -> bytes:
    """One JSON line, newline included."""
    return episode_encoder.encode(wire) + b"\n"


def json_numbers(values: np.ndarray) -> msgspec.Raw:
    """An array as the JSON text `episode_encoder` writes for `values.tolist()`, byte for byte,
    without making a Python number per value: orjson writes integer and float64 buffers
    directly. Their texts differ in one spelling only, a positive exponent (`1e+20` against
    `1e20`); other dtypes, and arrays orjson will not take (not contiguous, say), go through
    `tolist()`."""
    kind = values.dtype.kind
    if kind in "iu" or values.dtype == np.float64:
        try:
            text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # orjson's refusal (not C-contiguous, foreign byte order)
            pass
        else:
            if kind == "f" and b"+" in text:  # one byte, found by memchr: cheaper than replace
                text = text.replace(b"e+", b"e")
            return msgspec.Raw(text)
    return msgspec.Raw(episode_encoder.encode(values.tolist()))


def _compressing(path: Path, raw: IO[bytes], mode: str) -> IO[bytes]:
    """A writing stream over `raw`, compressed as `path`'s extension says."""
    name = str(path)
    if name.endswith(".gz"):
        return gzip.GzipFile(filename=path.name, mode=mode, fileobj=raw)  # type: ignore[return-value]
    if name.endswith(".zst"):
        # A checksum per frame, as gzip has per member: damage is reported, never silent.
        options = {zstd.CompressionParameter.checksum_flag: 1}
        return zstd.ZstdFile(raw, mode=mode[0], options=options)  # type: ignore[return-value]
    return raw


def _end_cut_write(path: Path, raw: IO[bytes]) -> IO[bytes]:
    """Make an existing file end whole before lines are appended to it; returns the locked
    file to append to (a new one when the file had to be rewritten).

    A plain file cut mid-line gets a newline, so the cut line stays a reported, truncated
    line and the next line starts clean. A compressed file cut inside its last gzip member or
    zstd frame cannot be continued: it is rewritten (beside it, then renamed into place) with
    every byte that can still be decompressed, its cut line ended by a newline the same way.
    """
    if raw.tell() == 0:
        return raw
    if not str(path).endswith((".gz", ".zst")):
        with path.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":
                raw.write(b"\n")
        return raw
    cut = False
    try:
        with open_binary(path) as stream:
            while stream.read(1 << 20):
                pass
    except EOFError:
        cut = True
    except CompressedDataError as error:
        raw.close()
        raise InputError(
            Problem(
                f"cannot append: the file is damaged ({error}); what is appended after the "
                "damage could never be read",
                file=str(path),
                kind="output",
            )
        ) from None
    if not cut:
        return raw
    rewritten = NewFile(path)
    try:
        last = b"\n"
        with open(rewritten.temp, "wb") as target, _compressing(path, target, "wb") as stream:
            with contextlib.suppress(EOFError), open_binary(path) as source:
                while chunk := source.read1(1 << 20):  # read1: no whole chunk lost at the cut
                    stream.write(chunk)
                    last = chunk[-1:]
            if last != b"\n":
                stream.write(b"\n")
        rewritten.commit()
    except BaseException:
        rewritten.discard()
        raise
    raw.close()
    return open_locked_append(path)


class JsonlWriter:
    """Writes whole JSON lines, flushed one by one; `sync()` makes them durable (call it at
    batch ends), `close()` finishes the file.

    A new file (the default) is written beside its target and moved into place by `close()`:
    until then, and if the write fails or is killed, whatever was at the path stays as it was
    (see `callgrove.formats.output`). With `append=True` lines go straight onto the end of the
    file, held under an advisory lock so a second appender is refused: a crash there loses at
    most the line being written, which readers then report as truncated, and the next append
    first makes the file end whole.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False):
        self.path = Path(path)
        self.lines = 0
        self._new: NewFile | None = None
        if append:
            self._raw = _end_cut_write(self.path, open_locked_append(self.path))
        else:
            self._new = NewFile(self.path)
            self._raw = open(self._new.temp, "wb")  # noqa: SIM115 - closed by close()
        try:
            self._stream = _compressing(self.path, self._raw, "ab" if append else "wb")
        except BaseException:
            self._abandon()
            raise

    @property
    def written_path(self) -> Path:
        """Where the lines are until `close()`: the temporary file of a new file."""
        return self.path if self._new is None else self._new.temp

    def write_line(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()
        self.lines += 1

    def sync(self) -> None:
        if not self._stream.closed:
            self._stream.flush()
        self._raw.flush()
        os.fsync(self._raw.fileno())

    def close(self) -> None:
        """Finish the file; a new file is moved into place now."""
        if self._raw.closed:
            return
        try:
            if self._stream is not self._raw:
                self._stream.close()  # writes the compressed stream's end
            self.sync()
        except BaseException:
            self._abandon()
            raise
        self._raw.close()
        if self._new is not None:
            self._new.commit()

    def _abandon(self) -> None:
        """Stop writing: a new file is removed, an appended one keeps its whole lines."""
        with contextlib.suppress(OSError):
            self._raw.close()
        if self._new is not None:
            self._new.discard()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None or self._new is None:
            self.close()  # appended lines written so far are whole and stay
        else:
            self._abandon()
