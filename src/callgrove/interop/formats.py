"""verifiers, NeMo Gym and ATIF as entries of the file kinds registry (`callgrove.episode.files`),
so `load`, `save`, `convert` and every command read and write them by name, by file or by
folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from callgrove.episode import Episode
from callgrove.episode.files import JSONL_NAMES, EpisodeFormat, register
from callgrove.formats.looks import names_atif
from callgrove.formats.problems import Diagnostics
from callgrove.interop.atif import AtifWriter, holds_atif, read_atif
from callgrove.interop.gym import TOKENS_SUFFIX, read_gym
from callgrove.interop.verifiers import VerifiersWriter, read_located_verifiers

TRACES_FILE = "traces.jsonl"
"""The file verifiers writes in a run's results folder: the folder is read as it."""


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
        JSONL_NAMES,
        read_located_verifiers,
        lambda path, append: VerifiersWriter(Path(path), append=append),
        sniff=_is_verifiers,
        inside=TRACES_FILE,
        folder_holds=f"a verifiers {TRACES_FILE}",
    )
)


def _is_gym(head: bytes) -> bool:
    return b'"rollout_id"' in head and b'"generation_token_ids"' in head


def _holds_gym(folder: Path) -> bool:
    return any(folder.glob(f"*{TOKENS_SUFFIX}"))


# A capture is told by its name, or, under another JSON Lines name (a pipe's), by its first line;
# a store folder by its token files. Registered before ATIF, the first form to read folders, it
# is the one `load` gives a folder no form holds.
GYM = register(
    EpisodeFormat(
        "gym",
        (TOKENS_SUFFIX, ".jsonl"),
        _read_gym,
        sniff=_is_gym,
        folder=True,
        holds=_holds_gym,
        folder_holds=f"NeMo Gym *{TOKENS_SUFFIX} files",
    )
)


# A trajectory document (`.json`), trajectories one per line (`.jsonl`, told by its first line),
# or a folder of trajectory documents.
ATIF = register(
    EpisodeFormat(
        "atif",
        (".json", ".jsonl"),
        read_atif,
        lambda path, append: AtifWriter(Path(path), append=append),
        sniff=names_atif,
        folder=True,
        holds=holds_atif,
        folder_holds="ATIF trajectories (*.json)",
    )
)
