"""Commands over many files, or one large one, in parallel: shards, executors, merged results.

A shard is a whole file, or, in a plain callgrove JSON Lines file, a byte range of whole lines.
Each shard is worked on alone (a process of a local pool by default, or a Ray task), writes
what it outputs to its own part file and returns a small result; the command then puts the
parts and results together in shard order. The shards, their order and their work are the same
whichever executor runs them, so the output is too. Problems found in a byte range carry line
numbers counted from the range's first line; `renumber` shifts them by the lines before it.

An episode is read once across every shard of every input, as in one process (`episode.intake`):
each shard returns what it read (`Shard.read`: each episode's line, id and calls' digest), the
parent finds those an earlier shard already read (the same id, or the same calls in another
input) and works those shards again with the repeats named (`Shard.repeats`), so a repeat is
reported with the message one process gives and its episode is not used.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import StrEnum
from itertools import pairwise
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Any

import typer

from callgrove.cli.app import err, progress_bar
from callgrove.episode import Episode
from callgrove.episode.checks import duplicate_episode, read_twice
from callgrove.episode.files import format_for, load_located
from callgrove.episode.intake import Seen, seen
from callgrove.errors import EXIT_USAGE, StateError
from callgrove.formats.problems import Diagnostics, InputError, Problem, shown_file

MIN_SHARD_BYTES = 8 << 20  # smaller ranges cost more in start-up than they save
COMPRESSED = (".gz", ".zst")


class Executor(StrEnum):
    process = "process"
    ray = "ray"


JobsOption = Annotated[
    int,
    typer.Option(
        "--jobs", "-j", min=1, help="Shards worked on at once (1: in this process, no shards)."
    ),
]
ExecutorOption = Annotated[
    Executor, typer.Option("--executor", help="Where shards run: a local process pool, or Ray.")
]


def in_shards(jobs: int, executor: Executor, invocations: Path | None = None) -> bool:
    """Whether a command works shard by shard (`-j N` or `--executor ray`); a Gym capture
    read with its --invocations is one input and never sharded (a usage error, exit 2)."""
    sharded = jobs > 1 or executor is Executor.ray
    if sharded and invocations is not None:
        err.print("error: --invocations reads one Gym capture whole: leave out -j and --executor")
        raise typer.Exit(EXIT_USAGE)
    return sharded


@dataclass(frozen=True)
class Repeat:
    """Where the first copy of a repeated episode was read: in the same input (`line N`), or
    in another one, by the same id or by the same calls under another id."""

    first: str
    same_input: bool
    by_calls: str | None = None  # the first copy's id, when only the calls are the same

    def problem(self, episode: str, file: str, line: int) -> Problem:
        if self.same_input:
            return duplicate_episode(episode, self.first, file, line)
        if self.by_calls is not None:
            return read_twice(
                episode,
                f"the same calls as episode {self.by_calls} read at {self.first}",
                file,
                line,
            )
        return read_twice(episode, f"episode id already read at {self.first}", file, line)


@dataclass(frozen=True)
class Shard:
    """A whole file, or the lines of a plain JSON Lines file starting in `byte_range`."""

    index: int
    path: Path
    byte_range: tuple[int, int] | None = None
    source: int = 0  # which input of the command (a file given twice is two)
    # Lines (from the shard's first) holding an episode an earlier shard read, with where the
    # first copy is and by what it is the same: reported as repeats and not used.
    repeats: Mapping[int, Repeat] = field(default_factory=dict)
    # What the shard's work read of every episode it did not refuse as a repeat; it travels
    # back with the result.
    read: list[Seen] = field(default_factory=list, compare=False)

    @property
    def size(self) -> int:
        if self.byte_range is None:
            return self.path.stat().st_size
        return self.byte_range[1] - self.byte_range[0]

    def episodes(self, diagnostics: Diagnostics | None) -> Iterator[tuple[int, Episode]]:
        """`(line, Episode)` of the shard; lines count from the shard's first line."""
        options = {} if self.byte_range is None else {"byte_range": self.byte_range}
        for line, episode in load_located(self.path, diagnostics, **options):
            repeat = self.repeats.get(line)
            if repeat is not None:
                problem = repeat.problem(episode.id, str(self.path), line)
                if diagnostics is None:
                    raise InputError(problem)
                diagnostics.add(problem)
                continue
            self.read.append(seen(episode, str(self.path), line))
            yield line, episode

    def line_count(self) -> int:
        """Lines in the shard, blank ones included (for renumbering the shards after it)."""
        start, end = self.byte_range or (0, self.size)
        count, tail = 0, b""
        with self.path.open("rb") as stream:
            stream.seek(start)
            remaining = end - start
            while remaining > 0:
                block = stream.read(min(remaining, 1 << 24))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
                tail = block[-1:]
        return count + (tail not in (b"", b"\n"))


def plan_shards(files: Sequence[Path], jobs: int) -> list[Shard]:
    """Shards of `files`, in file order: plain callgrove JSON Lines files are cut into byte
    ranges of whole lines (about four per job over all the input, none under 8 MB); any other
    file is one shard."""
    total = sum(path.stat().st_size for path in files)
    target = max(MIN_SHARD_BYTES, math.ceil(total / (4 * jobs)) if jobs > 1 else total + 1)
    shards: list[Shard] = []
    for source, path in enumerate(files):
        size = path.stat().st_size
        if not _splittable(path) or size <= target:
            shards.append(Shard(len(shards), path, source=source))
            continue
        for start, end in _line_ranges(path, size, math.ceil(size / target)):
            shards.append(Shard(len(shards), path, (start, end), source))
    return shards


def _splittable(path: Path) -> bool:
    return format_for(path).name == "callgrove" and not path.name.endswith(COMPRESSED)


def _line_ranges(path: Path, size: int, pieces: int) -> list[tuple[int, int]]:
    """`pieces` ranges covering the file, each boundary moved to the start of a line."""
    bounds = [0]
    with path.open("rb") as stream:
        for piece in range(1, pieces):
            stream.seek(max(piece * size // pieces, bounds[-1]))
            stream.readline()  # on to the next line start
            where = stream.tell()
            if bounds[-1] < where < size:
                bounds.append(where)
    bounds.append(size)
    return list(pairwise(bounds))


@dataclass
class ShardResult:
    """What a shard's work returns: its problems (lines from the shard's first line), its
    line count, and what the command needs back (`value`)."""

    shard: Shard
    lines: int
    problems: list[Problem] = field(default_factory=list)
    value: Any = None


def merged(total: Any, part: Any) -> Any:
    """`part`'s tallies added into `total` (two shards of one input): numbers add, Counters
    and per-name dicts merge by key, dataclasses field by field, and anything with a `merge`
    method merges itself."""
    if hasattr(total, "merge"):
        return total.merge(part)
    if isinstance(total, Counter):
        total.update(part)
        return total
    if isinstance(total, dict):
        for key, value in part.items():
            total[key] = merged(total[key], value) if key in total else value
        return total
    if is_dataclass(total):
        for item in fields(total):
            setattr(total, item.name, merged(getattr(total, item.name), getattr(part, item.name)))
        return total
    return total + part


def first_error_cut(results: Sequence[ShardResult]) -> int:
    """How many shards a command that stops at its first error keeps: up to the first shard
    with an error, that one included (it stopped there itself)."""
    for number, result in enumerate(results):
        if any(p.severity == "error" for p in result.problems):
            return number + 1
    return len(results)


def renumber(results: Sequence[ShardResult]) -> list[Problem]:
    """Every shard's problems in shard order, with line numbers of the whole file."""
    before: dict[Path, int] = {}
    problems = []
    for result in results:
        offset = before.get(result.shard.path, 0)
        for problem in result.problems:
            if result.shard.byte_range is not None and problem.line is not None:
                problem = replace(problem, line=problem.line + offset)
            problems.append(problem)
        before[result.shard.path] = offset + result.lines
    return problems


def renumbered_reads(results: Sequence[ShardResult]) -> list[Seen]:
    """What every shard read, in shard order, with line numbers of the whole file."""
    before: dict[tuple[int, Path], int] = {}
    reads = []
    for result in results:
        shard = result.shard
        offset = before.get((shard.source, shard.path), 0)
        for record in shard.read:
            lost = tuple(replace(p, line=(p.line or 0) + offset) for p in record.lost_calls)
            reads.append(replace(record, line=record.line + offset, lost_calls=lost))
        before[(shard.source, shard.path)] = offset + result.lines
    return reads


def run_shards(
    shards: Sequence[Shard],
    work: Callable[[Shard, Path], ShardResult],
    parts: Path,
    jobs: int,
    executor: Executor = Executor.process,
) -> list[ShardResult]:
    """Run `work(shard, parts)` on every shard, `jobs` at a time, on `executor`, with one
    progress bar (bytes) across them; results come back in shard order. Shards that read an
    episode id an earlier shard of the same file read are worked on again with those repeats
    named (their first results are dropped)."""
    run = _on_ray if executor is Executor.ray else _on_pool
    with progress_bar("bytes") as progress:

        def execute(what: str, todo: Sequence[Shard]) -> list[ShardResult]:
            task = progress.add_task(what, total=sum(shard.size for shard in todo))
            return run(
                todo, work, parts, jobs, lambda r: progress.update(task, advance=r.shard.size)
            )

        results = execute(f"{len(shards)} shard(s)", shards)
        repeats = repeated_ids(results)
        if repeats:
            again = [
                replace(results[i].shard, repeats=lines, read=[]) for i, lines in repeats.items()
            ]
            for result in execute(f"{len(again)} shard(s) with repeated ids", again):
                results[result.shard.index] = result
        return results


def repeated_ids(results: Sequence[ShardResult]) -> dict[int, dict[int, Repeat]]:
    """Per shard index, the lines (from the shard's first) holding an episode that an earlier
    shard read: the same id in any input, or the same calls in another input."""
    ids: dict[str, tuple[int, str, int]] = {}  # id -> (input, where, line)
    digests: dict[bytes, tuple[int, str, str]] = {}  # digest -> (input, id, where)
    before: dict[tuple[int, Path], int] = {}
    repeats: dict[int, dict[int, Repeat]] = {}
    for result in results:
        shard = result.shard
        offset = before.get((shard.source, shard.path), 0)
        for record in shard.read:
            line = offset + record.line
            repeat = _repeat_of(record, shard.source, line, ids, digests)
            if repeat is not None:
                repeats.setdefault(shard.index, {})[record.line] = repeat
        before[(shard.source, shard.path)] = offset + result.lines
    return repeats


def _repeat_of(
    record: Seen,
    source: int,
    line: int,
    ids: dict[str, tuple[int, str, int]],
    digests: dict[bytes, tuple[int, str, str]],
) -> Repeat | None:
    """The repeat `record` is of an episode read before, or None (then it is noted as read)."""
    first = ids.get(record.id)
    if first is not None:
        same = first[0] == source
        return Repeat(f"line {first[2]}" if same else first[1], same)
    where = f"{shown_file(record.file)}:{line}"
    earlier = digests.get(record.digest) if record.digest is not None else None
    if earlier is not None and earlier[0] != source:
        return Repeat(earlier[2], False, by_calls=earlier[1])
    ids[record.id] = (source, where, line)
    if record.digest is not None:
        digests.setdefault(record.digest, (source, record.id, where))
    return None


def _on_pool(
    shards: Sequence[Shard],
    work: Callable[[Shard, Path], ShardResult],
    parts: Path,
    jobs: int,
    done: Callable[[ShardResult], None],
) -> list[ShardResult]:
    # spawn, not fork: the parent may hold threads (the progress bar) that fork would copy
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        pending = {pool.submit(work, shard, parts): shard.index for shard in shards}
        results: dict[int, ShardResult] = {}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                results[pending.pop(future)] = result = future.result()
                done(result)
    return [results[shard.index] for shard in shards]


def _call(work: Callable[[Shard, Path], ShardResult], shard: Shard, parts: Path) -> ShardResult:
    return work(shard, parts)


def _on_ray(
    shards: Sequence[Shard],
    work: Callable[[Shard, Path], ShardResult],
    parts: Path,
    jobs: int,
    done: Callable[[ShardResult], None],
) -> list[ShardResult]:
    try:
        import ray
    except ImportError as error:
        raise StateError("--executor ray needs Ray: pip install 'callgrove[ray]'") from error
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=jobs,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}},
        )
    try:
        remote = ray.remote(num_cpus=1)(_call)
        pending = {remote.remote(work, shard, parts): shard.index for shard in shards}
        results: dict[int, ShardResult] = {}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                results[pending.pop(ref)] = result = ray.get(ref)
                done(result)
        return [results[shard.index] for shard in shards]
    finally:
        if started:
            ray.shutdown()
