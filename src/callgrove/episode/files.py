"""Episode files of any supported form, chosen by extension.

`.parquet` and `.arrow` are the binary form (`callgrove.episode.arrow`); anything else is JSON
Lines (plain, `.gz` or `.zst`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from callgrove.episode.arrow import BinaryEpisodeWriter, is_binary, read_binary_episodes
from callgrove.episode.io import EpisodeWriter, read_located_episodes
from callgrove.episode.record import Episode
from callgrove.formats.problems import Diagnostics

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".gz", ".zst")


def load_located(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[tuple[int, Episode]]:
    """Stream `(line, Episode)`; in a binary file the line is the episode's row, from 1."""
    if is_binary(path):
        return read_binary_episodes(path, diagnostics)
    return read_located_episodes(path, diagnostics)


def load(path: str | os.PathLike[str], diagnostics: Diagnostics | None = None) -> Iterator[Episode]:
    """Stream the episodes of a file; the form is chosen by its extension.

    Without `diagnostics` the first bad episode raises `InputError`; with it, bad episodes are
    recorded there (with file, line, episode and call) and the rest are still read.
    """
    return (episode for _line, episode in load_located(path, diagnostics))


def open_writer(
    path: str | os.PathLike[str], append: bool = False
) -> EpisodeWriter | BinaryEpisodeWriter:
    """A streaming writer for the form named by the extension: `write(episode)`, `sync()` at
    batch boundaries, `close()` (or use it as a context manager). Binary files cannot be
    appended to."""
    if is_binary(path):
        if append:
            raise ValueError(f"{path}: a binary episode file cannot be appended to")
        return BinaryEpisodeWriter(path)
    return EpisodeWriter(path, append=append)


def save(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> int:
    """Write episodes in the form named by the extension; returns how many were written."""
    with open_writer(path) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines
