"""verifiers, NeMo Gym and ATIF as entries of the episode format registry (`callgrove.episode.files`),
so `load`, `save`, `convert` and every command read and write them by name or by file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from callgrove.episode import Episode
from callgrove.episode.files import EpisodeFormat, register
from callgrove.formats.problems import Diagnostics
from callgrove.interop.atif import AtifWriter, holds_atif, is_atif, read_atif
from callgrove.interop.gym import TOKENS_SUFFIX, read_gym
from callgrove.interop.verifiers import VerifiersWriter, read_located_verifiers


def _read_gym(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    invocations: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[int, Episode]]:
    """Gym rollouts numbered from 1 in the order they are joined (a store has no lines)."""
    return enumerate(read_gym(path, invocations, diagnostics), start=1)


def _is_verifiers(head: bytes) -> bool:
    return b'"traces"' in head or b'"nodes"' in head


VERIFIERS = register(
    EpisodeFormat(
        "verifiers",
        (".jsonl", ".jsonl.gz", ".jsonl.zst"),
        read_located_verifiers,
        lambda path, append: VerifiersWriter(Path(path), append=append),
        sniff=_is_verifiers,
    )
)


def _is_gym(head: bytes) -> bool:
    return b'"rollout_id"' in head and b'"generation_token_ids"' in head


# A capture is told by its name, or, under another JSON Lines name (a pipe's), by its first line.
GYM = register(
    EpisodeFormat("gym", (TOKENS_SUFFIX, ".jsonl"), _read_gym, sniff=_is_gym, folder=True)
)


# A trajectory document (`.json`), trajectories one per line (`.jsonl`, told by its first line),
# or a folder of trajectory documents.
ATIF = register(
    EpisodeFormat(
        "atif",
        (".json", ".jsonl"),
        read_atif,
        lambda path, append: AtifWriter(Path(path), append=append),
        sniff=is_atif,
        folder=True,
        holds=holds_atif,
    )
)
