"""`callgrove bench`: every stage at three sizes, side by side with verifiers, NeMo Gym and the
numpy floor, in one run; one table on the terminal, the same as JSON and Markdown."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from callgrove.bench import BenchSettings, Report, run_bench, stream_case
from callgrove.bench.suite import (
    HEADLINE_COLUMNS,
    allocator_note,
    headline_cells,
    heap_bytes,
    keep_warm_heap,
    stage_cells,
    stage_columns,
    stream_line,
)
from callgrove.cli.app import app, err, out, require_output, safe
from callgrove.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from callgrove.formats.output import write_text

QUICK = {"4k": 80, "16k": 20}
REPORT_FORMS = (".json", ".md")
FULL = {"4k": 200, "16k": 50}


Episodes4kOption = Annotated[
    int | None, typer.Option("--episodes-4k", min=0, help="Largest 4k size (0 skips)")
]
Episodes16kOption = Annotated[
    int | None, typer.Option("--episodes-16k", min=0, help="Largest 16k size (0 skips)")
]
StreamGbOption = Annotated[
    float,
    typer.Option(
        "--stream-gb", help="Also stream `callgrove stats` over this many GB of JSON Lines (2)"
    ),
]
FiguresJsonOption = Annotated[
    bool, typer.Option("--json", help="The figures on stdout as one JSON object, not tables")
]
ReportFilesOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--out",
        "-o",
        metavar="FILE",
        help="Also write the figures to FILE.json or the tables to FILE.md (repeatable)",
    ),
]
WorkDirOption = Annotated[
    Path | None, typer.Option("--dir", help="Where the benchmark's files go (removed after)")
]
KeepMemoryOption = Annotated[
    bool,
    typer.Option(
        "--keep-freed-memory/--malloc-defaults",
        help="Have malloc keep freed memory (glibc) and touch its heap in advance, so no size "
        "pays for fresh pages",
    ),
]


@app.command("bench")
def bench_command(
    full: Annotated[
        bool,
        typer.Option(help="The published sizes (200 episodes at 4k, 50 at 16k) instead of half"),
    ] = False,
    episodes_4k: Episodes4kOption = None,
    episodes_16k: Episodes16kOption = None,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds")] = 3,
    seed: Annotated[int, typer.Option(help="Workload seed")] = 0,
    verifiers: Annotated[bool, typer.Option(help="Measure verifiers 0.4.0 alongside")] = True,
    gym: Annotated[bool, typer.Option(help="Measure NeMo Gym 0.7.0 alongside")] = True,
    memory: Annotated[bool, typer.Option(help="Measure peak memory (one untimed run)")] = True,
    stream_gb: StreamGbOption = 0.0,
    as_json: FiguresJsonOption = False,
    outputs: ReportFilesOption = None,
    work_dir: WorkDirOption = None,
    keep_memory: KeepMemoryOption = True,
) -> None:
    """Measure every stage (read, forest, rows, check, credit, samples, pack, tree pack, write)
    at three sizes against verifiers, NeMo Gym and the numpy floor. Exit 1 if a target is missed."""
    _check_report_files(outputs or [])
    settings = BenchSettings(
        episodes=_sizes(full, episodes_4k, episodes_16k),
        rounds=rounds,
        seed=seed,
        verifiers=verifiers,
        gym=gym,
        memory=memory,
    )
    report = _measure(settings, work_dir, keep_memory, stream_gb)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report.to_json()) + b"\n")
    else:
        _print(report)
    _write_reports(report, outputs or [])
    missed = [name for name, ok in report.checks() if not ok]
    raise typer.Exit(EXIT_FAILED if missed or report.missing else EXIT_OK)


def _check_report_files(paths: list[Path]) -> None:
    """Every `--out` a report form (a usage error otherwise) that can be written, checked
    before the benchmark runs."""
    for path in paths:
        if path.suffix not in REPORT_FORMS:
            err.print(f"error: --out {safe(path)}: expected a {' or '.join(REPORT_FORMS)} file")
            raise typer.Exit(EXIT_USAGE)
    for path in paths:
        require_output(path, [], "--out")


def _sizes(full: bool, episodes_4k: int | None, episodes_16k: int | None) -> dict[str, int]:
    """Each context's largest size: the published or the quick ones, as the options override
    them; a context of 0 episodes is skipped."""
    sizes = dict(FULL if full else QUICK)
    if episodes_4k is not None:
        sizes["4k"] = episodes_4k
    if episodes_16k is not None:
        sizes["16k"] = episodes_16k
    return {context: n for context, n in sizes.items() if n > 0}


def _measure(
    settings: BenchSettings, work_dir: Path | None, keep_memory: bool, stream_gb: float
) -> Report:
    """Run the benchmark in a folder of its own under `work_dir`, removed after, its progress
    on stderr."""
    kept = keep_memory and keep_warm_heap()
    heap_at_start = heap_bytes()
    work = Path(tempfile.mkdtemp(prefix="callgrove-bench-", dir=work_dir))
    try:
        with err.status("benchmark") as status:
            report = run_bench(settings, work, lambda what: status.update(f"benchmark: {what}"))
            report.allocator = allocator_note(kept, heap_at_start)
            if stream_gb > 0:
                status.update(f"benchmark: streaming {stream_gb} GB")
                report.stream = stream_case(work, stream_gb, settings.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _write_reports(report: Report, paths: list[Path]) -> None:
    """The figures as JSON to each `.json` path, the tables as Markdown to each `.md` one."""
    for path in paths:
        if path.suffix == ".json":
            write_text(path, orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode())
        else:
            write_text(path, report.markdown())
        err.print(f"wrote {safe(path)}")


def _print(report: Report) -> None:
    title = f"file to trainer samples: M call tokens/s, {report.settings.rounds} rounds"
    _table(title, HEADLINE_COLUMNS, headline_cells(report))
    for context in report.settings.episodes:
        title = f"{context}: M call tokens/s (episodes/s), best of the rounds"
        _table(title, stage_columns(report, context), stage_cells(report, context))
    out.print(f"malloc: {report.allocator}")
    for name, ok in report.checks():
        out.print(f"{'met   ' if ok else 'MISSED'} {name}")
    for name, why in report.missing.items():
        out.print(f"not run: {name}: {why}")
    if report.stream:
        out.print(stream_line(report.stream))


def _table(title: str, columns: Sequence[str], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("context", "path", "stage") else "right"
        )
    for row in rows:
        table.add_row(*row)
    out.print(table)
