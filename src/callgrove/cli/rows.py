"""`callgrove rows` and `callgrove check`: episodes to rows, checked."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import orjson
import pyarrow.parquet as pq
import typer
from rich.table import Table

from callgrove.cli.app import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    app,
    err,
    out,
    progress_bar,
    require_files,
)
from callgrove.episode import load
from callgrove.formats.problems import Diagnostics
from callgrove.rows import EpisodeRows, RowSettings, build_rows, check_rows
from callgrove.rows.table import row_record, rows_table

FilesArg = Annotated[
    list[Path], typer.Argument(help="Episode files (.jsonl, .jsonl.gz, .jsonl.zst)")
]
MaxIdentical = Annotated[
    int,
    typer.Option("--max-identical", min=1, help="How many rows with identical tokens may train"),
]


@dataclass
class Outcome:
    """What a command went through: episodes turned into rows, and the ones that failed."""

    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    episodes: int = 0
    failed: int = 0

    def report(self) -> int:
        """Print the problems on stderr; return the exit status (docs/episode-format.md, section 4)."""
        for problem in self.diagnostics.problems:
            style = "yellow" if problem.severity == "warning" else "red"
            err.print(f"[{style}]{problem.severity}[/]: {problem}", markup=True, highlight=False)
        failed = self.failed + len(self.diagnostics.errors)
        if failed:
            err.print(f"{failed} episode(s) failed, {self.episodes} went through")
        return EXIT_FAILED if failed else EXIT_OK


def episode_rows(
    files: list[Path], settings: RowSettings, outcome: Outcome
) -> Iterator[EpisodeRows]:
    """Rows of every readable episode; every failure is recorded in `outcome`, none is lost."""
    require_files(files)
    with progress_bar() as progress:
        for path in files:
            task = progress.add_task(path.name, total=path.stat().st_size)
            for episode in load(path, outcome.diagnostics):
                try:
                    result = build_rows(episode, settings)
                except (
                    Exception
                ) as error:  # an episode that cannot become rows must not stop the rest
                    outcome.failed += 1
                    err.print(f"[red]error[/]: {path}: episode {episode.id}: {error}", markup=True)
                    continue
                outcome.episodes += 1
                yield result
                progress.update(
                    task, advance=0, description=f"{path.name} · {outcome.episodes} episodes"
                )
            progress.update(task, completed=path.stat().st_size)


@app.command("rows")
def rows_command(
    files: FilesArg,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="One JSON object per row on stdout")
    ] = False,
    tokens: Annotated[
        bool, typer.Option("--tokens", help="Add token_ids, loss_mask, logprobs")
    ] = False,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write rows to a .parquet or .jsonl file")
    ] = None,
    max_identical: MaxIdentical = 1,
) -> None:
    """Turn episodes into training rows: one per leaf, each kept call trained exactly once."""
    if out_file is not None and out_file.suffix not in (".parquet", ".jsonl"):
        err.print(f"error: --out {out_file}: expected a .parquet or .jsonl file")
        raise typer.Exit(EXIT_USAGE)
    outcome = Outcome()
    settings = RowSettings(max_identical_trained=max_identical)
    with _RowSink(out_file) as sink:
        for result in episode_rows(files, settings, outcome):
            sink.add(result)
            if jsonl:
                _print_jsonl(result, tokens)
            elif out_file is None:
                print_rows_table(result)
    if out_file is not None:
        err.print(f"wrote {sink.count} rows to {out_file}")
    raise typer.Exit(outcome.report())


def _print_jsonl(result: EpisodeRows, tokens: bool) -> None:
    write = sys.stdout.buffer.write
    for row in result.rows:
        write(orjson.dumps(row_record(row, tokens), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    sys.stdout.buffer.flush()


class _RowSink:
    """Collects rows for --out, written as Parquet (one row group per episode batch) or JSONL."""

    def __init__(self, path: Path | None):
        self.path = path
        self.count = 0
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl = None

    def __enter__(self) -> _RowSink:
        if self.path is not None and self.path.suffix == ".jsonl":
            self._jsonl = self.path.open("wb")
        return self

    def add(self, result: EpisodeRows) -> None:
        if self.path is None or not result.rows:
            return
        self.count += len(result.rows)
        if self._jsonl is not None:
            for row in result.rows:
                self._jsonl.write(
                    orjson.dumps(row_record(row, True), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
                )
            return
        table = rows_table(result.rows)
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.path, table.schema)
        self._parquet.write_table(table)

    def __exit__(self, *exc: object) -> None:
        if self._parquet is not None:
            self._parquet.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self.path is not None and self.path.suffix == ".parquet" and self._parquet is None:
            pq.write_table(rows_table([]), self.path)


def rows_table_view(result: EpisodeRows) -> Table:
    """The table of docs/episode-format.md: row, leaf, walk, trains, context only (rows numbered from 1 as there)."""
    table = Table(title=f"episode {result.episode.id}", title_justify="left")
    for name in ("row", "leaf", "walk", "trains", "context only", "tokens", "loss", "reward"):
        if name in ("walk", "trains", "context only"):
            # Call ids can be long (transcripts name calls by API response): wrap between ids.
            table.add_column(name, ratio=1)
        else:
            table.add_column(name, justify="left" if name == "leaf" else "right", no_wrap=True)
    for row in result.rows:
        note = (
            f" [dim](duplicate of {row.duplicate_of + 1})[/]"
            if row.duplicate_of is not None
            else ""
        )
        table.add_row(
            str(row.index + 1),
            row.leaf.id,
            " ".join(c.id for c in row.path),
            " ".join(c.id for c in row.trains) + note,
            " ".join(c.id for c in row.context),
            str(row.num_tokens),
            str(row.num_loss_tokens),
            f"{row.reward:g}",
        )
    return table


def print_rows_table(result: EpisodeRows) -> None:
    out.print(rows_table_view(result))
    summary = check_rows(result)
    out.print(f"check: {summary.line()}")


@app.command("check")
def check_command(files: FilesArg, max_identical: MaxIdentical = 1) -> None:
    """Check every row invariant; print a per-episode summary; exit 1 on any violation."""
    outcome = Outcome()
    table = Table(title="row invariants")
    for name in ("episode", "kept calls", "rows", "check"):
        table.add_column(name)
    violations = 0
    for result in episode_rows(files, RowSettings(max_identical_trained=max_identical), outcome):
        summary = check_rows(result)
        violations += len(summary.violations)
        mark = "[green]ok[/]" if summary.ok else "[red]FAIL[/]"
        table.add_row(
            result.episode.id,
            str(summary.kept_calls),
            str(summary.rows),
            f"{mark} {summary.line()}",
        )
        for violation in summary.violations:
            err.print(f"[red]violation[/]: {violation}", markup=True)
    out.print(table)
    status = outcome.report()
    raise typer.Exit(EXIT_FAILED if violations else status)
