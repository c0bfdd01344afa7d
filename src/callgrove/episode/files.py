"""Episode files of any supported form, chosen by extension."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from callgrove.episode.io import read_episodes, write_episodes
from callgrove.episode.record import Episode
from callgrove.formats.problems import Diagnostics

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".gz", ".zst")


def load(path: str | os.PathLike[str], diagnostics: Diagnostics | None = None) -> Iterator[Episode]:
    """Stream the episodes of a file; the form is chosen by its extension."""
    return read_episodes(path, diagnostics)


def save(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> int:
    """Write episodes in the form named by the extension; returns how many were written."""
    return write_episodes(path, episodes)
