"""JSON Lines episode files: plain, `.gz` and `.zst`, streamed line by line.

Reading never holds more than one line. A malformed line is reported with its number (and the
episode and call it names, when those can be found); a truncated final line, the usual trace of
a crash mid-write, is a warning, never a reason to lose the lines before it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec

from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireEpisode, episode_decoder, episode_encoder

_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")
Row = TypeVar("Row")


def open_binary(path: str | os.PathLike[str], mode: str = "rb") -> IO[bytes]:
    """Open a file for binary reading or writing, compressed by its extension.

    Reading a compressed file that ends early (a crash mid-write) raises `EOFError` at its end,
    for gzip and zstd alike, once every complete byte has been read.
    """
    name = str(path)
    if name.endswith(".gz"):
        return gzip.open(name, mode)  # type: ignore[return-value]
    if name.endswith(".zst"):
        import zstandard

        raw = open(name, mode)  # noqa: SIM115 - wrapped and closed by the stream
        if "r" in mode:
            return io.BufferedReader(_ZstdFramesReader(raw))
        return zstandard.ZstdCompressor().stream_writer(raw, closefd=True)
    return open(name, mode)


class _ZstdFramesReader(io.RawIOBase):
    """Decompresses every zstd frame of a file (appends add frames); a cut frame is an EOFError."""

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw = raw
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._frame = self._new()
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = self._frame.unused_data if self._frame.eof else self._raw.read(1 << 20)
            if self._frame.eof:
                self._frame = self._new()
                chunk = chunk or self._raw.read(1 << 20)
                if not chunk:
                    return 0
            elif not chunk:
                raise EOFError("compressed stream ends inside a zstd frame")
            self._pending = self._frame.decompress(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (line number from 1, line as read, ended-with-newline) for non-blank lines.

    A compressed file cut short raises `InputError` (a `truncated` warning) after its last
    complete line.
    """
    number = 0
    with open_binary(path) as raw:
        stream = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)  # type: ignore[arg-type]
        try:
            for number, line in enumerate(stream, start=1):
                if not line.isspace():  # JSON decoders skip the trailing newline: no copy
                    yield number, line, line.endswith(b"\n")
        except EOFError:
            raise InputError(
                Problem(
                    "compressed file ends early (cut off mid-write); what follows is lost",
                    file=str(path),
                    line=number + 1,
                    severity="warning",
                    kind="truncated",
                )
            ) from None


def _locate_in_json(line: bytes, path: str) -> tuple[str | None, str | None]:
    """Best-effort episode id and call id for a msgspec error path like `$.agents[0].calls[2].seq`."""
    try:
        node: Any = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None, None
    episode = node.get("id") if isinstance(node, dict) else None
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
    return (episode if isinstance(episode, str) else None), (
        call if isinstance(call, str) else None
    )


def decode_episode_line(line: bytes) -> WireEpisode:
    """Decode one line into a `WireEpisode`; `InputError` names the episode and call it can."""
    try:
        wire = episode_decoder.decode(line)
    except msgspec.ValidationError as error:
        text = str(error)
        path = text.rsplit(" - at `", 1)[1].rstrip("`") if " - at `" in text else ""
        episode, call = _locate_in_json(line, path)
        raise InputError(Problem(text, episode=episode, call=call, kind="invalid")) from None
    if wire.format != FORMAT:
        message = f"format is {wire.format!r}, expected {FORMAT!r}"
        raise InputError(Problem(message, episode=wire.id, kind="invalid"))
    return wire


def read_rows(
    path: str | os.PathLike[str],
    decode: Callable[[bytes], Row],
    diagnostics: Diagnostics | None = None,
) -> Iterator[tuple[int, Row]]:
    """Stream `(line number, decode(line))` from any JSON Lines file.

    `decode` may raise msgspec's errors or `InputError`; either becomes a problem located at
    the file and line. Without `diagnostics` the first bad line raises `InputError`; with it,
    bad lines are recorded there and skipped, and reading goes on. A final line that lacks its
    newline and does not parse is a truncated write: always a warning, never an error.
    """
    file = str(path)
    pending: Problem | None = None
    lines = iter_lines(path)
    while True:
        try:
            number, line, complete = next(lines)
        except StopIteration:
            break
        except InputError as cut:  # a compressed file that ends early
            if pending is not None:
                report(InputError(pending), diagnostics)
            pending = cut.problem
            break
        if pending is not None:
            report(InputError(pending), diagnostics)
            pending = None
        try:
            yield number, decode(line)
        except (msgspec.DecodeError, InputError) as error:
            problem = _as_problem(error)
            if problem.kind == "malformed" and not complete:
                problem = Problem(
                    "truncated final line (no newline, incomplete JSON); ignored",
                    severity="warning",
                    kind="truncated",
                )
            pending = replace(problem, file=problem.file or file, line=problem.line or number)
    if pending is not None:
        report(InputError(pending), diagnostics)


def _as_problem(error: msgspec.DecodeError | InputError) -> Problem:
    if isinstance(error, InputError):
        return error.problem
    if isinstance(error, msgspec.ValidationError):
        return Problem(f"unexpected shape: {error}", kind="invalid")
    return Problem(f"not valid JSON: {error}", kind="malformed")


def read_wire_episodes(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[tuple[int, WireEpisode]]:
    """Stream `(line number, WireEpisode)` from an episode file (see `read_rows`)."""
    return read_rows(path, decode_episode_line, diagnostics)


class InputWarning(UserWarning):
    """Input that was read with a loss worth knowing about (a truncated final line)."""


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


def _ends_mid_line(path: Path) -> bool:
    """Does a plain file end without a newline (a write cut off by a crash)?"""
    if path.suffix in (".gz", ".zst") or not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) != b"\n"


class JsonlWriter:
    """Appends whole lines; flushes after each and fsyncs on `sync()` (call it at batch ends).

    A crash can lose at most the line being written, which a reader then reports as truncated.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False):
        self.path = Path(path)
        cut_line = append and _ends_mid_line(self.path)
        self._stream = open_binary(self.path, "ab" if append else "wb")
        self.lines = 0
        if cut_line:  # end the crashed write's partial line, so the next episode is whole
            self._stream.write(b"\n")

    def write_line(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()
        self.lines += 1

    def sync(self) -> None:
        self._stream.flush()
        fileno = getattr(self._stream, "fileno", None)
        if fileno is not None:
            # Compressed streams may have no single descriptor to sync.
            with contextlib.suppress(OSError, io.UnsupportedOperation):
                os.fsync(fileno())

    def close(self) -> None:
        self.sync()
        self._stream.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
