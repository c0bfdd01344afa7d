"""Episode files of every form, and every other kind of file a command may be given, through
one registry of kinds.

A kind is one entry. An `EpisodeFormat` is read as episodes: its name, the file names it claims,
how to recognise its head when several claim a name, how to read it and how to open a writer.
A `NotEpisodes` kind is a file callgrove knows that holds no episodes (a harness transcript, a
gateway's calls ledger, a training run's folder): its name, the file names that are it, its
content test and the hint a command gives for it. `load`, `save`, `open_writer` and `convert`
find the format here, by the name given or by the path, and every command asks `kind_of` what
it was given; adding a kind is one `register(...)` call. callgrove's own forms are registered
below; the rooms that know the others register them (`callgrove.transcripts` harness
transcripts, `callgrove.interop` verifiers, NeMo Gym and ATIF, `callgrove.cli.kinds` the files
the later stages write).

Writers check every episode against the same rules a reader applies (`episode.checks`), so
what `save` writes `load` reads back, and hold prompts compactly (`codec.share_histories`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from callgrove.episode.binary import BINARY_SUFFIXES, BinaryEpisodeWriter, read_binary_episodes
from callgrove.episode.checks import check_episode, duplicate_episode, prompt_suffix_column
from callgrove.episode.codec import share_histories
from callgrove.episode.io import EpisodeWriter, read_located_episodes
from callgrove.episode.record import Episode
from callgrove.errors import InvalidValue
from callgrove.formats.jsonl import iter_lines
from callgrove.formats.looks import HEAD_BYTES
from callgrove.formats.output import output_error
from callgrove.formats.problems import Diagnostics, InputError
from callgrove.formats.streams import readable
from callgrove.formats.wire import FORMAT

JSONL_NAMES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
"""The names a JSON Lines file of episodes is written under (every JSON Lines form's)."""
JSONL_SUFFIXES = (*JSONL_NAMES, ".json", ".gz", ".zst")
"""What a JSON Lines episode file may end with (the last three read too, where a file is named
so)."""
EPISODE_FORMS = ", ".join((*JSONL_NAMES, *BINARY_SUFFIXES))
"""The episode files' names, as a command's help says them."""
EPISODE_FORMAT_PREFIX = FORMAT[: FORMAT.index("/") + 1]
"""How every version of callgrove's episode record names its `format` (`callgrove.episode/`)."""


class EpisodeSink(Protocol):
    """What every format's writer offers: `write(episode)`, `sync()` at batch boundaries,
    `close()` (or a `with` block), and `lines`, the episodes written so far."""

    lines: int

    def write(self, episode: Episode) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


Reader = Callable[..., Iterator[tuple[int, Episode]]]


@dataclass(frozen=True)
class EpisodeFormat:
    """One form of episode file.

    `read(path, diagnostics, **options)` streams `(line, episode)`; `open_writer(path, append)`
    returns an `EpisodeSink` (None: the form is read-only); `sniff(head)` tells this form
    from others that claim the same file names; `folder`: a folder given is read whole (a
    NeMo Gym store, a folder of trajectories); `holds(folder)` tells a folder of this form
    from others; `inside`: the file of a results folder this form reads (verifiers'
    traces.jsonl), the folder being read as that file; `folder_holds`: what a folder of this
    form holds, in words, for the message about a folder no form reads.
    """

    name: str
    suffixes: tuple[str, ...]
    read: Reader
    open_writer: Callable[[Path, bool], EpisodeSink] | None = None
    sniff: Callable[[bytes], bool] | None = None
    folder: bool = False
    holds: Callable[[Path], bool] | None = None
    inside: str | None = None
    folder_holds: str | None = None

    def holds_folder(self, folder: Path) -> bool:
        """A folder of this form: its results file is there, or `holds` finds it so."""
        if self.inside is not None and (folder / self.inside).is_file():
            return True
        return self.holds is not None and self.holds(folder)

    def read_path(self, path: Path) -> Path:
        """What this form reads for `path`: a results folder's file (`inside`), else `path`."""
        return path / self.inside if self.inside is not None and path.is_dir() else path


@dataclass(frozen=True)
class NotEpisodes:
    """A kind of file, or folder, that holds no episodes but that callgrove knows, so a command
    given it says in one line what it is and what to give instead (`hint`), never an error per
    line. A file is of this kind when its name ends with one of `suffixes` or `shows(path)`
    finds its content so (under any name); a folder, when `holds(folder)`."""

    name: str
    suffixes: tuple[str, ...]
    hint: str
    shows: Callable[[Path], bool] | None = None
    holds: Callable[[Path], bool] | None = None

    def is_file_of_kind(self, path: Path) -> bool:
        return path.name.endswith(self.suffixes) or (self.shows is not None and self.shows(path))

    def holds_folder(self, folder: Path) -> bool:
        return self.holds is not None and self.holds(folder)


FileKind = EpisodeFormat | NotEpisodes
KindT = TypeVar("KindT", EpisodeFormat, NotEpisodes)

FORMATS: dict[str, EpisodeFormat] = {}
NOT_EPISODES: dict[str, NotEpisodes] = {}


def register(kind: KindT) -> KindT:
    """Add a kind (or replace the one of that name); of kinds that both fit a file, the first
    registered wins."""
    if isinstance(kind, EpisodeFormat):
        FORMATS[kind.name] = kind
    else:
        NOT_EPISODES[kind.name] = kind
    return kind


def not_an_episode_file(what: str, instead: str) -> str:
    """The hint of a `NotEpisodes` kind, as every command words it."""
    return f"{what}, not an episode file: {instead}"


def kind_of(path: Path) -> FileKind | None:
    """What a file or folder given to a command is: a kind that holds no episodes, else the
    episode format that reads it; None for a folder no kind holds.

    A file is first offered to the kinds that hold no episodes: their tests read its records
    (a harness transcript or a calls ledger is JSON Lines that callgrove's own form would
    claim by its name), where an episode format's sniff only tells apart the forms that claim
    a name. A folder is first offered to the formats: one holding episodes of a known form is
    read as such, whatever else lies in it."""
    if path.is_dir():
        return _holding(path, FORMATS) or _holding(path, NOT_EPISODES)
    if path.is_file():
        known = next((k for k in NOT_EPISODES.values() if k.is_file_of_kind(path)), None)
        if known is not None:
            return known
    return format_for(path)


def _holding(folder: Path, kinds: dict[str, KindT]) -> KindT | None:
    return next((kind for kind in kinds.values() if kind.holds_folder(folder)), None)


def folders_read() -> list[str]:
    """What the folders read as episodes hold, in words, one per form that reads folders."""
    return [form.folder_holds for form in FORMATS.values() if form.folder_holds]


def format_for(
    path: str | os.PathLike[str], name: str | None = None, sniff: bool = True
) -> EpisodeFormat:
    """The form named `name`, else the one whose file names match `path` (the longest suffix;
    among equals, with `sniff`, the one that recognises the file's head; else the first
    registered). A folder is the first form's that holds it, else the first that reads
    folders."""
    if name is not None:
        if name not in FORMATS:
            raise InvalidValue(f"unknown episode format {name!r}; known: {', '.join(FORMATS)}")
        return FORMATS[name]
    # An input read once is told by its copy; an output's name is never read (sniff=False).
    path = readable(path) if sniff else Path(path)
    if path.is_dir():
        held = _holding(path, FORMATS)
        folder = held or next((f for f in FORMATS.values() if f.folder), None)
        if folder is not None:
            return folder
    text = path.name
    matches = [(len(s), f) for f in FORMATS.values() for s in f.suffixes if text.endswith(s)]
    if not matches:
        return FORMATS["callgrove"]
    longest = max(length for length, _ in matches)
    candidates = list(dict.fromkeys(f for length, f in matches if length == longest))
    if len(candidates) > 1 and sniff:
        head = _head(path)
        for candidate in candidates:
            if head is not None and candidate.sniff is not None and candidate.sniff(head):
                return candidate
    return candidates[0]


def _head(path: Path) -> bytes | None:
    """A file's lines (plain, .gz or .zst) from its first non-blank one until `HEAD_BYTES` are
    held, if it can be read: a JSON Lines file's first record whole, and enough of a pretty-printed
    document (a lone `{` on its first line) to hold the fields that say what it is."""
    if not path.is_file():
        return None
    lines: list[bytes] = []
    held = 0
    try:
        for _number, line, _complete in iter_lines(path):
            if not lines and not line.strip():
                continue
            lines.append(bytes(line))
            held += len(line)
            if held >= HEAD_BYTES:
                break
    except (OSError, EOFError, ValueError):
        return None
    return b"\n".join(lines) if lines else None


def load_located(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    format: str | None = None,
    **options: Any,
) -> Iterator[tuple[int, Episode]]:
    """Stream `(line, Episode)`; in a binary file the line is the episode's row, from 1.

    An episode id is unique within a file: a later episode with an earlier one's id is an
    error (recorded in `diagnostics` and skipped, or raised without them), never a second copy.
    An input that can be read only once (a pipe, a FIFO, `-` for standard input) is read
    whole, once, and its copy read (`formats.streams`).
    """
    path = readable(path)
    form = format_for(path, format)
    path = form.read_path(path)
    episodes = form.read(path, diagnostics, **options)
    return _unique_ids(episodes, str(path), diagnostics)


def _unique_ids(
    episodes: Iterator[tuple[int, Episode]], file: str, diagnostics: Diagnostics | None
) -> Iterator[tuple[int, Episode]]:
    first_lines: dict[str, int] = {}
    for line, episode in episodes:
        first = first_lines.setdefault(episode.id, line)
        if first == line:
            yield line, episode
            continue
        problem = duplicate_episode(episode.id, f"line {first}", file, line)
        if diagnostics is None:
            raise InputError(problem)
        diagnostics.add(problem)


def load(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    format: str | None = None,
    **options: Any,
) -> Iterator[Episode]:
    """Stream the episodes of a file, in the form `format` names or the path tells.

    Without `diagnostics` the first bad episode raises `InputError`; with it, bad episodes are
    recorded there (with file, line, episode and call) and the rest are still read.
    """
    return (episode for _line, episode in load_located(path, diagnostics, format, **options))


class CheckedWriter:
    """A format's writer behind the rules: each episode is checked as a reader would check it
    (an `InputError` naming the episode and call refuses it, and nothing of it is written) and
    its prompts are held compactly before the form writes it."""

    def __init__(self, writer: EpisodeSink, path: str):
        self.writer = writer
        self.path = path
        self.written: dict[str, int] = {}  # episode id -> its line (row) in this write

    @property
    def lines(self) -> int:
        return self.writer.lines

    def write(self, episode: Episode) -> None:
        # A form that writes columns (the binary one) has the calls gathered into its own
        # batch buffers: the rules run on the very values it writes, gathered once.
        room = getattr(self.writer, "room", None)
        columns = check_episode(episode, room)
        line = len(self.written) + 1
        first = self.written.setdefault(episode.id, line)
        if first != line:
            where = f"episode {first} of this write"
            raise InputError(duplicate_episode(episode.id, where, self.path))
        if share_histories(episode.agents):
            columns.prompt_suffix_ids = prompt_suffix_column(episode.calls(), room)
        if room is None:
            self.writer.write(episode)
        else:
            self.writer.write_gathered(episode, columns)

    def sync(self) -> None:
        self.writer.sync()

    def close(self) -> None:
        self.writer.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)  # what a form adds (verifiers' notes)

    def __enter__(self) -> CheckedWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.writer.__exit__(*exc)


def open_writer(
    path: str | os.PathLike[str], append: bool = False, format: str | None = None
) -> CheckedWriter:
    """A streaming writer for the form `format` names or the path tells: `write(episode)`,
    `sync()` at batch boundaries, `close()` (or a `with` block). A file is only sniffed when
    appended to: a new one takes callgrove's form for its name."""
    if format is None and Path(path).is_dir():
        raise output_error(path, "it is a folder")
    form = format_for(path, format, sniff=append)
    if form.open_writer is None:
        raise InvalidValue(f"{path}: episodes cannot be written as {form.name}")
    return CheckedWriter(form.open_writer(Path(path), append), str(path))


def save(
    path: str | os.PathLike[str], episodes: Iterable[Episode], format: str | None = None
) -> int:
    """Write episodes in the form `format` names or the path tells; returns how many.
    An episode that breaks a rule raises `InputError` (the file is then incomplete)."""
    with open_writer(path, format=format) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines


def convert(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    source_format: str | None = None,
    target_format: str | None = None,
    **options: Any,
) -> int:
    """Stream every episode of `source` into `target`, each form found as `load` and `save`
    find it; returns how many were written."""
    episodes = load(source, diagnostics, source_format, **options)
    return save(target, episodes, target_format)


def _binary_writer(path: Path, append: bool) -> BinaryEpisodeWriter:
    if append:
        raise InvalidValue(f"{path}: a binary episode file cannot be appended to")
    return BinaryEpisodeWriter(path)


def _is_callgrove(head: bytes) -> bool:
    return f'"{EPISODE_FORMAT_PREFIX}'.encode() in head


register(
    EpisodeFormat(
        "callgrove",
        JSONL_SUFFIXES,
        read_located_episodes,
        lambda path, append: EpisodeWriter(path, append=append),
        sniff=_is_callgrove,
    )
)
for _suffix in BINARY_SUFFIXES:
    register(EpisodeFormat(_suffix[1:], (_suffix,), read_binary_episodes, _binary_writer))
