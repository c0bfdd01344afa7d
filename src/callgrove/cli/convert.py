"""`callgrove convert`: episodes between verifiers, NeMo Gym and callgrove's own forms, streamed.

One episode is read, converted and written at a time. The summary on standard error says what
was converted, and what was not and why: bad lines and episodes (with file and line), the parts
of episodes a source could not give as calls (the episodes' gaps), and what the target form
cannot hold. A field callgrove's own forms do not have is never dropped quietly: convert
refuses the episode holding it (an error naming file, line, episode and field) unless
`--drop-unknown` is given, and then counts each one left out (docs/interop.md). Credit put
`--onto` verifiers traces is the credit IN's episodes carry: an episode never scored is an
error (never `null` advantages written for it) unless `--algorithm` scores IN's groups first.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.progress import Progress
from rich.table import Table

from callgrove.cli.accounting import (
    SHOWN_PROBLEMS,
    AcceptLossOption,
    CommandOutcome,
    ReadTokenizerOption,
    reading_chat,
)
from callgrove.cli.app import (
    OutputOption,
    app,
    err,
    folder_without_episodes,
    one_output,
    progress_bar,
    read_once,
    reading,
    require_output,
    safe,
)
from callgrove.cli.kinds import not_episodes_hint
from callgrove.cli.scoring import (
    AlgorithmOption,
    DecayOption,
    LocalSeatOption,
    Located,
    ScaleOption,
    ScopeOption,
    chosen_algorithm,
    never_scored,
    score_groups,
    unscored_message,
)
from callgrove.cli.shards import (
    Executor,
    ExecutorOption,
    JobsOption,
    Shard,
    ShardResult,
    first_error_cut,
    in_shards,
    merged,
    plan_shards,
    renumber,
    renumbered_reads,
    run_shards,
)
from callgrove.credit import Algorithm
from callgrove.episode import Episode, format_for, load, load_located, open_writer
from callgrove.episode.intake import Intake
from callgrove.episode.provenance import LOST_CALL_GAPS
from callgrove.errors import EXIT_USAGE, UsageError
from callgrove.forest import compact_prompts
from callgrove.formats.output import NewFile
from callgrove.formats.problems import Diagnostics, InputError, shown_file
from callgrove.interop.formats import TRACES_FILE
from callgrove.interop.gym import TOKENS_SUFFIX
from callgrove.interop.verifiers import write_advantages

UNKNOWN_FIELD = "unknown_field"  # the readers' kind for a field the format does not have


class SourceForm(StrEnum):
    verifiers = "verifiers"
    gym = "gym"
    atif = "atif"
    callgrove = "callgrove"


class Target(StrEnum):
    callgrove = "callgrove"
    verifiers = "verifiers"
    atif = "atif"  # a .json file (one episode), a .jsonl file or a new folder of them


@dataclass
class Tally:
    """What went through, one episode at a time."""

    episodes: int = 0
    agents: int = 0
    calls: int = 0
    kept: int = 0
    compactions: int = 0
    completion_tokens: int = 0
    gaps: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)  # what the target cannot hold
    written: int = 0  # episodes the target holds

    def add(self, episode: Episode) -> None:
        self.episodes += 1
        self.agents += len(episode.agents)
        for call in episode.calls():
            self.calls += 1
            self.kept += call.kept
            self.compactions += call.purpose == "compaction"
            self.completion_tokens += len(call.completion_ids)
        self.gaps.update(gap.kind for gap in episode.gaps or [])


InArg = Annotated[
    Path,
    typer.Argument(metavar="IN", help="Input: a file, a verifiers results folder, or a Gym store."),
]
OutArg = Annotated[
    Path | None,
    typer.Argument(metavar="OUT", help="Output file (the form follows --to).", show_default=False),
]
FromOption = Annotated[
    SourceForm | None,
    typer.Option("--from", help="What IN holds (default: read from IN's first record)."),
]
ToOption = Annotated[
    Target | None,
    typer.Option(
        "--to",
        help="What OUT gets (default: verifiers for a traces.jsonl or a folder, or with "
        "--onto; callgrove otherwise). atif: OUT a .json file (one episode), a .jsonl "
        "file (a trajectory a line) or a new folder (a .json file per episode).",
    ),
]
GymInvocationsOption = Annotated[
    Path | None,
    typer.Option(
        "--invocations", help="--from gym: rollout records (JSONL) with the agent invocations."
    ),
]
OntoOption = Annotated[
    Path | None,
    typer.Option(
        "--onto",
        help="--to verifiers: copy this verifiers traces.jsonl with IN's advantages on its "
        "nodes (IN: the episodes read from it, credited), instead of writing new traces.",
    ),
]
SkipBadOption = Annotated[
    bool, typer.Option("--skip-bad", help="Skip bad lines and episodes, count them, go on.")
]
DropUnknownOption = Annotated[
    bool,
    typer.Option(
        "--drop-unknown",
        help="Convert episodes holding fields callgrove's format does not have, without "
        "them (each one counted); by default such an episode is an error.",
    ),
]
SummaryJsonOption = Annotated[
    bool,
    typer.Option("--json", help="The summary as one JSON object on stdout (not on stderr)."),
]


@app.command("convert")
def convert_command(
    source: InArg,
    out: OutArg = None,
    from_: FromOption = None,
    to: ToOption = None,
    invocations: GymInvocationsOption = None,
    onto: OntoOption = None,
    skip_bad: SkipBadOption = False,
    drop_unknown: DropUnknownOption = False,
    algorithm_name: AlgorithmOption = None,
    scope: ScopeOption = None,
    scale_by_std: ScaleOption = False,
    local_seats: LocalSeatOption = None,
    decay: DecayOption = None,
    jobs: JobsOption = 1,
    executor: ExecutorOption = Executor.process,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
    out_option: OutputOption = None,
    as_json: SummaryJsonOption = False,
) -> None:
    """Convert episodes between verifiers traces, NeMo Gym captures, ATIF trajectories and
    callgrove files.

    `callgrove convert IN [--from verifiers|gym|atif|callgrove] [--to callgrove|verifiers|atif]
    OUT` (or
    `-o OUT`); what IN holds is read from its first record when --from is not given. With
    `--onto`, IN's episodes must carry advantages, or `--algorithm` scores their groups.
    OUT's folder is made if it is not there.
    """
    out = one_output(out, out_option)
    source = read_once(source)
    without = folder_without_episodes(source)
    if without is not None:
        err.print(f"error: {safe(shown_file(source))}: {safe(without)}")
        raise typer.Exit(EXIT_USAGE)
    invocations, onto = (None if p is None else read_once(p) for p in (invocations, onto))
    from_ = from_ or _infer_source(source)
    to = to or _infer_target(out, onto)
    source = _input_path(source, from_, invocations, onto, to)
    algorithm = chosen_algorithm(algorithm_name, scope, scale_by_std, local_seats, decay)
    if algorithm is not None and onto is None:
        err.print("error: --algorithm goes with --onto: the credit written onto verifiers traces")
        raise typer.Exit(EXIT_USAGE)
    target = out / TRACES_FILE if to is Target.verifiers and _is_folder(out) else out
    target.parent.mkdir(parents=True, exist_ok=True)
    require_output(target, [p for p in (source, invocations, onto) if p is not None])
    chat = reading_chat(tokenizer)
    outcome = CommandOutcome(Intake(_diagnostics(drop_unknown)), accept_loss, chat)
    tally = Tally()
    if in_shards(jobs, executor):
        if from_ is not SourceForm.callgrove or onto is not None:
            err.print("error: --jobs and --executor ray convert callgrove files (--from callgrove)")
            raise typer.Exit(EXIT_USAGE)
        job = ShardConvert(to, "".join(target.suffixes) or ".jsonl", skip_bad, drop_unknown)
        _convert_sharded(source, target, job, tally, outcome, jobs, executor)
    else:
        _convert_streamed(
            source, target, from_, to, invocations, onto, algorithm, skip_bad, tally, outcome
        )
    _summary(source, out, from_, to, tally, outcome, skip_bad, as_json)
    raise typer.Exit(outcome.status())


def _convert_streamed(
    source: Path,
    target: Path,
    from_: SourceForm,
    to: Target,
    invocations: Path | None,
    onto: Path | None,
    algorithm: Algorithm | None,
    skip_bad: bool,
    tally: Tally,
    outcome: CommandOutcome,
) -> None:
    """`convert` in this process, one episode at a time (all of them first when `algorithm`
    scores IN's groups). Without `skip_bad` the first error stops it and abandons the output."""
    diagnostics = outcome.diagnostics
    episodes = _read(source, from_, invocations, outcome)
    with progress_bar("bytes" if source.is_file() else "episodes") as progress:
        if source.is_file():
            episodes = reading(progress, source, episodes)
        else:
            episodes = _counted(progress, source, episodes, _total(source, invocations))

        def counted() -> Iterator[Located]:
            for line, episode in episodes:
                if not skip_bad and diagnostics.errors:
                    raise _Stopped
                if not outcome.admit(episode, source, line):
                    continue
                place = Located(episode, source, line)
                if onto is not None and algorithm is None and never_scored(episode):
                    raise InputError(place.problem(unscored_message(episode)))
                tally.add(episode)
                yield place
            if not skip_bad and diagnostics.errors:
                raise _Stopped

        try:
            if algorithm is None:
                credited = (place.episode for place in counted())
            else:
                credited = _scored(counted(), algorithm, diagnostics)
            _write(credited, target, to, onto, tally)
        except InputError as error:
            diagnostics.add(error.problem)
        except _Stopped:  # the first error stops the conversion; the summary reports it
            pass


def _diagnostics(drop_unknown: bool) -> Diagnostics:
    """Problems of a conversion: a field the format does not have is an error unless
    `--drop-unknown` lets it be left out."""
    return Diagnostics(refused=frozenset() if drop_unknown else frozenset({UNKNOWN_FIELD}))


def _infer_source(source: Path) -> SourceForm:
    """What IN holds, as the episode format registry reads it; a harness transcript or a
    path that is not there is a usage error."""
    hint = not_episodes_hint(source)
    if hint is not None or not source.exists():
        err.print(f"error: {safe(shown_file(source))}: {safe(hint or 'no such file or folder')}")
        raise typer.Exit(EXIT_USAGE)
    folder_of_traces = source.is_dir() and (source / TRACES_FILE).is_file()
    kind = "verifiers" if folder_of_traces else format_for(source).name
    err.print(f"reading {safe(shown_file(source))} as {kind} (--from overrides)")
    return SourceForm(kind)


def _is_folder(out: Path) -> bool:
    """OUT names a folder: one that is there, or a new name without a suffix."""
    return out.is_dir() or (not out.exists() and not out.suffix)


def _infer_target(out: Path, onto: Path | None) -> Target:
    if onto is not None or out.name == TRACES_FILE or out.is_dir():
        return Target.verifiers
    return Target.callgrove


class _Stopped(Exception):
    """The conversion stopped at an error: the output is abandoned, earlier files untouched.
    (Not a `CallgroveError`: the error is already recorded; this only ends the writing.)"""


@dataclass(frozen=True)
class ShardConvert:
    """What `convert` asks of each shard: the target form and its part files' ending."""

    to: Target
    suffix: str
    skip_bad: bool
    drop_unknown: bool


def convert_shard(shard: Shard, parts: Path, job: ShardConvert) -> ShardResult:
    """A shard's episodes written to its own part file in the target form, and their tally
    (the work of a process or a Ray task)."""
    diagnostics, tally = _diagnostics(job.drop_unknown), Tally()
    part = parts / f"part-{shard.index:05d}{job.suffix}"

    def counted() -> Iterator[Episode]:
        for _line, episode in shard.episodes(diagnostics):
            if not job.skip_bad and diagnostics.errors:
                return
            tally.add(episode)
            yield episode

    try:
        _write(counted(), part, job.to, None, tally)
    except InputError as error:
        diagnostics.add(error.problem)
    return ShardResult(shard, shard.line_count(), diagnostics.problems, (tally, part))


def _convert_sharded(
    source: Path,
    out: Path,
    job: ShardConvert,
    tally: Tally,
    outcome: CommandOutcome,
    jobs: int,
    executor: Executor,
) -> None:
    """`convert` shard by shard on `executor`, parts joined in shard order: JSON Lines (plain
    or compressed: members and frames chain) byte for byte, binary forms episode by episode.
    Without `skip_bad` the first error abandons the output, as in one process."""
    to, skip_bad = job.to, job.skip_bad
    binary = _format_name(out, to) in ("parquet", "arrow")
    work = partial(convert_shard, job=job)
    with tempfile.TemporaryDirectory(prefix="callgrove-convert-") as parts:
        results = run_shards(plan_shards([source], jobs), work, Path(parts), jobs, executor)
        kept = results if skip_bad else results[: first_error_cut(results)]
        diagnostics = outcome.diagnostics
        outcome.intake.admit_all(renumbered_reads(kept))
        for problem in renumber(kept):
            diagnostics.add(problem)
        for result in kept:
            merged(tally, result.value[0])
        if diagnostics.errors and not skip_bad:
            return
        files = [result.value[1] for result in kept]
        if binary:
            with open_writer(out, format=_format_name(out, to)) as writer:
                for part in files:
                    for episode in load(part):
                        writer.write(episode)
            return
        new = NewFile(out)
        try:
            with new.temp.open("wb") as joined:
                for part in files:
                    with part.open("rb") as data:
                        shutil.copyfileobj(data, joined)
        except BaseException:
            new.discard()
            raise
        new.commit()


def _input_path(
    source: Path, from_: SourceForm, invocations: Path | None, onto: Path | None, to: Target
) -> Path:
    if invocations is not None and from_ is not SourceForm.gym:
        raise UsageError("--invocations goes with --from gym")
    if onto is not None and to is not Target.verifiers:
        raise UsageError("--onto goes with --to verifiers")
    for path in (p for p in (invocations, onto) if p is not None):
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    if from_ is SourceForm.verifiers and source.is_dir():
        source = source / TRACES_FILE
    if not source.exists() or (source.is_dir() and from_ not in (SourceForm.gym, SourceForm.atif)):
        raise UsageError(f"{source}: no such file")
    return source


def _format_name(path: Path, kind: SourceForm | Target) -> str:
    """The registry's format: `callgrove` is whichever of callgrove's own forms the name says."""
    if kind.value != "callgrove":
        return kind.value
    return format_for(path, sniff=False).name


def _read(
    source: Path, from_: SourceForm, invocations: Path | None, outcome: CommandOutcome
) -> Iterator[tuple[int, Episode]]:
    options: dict[str, object] = {"invocations": invocations} if from_ is SourceForm.gym else {}
    if from_ is SourceForm.atif and outcome.chat is not None:
        options["chat"] = outcome.chat
    return load_located(source, outcome.diagnostics, _format_name(source, from_), **options)


def _scored(
    episodes: Iterator[Located], algorithm: Algorithm, diagnostics: Diagnostics
) -> Iterator[Episode]:
    """IN's episodes with every group scored by `algorithm` (all are read first, since a
    group is scored together), in IN's order; a group that cannot be scored stops the
    conversion, its problems in `diagnostics`."""
    located = list(episodes)
    if score_groups(located, algorithm, diagnostics).refused:
        raise _Stopped
    return iter([place.episode for place in located])


def _total(folder: Path, invocations: Path | None) -> int:
    """Episodes a NeMo Gym capture folder holds: one per invocation, else per token file."""
    if invocations is not None:
        return _lines(invocations)
    return len(list(folder.glob(f"*{TOKENS_SUFFIX}")))


def _counted(
    progress: Progress, folder: Path, episodes: Iterator[Episode], total: int
) -> Iterator[Episode]:
    task = progress.add_task(folder.name, total=total)
    for episode in episodes:
        progress.advance(task)
        yield episode


def _lines(path: Path) -> int:
    count = 0
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def _write(
    episodes: Iterable[Episode], out: Path, to: Target, onto: Path | None, tally: Tally
) -> None:
    if onto is not None:
        tally.written = write_advantages(onto, episodes, out)
        return
    with open_writer(out, format=_format_name(out, to)) as writer:
        for episode in episodes:
            compact_prompts(episode)  # prompts reference each call's forest parent
            writer.write(episode)
            tally.written = writer.lines
        for notes in getattr(writer, "notes", {}).values():
            tally.dropped.update(str(note["kind"]) for note in notes)


def _summary(
    source: Path,
    out: Path,
    from_: SourceForm,
    to: Target,
    tally: Tally,
    outcome: CommandOutcome,
    skip_bad: bool,
    as_json: bool,
) -> None:
    diagnostics = outcome.diagnostics
    if as_json:
        record = {
            "in": shown_file(source),
            "from": from_.value,
            "out": str(out),
            "to": to.value,
            "episodes": tally.episodes,
            "episodes_written": tally.written,
            "lost_calls": sum(tally.gaps[kind] for kind in LOST_CALL_GAPS),
            "exactly_once": outcome.whole,
            "agents": tally.agents,
            "calls": tally.calls,
            "kept_calls": tally.kept,
            "compaction_calls": tally.compactions,
            "completion_tokens": tally.completion_tokens,
            "gaps": dict(tally.gaps),
            "left_out": dict(tally.dropped),
            "errors": len(diagnostics.errors),
            "warnings": len(diagnostics.warnings),
        }
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    table = Table(
        title=safe(f"{shown_file(source)} ({from_.value}) -> {out} ({to.value})"),
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("count", justify="right")
    for what, count in (
        ("episodes read", tally.episodes),
        ("episodes written", tally.written),
        ("agents", tally.agents),
        ("calls (kept)", f"{tally.calls} ({tally.kept})"),
        ("compaction calls", tally.compactions),
        ("completion tokens", tally.completion_tokens),
    ):
        table.add_row(what, str(count))
    if not as_json:
        err.print(table)
    _counts("gaps in the episodes (what the source could not give as calls or links)", tally.gaps)
    _counts(f"not held by {to.value} (left out)", tally.dropped)
    _problems(diagnostics, skip_bad)
    for line in outcome.account():
        err.print(safe(line))


def _counts(title: str, counts: Counter[str]) -> None:
    if not counts:
        return
    table = Table(title=title, title_justify="left")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for kind, count in counts.most_common():
        table.add_row(kind, str(count))
    err.print(table)


def _problems(diagnostics: Diagnostics, skip_bad: bool) -> None:
    problems = diagnostics.problems
    if not problems:
        return
    kinds = ", ".join(f"{kind} {count}" for kind, count in diagnostics.counts().most_common())
    errors = len(diagnostics.errors)
    err.print(f"not converted: {errors} error(s), {len(diagnostics.warnings)} warning(s) ({kinds})")
    for problem in problems[:SHOWN_PROBLEMS]:
        colour = "red" if problem.severity == "error" else "yellow"
        err.print(f"[{colour}]{problem.severity}[/{colour}]: {safe(str(problem))}")
    if len(problems) > SHOWN_PROBLEMS:
        err.print(f"... and {len(problems) - SHOWN_PROBLEMS} more")
    if errors and not skip_bad:
        err.print(
            "stopped at the first error, nothing written; --skip-bad skips bad input and goes on"
        )
    if any(problem.kind == UNKNOWN_FIELD for problem in diagnostics.errors):
        err.print(
            "fields callgrove's format does not have would be lost: --drop-unknown converts "
            "without them (each one counted)"
        )
