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
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireEpisode, episode_decoder, episode_encoder

_PATH_PART = re.compile(r"\.(\w+)|\[(\d+)\]")


def open_binary(path: str | os.PathLike[str], mode: str = "rb") -> IO[bytes]:
    """Open a file for binary reading or writing, compressed by its extension."""
    name = str(path)
    if name.endswith(".gz"):
        return gzip.open(name, mode)  # type: ignore[return-value]
    if name.endswith(".zst"):
        import zstandard

        raw = open(name, mode)  # noqa: SIM115 - wrapped and closed by the stream
        if "r" in mode:
            return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return zstandard.ZstdCompressor().stream_writer(raw, closefd=True)
    return open(name, mode)


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (line number from 1, line without newline, ended-with-newline) for non-blank lines."""
    with open_binary(path) as raw:
        stream = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)  # type: ignore[arg-type]
        for number, line in enumerate(stream, start=1):
            complete = line.endswith(b"\n")
            body = line.rstrip(b"\r\n")
            if body.strip():
                yield number, body, complete


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


def decode_episode_line(
    line: bytes, *, file: str | None = None, number: int | None = None
) -> WireEpisode:
    """Decode one line into a `WireEpisode`, raising `InputError` located as precisely as possible."""
    try:
        wire = episode_decoder.decode(line)
    except msgspec.ValidationError as error:
        text = str(error)
        path = text.rsplit(" - at `", 1)[1].rstrip("`") if " - at `" in text else ""
        episode, call = _locate_in_json(line, path)
        raise InputError(
            Problem(text, file=file, line=number, episode=episode, call=call, kind="invalid")
        ) from None
    except msgspec.DecodeError as error:
        raise InputError(
            Problem(f"not valid JSON: {error}", file=file, line=number, kind="malformed")
        ) from None
    if wire.format != FORMAT:
        raise InputError(
            Problem(
                f"format is {wire.format!r}, expected {FORMAT!r}",
                file=file,
                line=number,
                episode=wire.id,
                kind="invalid",
            )
        )
    return wire


def read_wire_episodes(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[tuple[int, WireEpisode]]:
    """Stream `(line number, WireEpisode)` from a JSON Lines file.

    Without `diagnostics` the first bad line raises `InputError`. With it, bad lines are recorded
    there and skipped, and reading goes on. A final line that lacks its newline and does not
    parse is a truncated write: always a warning, never an error.
    """
    file = str(path)
    pending: InputError | None = None
    for number, line, complete in iter_lines(path):
        if pending is not None:
            _report(pending, diagnostics)
            pending = None
        try:
            yield number, decode_episode_line(line, file=file, number=number)
        except InputError as error:
            if not complete and error.problem.kind == "malformed":
                pending = InputError(
                    Problem(
                        "truncated final line (no newline, incomplete JSON); ignored",
                        file=file,
                        line=number,
                        severity="warning",
                        kind="truncated",
                    )
                )
            else:
                pending = error
    if pending is not None:
        _report(pending, diagnostics)


def _report(error: InputError, diagnostics: Diagnostics | None) -> None:
    if error.problem.severity == "warning" and diagnostics is None:
        return
    if diagnostics is None:
        raise error
    diagnostics.add(error.problem)


def encode_wire_episode(wire: WireEpisode) -> bytes:
    """One JSON line, newline included."""
    return episode_encoder.encode(wire) + b"\n"


class JsonlWriter:
    """Appends whole lines; flushes after each and fsyncs on `sync()` (call it at batch ends).

    A crash can lose at most the line being written, which a reader then reports as truncated.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False):
        self.path = Path(path)
        self._stream = open_binary(self.path, "ab" if append else "wb")
        self.lines = 0

    def write_line(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()
        self.lines += 1

    def write(self, wire: WireEpisode) -> None:
        self.write_line(encode_wire_episode(wire))

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
