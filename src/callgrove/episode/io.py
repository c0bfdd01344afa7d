"""Reading and writing episode files as typed records, streaming one episode at a time."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from callgrove.episode.codec import episode_from_wire, episode_to_wire
from callgrove.episode.record import Episode
from callgrove.formats.jsonl import (
    JsonlWriter,
    encode_wire_episode,
    json_numbers,
    read_wire_episodes,
)
from callgrove.formats.problems import Diagnostics, InputError


def read_episodes(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[Episode]:
    """Stream validated episodes from a JSON Lines file (plain, .gz or .zst).

    Without `diagnostics` the first bad episode raises `InputError` (with file, line, episode
    and call); with it, each bad episode is recorded there and the rest are still read.
    """
    for _number, episode in read_located_episodes(path, diagnostics):
        yield episode


def read_located_episodes(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    byte_range: tuple[int, int] | None = None,
) -> Iterator[tuple[int, Episode]]:
    """Like `read_episodes`, with each episode's line number; `byte_range` reads one shard of
    a plain file (`formats.jsonl.iter_lines`)."""
    file = str(path)
    for number, wire in read_wire_episodes(path, diagnostics, byte_range):
        try:
            yield number, episode_from_wire(wire)
        except InputError as error:
            located = error.located(file=file, line=number, episode=wire.id, group=wire.group)
            if diagnostics is None:
                raise located from None
            diagnostics.add(located.problem)


def encode_episode(episode: Episode) -> bytes:
    """One JSON line for the episode, newline included."""
    return encode_wire_episode(episode_to_wire(episode, numbers=json_numbers))


def write_episodes(
    path: str | os.PathLike[str], episodes: Iterable[Episode], append: bool = False
) -> int:
    """Write episodes one per line, as they are (unchecked; `save` checks); returns how many."""
    with EpisodeWriter(path, append=append) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines


class EpisodeWriter(JsonlWriter):
    """`JsonlWriter` that takes records as they are: whole lines, flushed; `sync()` at batch
    boundaries. `open_writer` and `save` put the rules in front of it."""

    def write(self, episode: Episode) -> None:
        self.write_line(encode_episode(episode))
