"""`callgrove rows` and `callgrove check`: episodes to rows, checked.

The terminal views use the words of the JSON and Parquet records (`row` from 0, `path`,
`trains`, `context`, `num_tokens`, `num_loss_tokens`), so what a table shows can be looked up
in the files as it reads. Past a handful of episodes the table gives way to a summary.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Annotated

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import typer
from rich import box
from rich.table import Table

from callgrove.cli.accounting import (
    AcceptLossOption,
    CommandOutcome,
    ReadTokenizerOption,
    reading_chat,
)
from callgrove.cli.app import (
    FilesArg,
    InvocationsOption,
    app,
    cell,
    episode_inputs,
    err,
    out,
    progress_bar,
    read_input,
    reading,
    require_output,
    safe,
)
from callgrove.cli.shards import (
    Executor,
    ExecutorOption,
    JobsOption,
    Shard,
    ShardResult,
    in_shards,
    plan_shards,
    renumber,
    renumbered_reads,
    run_shards,
)
from callgrove.episode import Agent, Episode
from callgrove.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, did_you_mean
from callgrove.formats.output import NewFile
from callgrove.pictures.text import agent_labels, clip_middle
from callgrove.rows import EpisodeRows, Row, RowSettings, build_rows, check_rows
from callgrove.rows.check import CheckSummary
from callgrove.rows.schemes import SCHEMES
from callgrove.rows.table import row_record, rows_table

MaxIdentical = Annotated[
    int,
    typer.Option("--max-identical", min=1, help="How many rows with identical tokens may train."),
]
EpisodeOption = Annotated[
    str | None, typer.Option("--episode", metavar="ID", help="Only this episode.")
]
SchemeOption = Annotated[
    str,
    typer.Option(
        "--scheme",
        help="Which rows train what: exactly_once (every kept call once), or a baseline: "
        f"{', '.join(s for s in SCHEMES if s != 'exactly_once')} (as [rows] scheme of a "
        "training config).",
    ),
]
# More episodes than this and `rows` prints one summary table instead of a table each.
TABLES_UP_TO = 5
NO_REWARD = "no reward"


def episode_rows(
    files: list[Path],
    settings: RowSettings,
    outcome: CommandOutcome,
    only: str | None = None,
    invocations: Path | None = None,
) -> Iterator[EpisodeRows]:
    """Rows of every episode read once (or of episode `only`); every failure, and every copy
    read twice, is recorded in `outcome`, none is lost."""
    inputs = episode_inputs(files, invocations)
    with progress_bar("bytes") as progress:
        for path in inputs:
            located = read_input(path, outcome.diagnostics, invocations, outcome.chat)
            yield from rows_of(path, reading(progress, path, located), settings, outcome, only)


def rows_of(
    path: Path,
    located: Iterable[tuple[int, Episode]],
    settings: RowSettings,
    outcome: CommandOutcome,
    only: str | None,
) -> Iterator[EpisodeRows]:
    """Rows of each episode of `path` (or of episode `only`) that `outcome` admits; one that
    cannot become rows is counted there as lost, and the rest go on."""
    for line, episode in located:
        if only is not None and episode.id != only:
            continue
        if not outcome.admit(episode, path, line):
            continue
        try:
            result = build_rows(episode, settings)
        except Exception as error:  # an episode that cannot become rows must not stop the rest
            outcome.failed(path, line, episode.id, error)
            continue
        yield result


@dataclass(frozen=True)
class ShardRows:
    """What `rows` asks of each shard, and what a shard gives back."""

    settings: RowSettings
    only: str | None
    tokens: bool
    suffix: str


def rows_of_shard(shard: Shard, parts: Path, job: ShardRows) -> ShardResult:
    """A shard's rows, written to its own part file (the work of a process or a Ray task)."""
    outcome = CommandOutcome()
    part = parts / f"rows-{shard.index:05d}{job.suffix}"
    with _RowSink(part, job.tokens) as sink:
        located = shard.episodes(outcome.diagnostics)
        for result in rows_of(shard.path, located, job.settings, outcome, job.only):
            sink.add(result)
    return ShardResult(shard, shard.line_count(), outcome.diagnostics.problems, (part, sink.count))


def sharded_rows(
    files: list[Path],
    job: ShardRows,
    outcome: CommandOutcome,
    out_file: Path | None,
    jobs: int,
    executor: Executor,
) -> int:
    """Rows of every shard of `files` on `executor`, joined in shard order into `out_file`
    (or stdout, as JSON Lines); returns how many rows."""
    files = episode_inputs(files)
    work = partial(rows_of_shard, job=job)
    with tempfile.TemporaryDirectory(prefix="callgrove-rows-") as parts:
        results = run_shards(plan_shards(files, jobs), work, Path(parts), jobs, executor)
        reads = renumbered_reads(results)
        outcome.intake.admit_all(r for r in reads if job.only is None or r.id == job.only)
        for problem in renumber(results):
            outcome.diagnostics.add(problem)
        _join([result.value[0] for result in results], out_file)
    return sum(result.value[1] for result in results)


def _join(parts: list[Path], out_file: Path | None) -> None:
    """The part files one after another (bytes for JSON Lines, row groups for Parquet), into
    `out_file` (moved into place when complete) or stdout."""
    if out_file is None:
        for part in parts:
            with part.open("rb") as source:
                shutil.copyfileobj(source, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    new = NewFile(out_file)
    try:
        if out_file.suffix == ".jsonl":
            with new.temp.open("wb") as target:
                for part in parts:
                    with part.open("rb") as source:
                        shutil.copyfileobj(source, target)
        else:
            _join_parquet(parts, new.temp)
    except BaseException:
        new.discard()
        raise
    new.commit()


def _join_parquet(parts: list[Path], target: Path) -> None:
    writer: pq.ParquetWriter | None = None
    for part in parts:
        source = pq.ParquetFile(part)
        for group in range(source.num_row_groups):
            table = source.read_row_group(group)
            if not table.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(target, table.schema)
            writer.write_table(table)
    if writer is None:
        pq.write_table(rows_table([]), target)
    else:
        writer.close()


def require_episode_found(only: str | None, outcome: CommandOutcome, files: list[Path]) -> None:
    """`--episode ID` that matched nothing is a failure, named on stderr."""
    if only is not None and not outcome.intake.admitted:
        names = ", ".join(str(path) for path in files)
        err.print(f"error: no episode {safe(repr(only))} in {safe(names)}")
        raise typer.Exit(EXIT_FAILED)


@app.command("rows")
def rows_command(
    files: FilesArg,
    as_json: Annotated[
        bool, typer.Option("--json", help="The rows on stdout as JSON Lines, one object a row.")
    ] = False,
    tokens: Annotated[
        bool,
        typer.Option(
            "--tokens",
            help="With --json: add token_ids, loss_mask and logprobs (--out files always "
            "have them).",
        ),
    ] = False,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Write the rows to a .parquet or .jsonl file."
        ),
    ] = None,
    episode_id: EpisodeOption = None,
    max_identical: MaxIdentical = 1,
    invocations: InvocationsOption = None,
    jobs: JobsOption = 1,
    executor: ExecutorOption = Executor.process,
    scheme: SchemeOption = "exactly_once",
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    """Turn episodes into training rows: one per leaf, each kept call trained exactly once
    (--scheme: a baseline that trains otherwise).

    Prints a table per episode (a summary past 5 episodes), or JSON Lines with --json, or
    writes a file with -o.
    """
    if out_file is not None and out_file.suffix not in (".parquet", ".jsonl"):
        err.print(f"error: --out {safe(out_file)}: expected a .parquet or .jsonl file")
        raise typer.Exit(EXIT_USAGE)
    if tokens and not as_json:
        err.print(
            "error: --tokens adds token columns to --json output; without --json it would do "
            "nothing (--out files always carry token_ids, loss_mask and logprobs)"
        )
        raise typer.Exit(EXIT_USAGE)
    require_output(out_file, files, "--out")
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    if scheme not in SCHEMES:
        raise UsageError(
            f"--scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}"
            + did_you_mean(scheme, SCHEMES)
        )
    settings = RowSettings(scheme=scheme, max_identical_trained=max_identical)
    if in_shards(jobs, executor, invocations):
        if not as_json and out_file is None:
            err.print("error: --jobs and --executor ray write rows out: add --json or -o FILE")
            raise typer.Exit(EXIT_USAGE)
        suffix = ".jsonl" if out_file is None else out_file.suffix
        job = ShardRows(settings, episode_id, tokens or out_file is not None, suffix)
        count = sharded_rows(files, job, outcome, out_file, jobs, executor)
        if out_file is not None:
            err.print(f"wrote {count:,} rows to {safe(out_file)}")
        require_episode_found(episode_id, outcome, files)
        raise typer.Exit(outcome.report())
    view = _TableView(files) if not as_json and out_file is None else None
    with _RowSink(out_file) as sink:
        for result in episode_rows(files, settings, outcome, episode_id, invocations):
            sink.add(result)
            if as_json:
                _print_json_lines(result, tokens)
            elif view is not None:
                view.add(result)
    if view is not None:
        view.finish(outcome)
    if out_file is not None:
        err.print(f"wrote {sink.count:,} rows to {safe(out_file)}")
    require_episode_found(episode_id, outcome, files)
    raise typer.Exit(outcome.report())


def _print_json_lines(result: EpisodeRows, tokens: bool) -> None:
    write = sys.stdout.buffer.write
    for row in result.rows:
        write(
            orjson.dumps(row_record(result, row, tokens), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        )
    sys.stdout.buffer.flush()


# Rows are buffered up to this many tokens, then written as one Parquet row group: groups big
# enough to read fast, memory bounded by one group whatever the input's size.
ROW_GROUP_TOKENS = 1_000_000


class _RowSink:
    """Writes rows for --out as Parquet (row groups of about `ROW_GROUP_TOKENS` tokens) or
    JSON Lines, beside the target, moved into place only when the command went through."""

    def __init__(self, path: Path | None, tokens: bool = True):
        self.path = path
        self.tokens = tokens
        self.count = 0
        self._new: NewFile | None = None
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: IO[bytes] | None = None
        # each episode's rows as a table over its token columns: the episode, its forest and
        # the rest of its columns are let go as soon as its rows are in
        self._held: list[pa.Table] = []
        self._held_tokens = 0

    def __enter__(self) -> _RowSink:
        if self.path is not None:
            self._new = NewFile(self.path)
            if self.path.suffix == ".jsonl":
                self._jsonl = self._new.temp.open("wb")
        return self

    def add(self, result: EpisodeRows) -> None:
        if self._new is None or not result.rows:
            return
        self.count += len(result.rows)
        if self._jsonl is not None:
            for row in result.rows:
                self._jsonl.write(
                    orjson.dumps(
                        row_record(result, row, self.tokens), option=orjson.OPT_SERIALIZE_NUMPY
                    )
                    + b"\n"
                )
            return
        self._held.append(rows_table([result]))
        self._held_tokens += sum(row.num_tokens for row in result.rows)
        if self._held_tokens >= ROW_GROUP_TOKENS:
            self._write_group()

    def _write_group(self) -> None:
        assert self._new is not None
        table = pa.concat_tables(self._held) if self._held else rows_table([])
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._new.temp, table.schema)
        if self._held:  # a file of no rows still has every column
            self._parquet.write_table(table, row_group_size=table.num_rows)
        self._held, self._held_tokens = [], 0

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self._new is None:
            return
        if exc_type is None:
            try:
                self._finish()
            except BaseException:
                self._abandon()
                raise
            self._new.commit()
        else:
            self._abandon()

    def _finish(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            return
        if self._held or self._parquet is None:
            self._write_group()
        assert self._parquet is not None
        self._parquet.close()

    def _abandon(self) -> None:
        for stream in (self._jsonl, self._parquet):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.close()
        assert self._new is not None
        self._new.discard()


@dataclass
class RowTotals:
    """What a set of episodes' rows add up to (the summary `rows` prints past a few episodes)."""

    episodes: int = 0
    rows: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    duplicates: int = 0
    kept_calls: int = 0
    violations: int = 0
    failed_checks: int = 0

    def add(self, result: EpisodeRows, summary: CheckSummary) -> None:
        self.episodes += 1
        self.rows += len(result.rows)
        self.num_tokens += sum(row.num_tokens for row in result.rows)
        self.num_loss_tokens += sum(result.num_loss_tokens(row) for row in result.rows)
        self.duplicates += sum(row.duplicate_of is not None for row in result.rows)
        self.kept_calls += summary.kept_calls
        self.violations += len(summary.violations)
        self.failed_checks += not summary.ok

    def check_line(self, outcome: CommandOutcome) -> str:
        """The closing line over every episode: the check's verdict on all of them at once,
        and on what the inputs lost or held twice."""
        if self.violations:
            episodes = f"{self.episodes:,} episode{'s' if self.episodes != 1 else ''}"
            return (
                f"{self.kept_calls:,} kept calls in {episodes}: {self.violations:,} violation(s) "
                f"in {self.failed_checks:,} episode(s)"
            )
        return outcome.promise(self.kept_calls, self.episodes)


class _TableView:
    """A table per episode, until there are too many to read: then one summary table."""

    def __init__(self, files: list[Path]):
        self.files = files
        self.held: list[tuple[EpisodeRows, CheckSummary]] = []
        self.totals = RowTotals()
        self.first_id: str | None = None
        self.held_settings = RowSettings()

    def add(self, result: EpisodeRows) -> None:
        summary = check_rows(result)
        self.totals.add(result, summary)
        self.held_settings = result.settings
        self.first_id = self.first_id or result.episode.id
        if self.totals.episodes <= TABLES_UP_TO:
            self.held.append((result, summary))
        else:
            self.held.clear()  # past the limit only the totals are printed

    def finish(self, outcome: CommandOutcome) -> None:
        if self.totals.episodes <= TABLES_UP_TO:
            for result, summary in self.held:
                out.print(rows_table_view(result))
                out.print(f"{check_label(result.settings)}: {safe(summary.line())}")
            if self.totals.episodes > 1:
                out.print(f"total: {self.totals.check_line(outcome)}")
            return
        out.print(totals_table(self.totals))
        out.print(f"{check_label(self.held_settings)}: {self.totals.check_line(outcome)}")
        example = self.files[0] if len(self.files) == 1 else "FILE"
        out.print(
            f"[dim]one episode's rows: callgrove rows {safe(example)} --episode "
            f"{safe(self.first_id)}; every row: --json or -o rows.parquet[/]"
        )


def totals_table(totals: RowTotals) -> Table:
    table = Table(title="rows", title_justify="left", show_header=False, box=box.SIMPLE)
    table.add_column("what")
    table.add_column("count", justify="right")
    for what, count in (
        ("episodes", totals.episodes),
        ("rows", totals.rows),
        ("num_tokens", totals.num_tokens),
        ("num_loss_tokens", totals.num_loss_tokens),
        ("duplicate rows (no loss)", totals.duplicates),
    ):
        table.add_row(what, f"{count:,}")
    return table


def rewarded_by_agent(episode: Episode) -> bool:
    """An episode whose rewards sit on its agents alone (verifiers rewards on traces): its rows
    take each agent's, and its own reward (the sum of none) says nothing."""
    return not episode.rewards and any(agent.rewards is not None for agent in episode.agents)


def episode_reward(episode: Episode) -> float:
    """The reward an episode's views show: its own, or for one rewarded by agent the mean of
    its agents' rewards (each as its rows have it)."""
    if not rewarded_by_agent(episode):
        return episode.reward
    rewarded = [agent for agent in episode.agents if agent.rewards is not None]
    return float(np.mean([episode.reward_of(agent) for agent in rewarded]))


def episode_reward_text(episode: Episode, label: Callable[[Agent], str]) -> str:
    """`reward R`, each agent's for an episode rewarded by agent, or "no reward"."""
    if not episode.scored:
        return NO_REWARD
    if not rewarded_by_agent(episode):
        return f"reward {episode.reward:g}"
    each = ", ".join(
        f"{label(agent)} {episode.reward_of(agent):g}"
        for agent in episode.agents
        if agent.rewards is not None
    )
    return f"rewards by agent: {each}"


def reward_text(row: Row) -> str:
    """A row's reward, or "no reward" for an episode that was never scored."""
    return f"{row.reward:g}" if row.episode.scored else NO_REWARD


# Columns beside `path`, and the room each takes in the table.
_FIXED_COLUMNS = ("row", "leaf", "agent", "num_tokens", "num_loss_tokens", "reward")
# On a narrow terminal the long field names take two lines and ids are clipped shorter.
_NARROW_HEADERS = {"num_tokens": "num_\ntokens", "num_loss_tokens": "num_\nloss_\ntokens"}
_ID_WIDTHS = {False: (14, 18), True: (9, 7)}  # leaf, agent (wide: names fit)
_PADDING = 3  # a space each side of a cell and the gap between columns
_PATH_ROOM = 20  # enough for a long path: "#1 … #85 (85 calls)"
PATH_CAPTION = "path: root first, (context) calls held with the loss off, the rest trained"


def rows_table_view(result: EpisodeRows, width: int | None = None) -> Table:
    """The episode's rows under the names of the JSON fields, one line per row: the path marks
    its context calls in parentheses (the rest is `trains`) and, when the ids do not fit the
    terminal, names calls by their `seq` (#3) or by its first and last call and a count.
    Narrow terminals (80 columns) get two-line headers and shorter ids, never cut numbers."""
    rows = result.rows
    width = width or out.width
    labels = agent_labels(result.episode.agents)
    wanted = min(_PATH_ROOM, max((len(path_text(row, width)) for row in rows), default=0))
    for narrow in (False, True):
        headers = [_NARROW_HEADERS.get(n, n) if narrow else n for n in _FIXED_COLUMNS]
        cells = [_fixed_cells(result, row, labels, *_ID_WIDTHS[narrow]) for row in rows]
        fixed = sum(
            max([*(len(line) for line in header.splitlines()), *(len(c[i]) for c in cells)])
            + _PADDING
            for i, header in enumerate(headers)
        )
        room = width - fixed  # no edges: the first and last column save their outer space
        if room >= wanted:
            break
    table = Table(
        title=f"episode {safe(result.episode.id)}",
        title_justify="left",
        caption="\n".join(_legend(result, labels, max(room, 12))),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for name in (*headers[:3], "path", *headers[3:]):
        table.add_column(
            name, justify="left" if name in ("leaf", "agent", "path") else "right", no_wrap=True
        )
    for row, (number, leaf, agent, *numbers) in zip(rows, cells, strict=True):
        path = path_text(row, max(room, 12))
        if row.duplicate_of is not None:
            path += f" duplicate of {row.duplicate_of}"
        table.add_row(number, cell(leaf), cell(agent), cell(path), *numbers)
    return table


def _legend(result: EpisodeRows, labels: dict[str, str], room: int) -> list[str]:
    """The table's caption: how to read a path, what `#N` stands for where paths use it, and
    the id behind each agent named by its name."""
    lines = [PATH_CAPTION]
    by_id = [(row, {c.index for c in row.context}) for row in result.rows]
    if any(path_text(row, room) != _marked(row.path, held, _call_id) for row, held in by_id):
        lines.append("#N: the call with seq N (`callgrove show` lists them), … a run of calls")
    renamed = [(label, agent) for agent, label in labels.items() if label != agent]
    if renamed:
        lines.append("agents: " + ", ".join(f"{label} = {agent}" for label, agent in renamed))
    return lines


def _fixed_cells(
    result: EpisodeRows, row: Row, labels: dict[str, str], leaf_width: int, agent_width: int
) -> tuple[str, ...]:
    return (
        str(row.index),
        clip_middle(row.leaf.id, leaf_width),
        clip_middle(labels[row.agent.id], agent_width),
        f"{row.num_tokens:,}",
        f"{result.num_loss_tokens(row):,}",
        reward_text(row),
    )


def _call_id(call) -> str:
    return call.id


def path_text(row: Row, room: int) -> str:
    """The row's path in at most `room` characters: ids, else `#seq` numbers, else the first
    and last call with counts; runs of context calls in parentheses."""
    context = {call.index for call in row.context}
    for name in (_call_id, lambda call: f"#{call.seq}"):
        text = _marked(row.path, context, name)
        if len(text) <= room:
            return text
    first, last = row.path[0], row.path[-1]
    held = f", {len(row.context):,} context" if row.context else ""
    for text in (
        f"#{first.seq} … #{last.seq} ({len(row.path):,} calls{held})",
        f"#{first.seq}…#{last.seq} ({len(row.path):,}{held})",
    ):
        if len(text) <= room:
            return text
    return clip_middle(text, room)


def _marked(calls: list, context: set[int], name) -> str:
    parts: list[str] = []
    opened = False
    for call in calls:
        held = call.index in context
        text = name(call)
        if held and not opened:
            text = "(" + text
        elif not held and opened:
            parts[-1] += ")"
        opened = held
        parts.append(text)
    if opened:
        parts[-1] += ")"
    return " ".join(parts)


def check_label(settings: RowSettings) -> str:
    """The check tests the exactly-once rules, which a baseline scheme breaks by design."""
    if settings.scheme == "exactly_once":
        return "check"
    return f"check of the exactly-once rules (--scheme {settings.scheme} trains otherwise)"


def print_rows_table(result: EpisodeRows) -> None:
    out.print(rows_table_view(result))
    out.print(f"check: {safe(check_rows(result).line())}")


@app.command("check")
def check_command(
    files: FilesArg,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object on stdout: every episode's check and the total."
        ),
    ] = False,
    max_identical: MaxIdentical = 1,
    invocations: InvocationsOption = None,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    """Check every row invariant and what the inputs lost or held twice; print a line per
    episode and a total; exit 1 on any violation, any loss or any episode read twice.

    Episodes are checked and printed as they are read (the table in blocks, the JSON object's
    episodes one by one), so memory does not grow with the number of episodes."""
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    table = _check_table(first=True)
    totals = RowTotals()
    settings = RowSettings(max_identical_trained=max_identical)
    for result in episode_rows(files, settings, outcome, invocations=invocations):
        summary = check_rows(result)
        if as_json:
            # the object is opened with its first episode: a usage error prints nothing
            separator = b"," if totals.episodes else b'{"episodes":['
            sys.stdout.buffer.write(separator + orjson.dumps(check_record(summary)))
        else:
            if table.row_count == CHECK_BLOCK:
                out.print(table)
                table = _check_table(first=False)
            mark = (
                cell("FAIL", "red")
                if not summary.ok
                else cell("LOSS", "yellow")
                if summary.lost_calls
                else cell("ok", "green")
            )
            table.add_row(
                cell(result.episode.id),
                f"{summary.kept_calls:,}",
                f"{summary.rows:,}",
                mark.append(f" {summary.line()}", style=""),
            )
        totals.add(result, summary)
        for violation in summary.violations:
            err.print(f"[red]violation[/]: {safe(violation)}")
    status = outcome.report()
    if as_json:
        total = {
            "episodes": totals.episodes,
            "failed_to_read": len(outcome.intake.lost),
            "lost_calls": len(outcome.intake.lost_calls),
            "read_twice": outcome.intake.read_twice,
            "kept_calls": totals.kept_calls,
            "rows": totals.rows,
            "violations": totals.violations,
            "exactly_once": not totals.violations and outcome.whole,
            "ok": not totals.violations and status == EXIT_OK,
        }
        opening = b"" if totals.episodes else b'{"episodes":['
        sys.stdout.buffer.write(opening + b'],"total":' + orjson.dumps(total) + b"}\n")
    else:
        out.print(table)
        out.print(f"total: {totals.check_line(outcome)}")
    raise typer.Exit(EXIT_FAILED if totals.violations else status)


# `check` prints its table in blocks of this many episodes as it goes.
CHECK_BLOCK = 1000


def _check_table(first: bool) -> Table:
    title = "row invariants" if first else None
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_header=first)
    for name in ("episode", "kept calls", "rows", "check"):
        table.add_column(name, justify="right" if name in ("kept calls", "rows") else "left")
    return table


def check_record(summary: CheckSummary) -> dict[str, object]:
    return {
        "episode": summary.episode,
        "kept_calls": summary.kept_calls,
        "rows": summary.rows,
        "duplicates": summary.duplicates,
        "lost_calls": summary.lost_calls,
        "route_breaks": summary.route_breaks,
        "ok": summary.ok,
        "violations": [str(v) for v in summary.violations],
    }
