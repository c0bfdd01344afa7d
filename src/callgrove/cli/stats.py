"""`callgrove stats`: what a set of episode files holds, read in one streaming pass.

Episodes, agents by name, calls, tokens, errors by type, the ok rate and how far off-policy
the episodes are. Memory does not grow with the files: each episode is tallied and dropped.
An episode with no agents (cancelled, or failed before the env ran) is counted under errors
and never appears in the per-agent tallies.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from callgrove.cli.app import EXIT_FAILED, EXIT_OK, app, err, out, progress_bar, require_files
from callgrove.episode import Stats, load
from callgrove.formats.problems import Diagnostics

# Problems printed one by one before the rest are only counted.
SHOWN_PROBLEMS = 20
COLLECT_EVERY = 64


def collect(
    files: Iterable[Path],
    diagnostics: Diagnostics,
    training_step: int | None = None,
    skip_bad: bool = False,
) -> Stats:
    """Stream every file into one `Stats`. Problems go to `diagnostics`; without `skip_bad`
    the first error stops the reading (the error is the last problem recorded)."""
    stats = Stats()
    with progress_bar() as progress:
        for path in files:
            task = progress.add_task(path.name, total=path.stat().st_size)
            seen_errors = len(diagnostics.errors)
            for episode in load(path, diagnostics):
                if not skip_bad and len(diagnostics.errors) > seen_errors:
                    return stats
                stats.add(episode, training_step)
                if stats.episodes % COLLECT_EVERY == 0:
                    # An episode is a reference cycle (agent <-> call), freed only by the
                    # cycle collector; run it as we go so memory stays flat.
                    gc.collect()
                    progress.update(task, description=f"{path.name} · {stats.episodes} episodes")
            progress.update(task, completed=path.stat().st_size)
            if not skip_bad and len(diagnostics.errors) > seen_errors:
                return stats
    return stats


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def summary_table(stats: Stats) -> Table:
    table = Table(title="episodes", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = [
        ("episodes", f"{stats.episodes}"),
        ("ok", f"{stats.ok} ({_percent(stats.ok, stats.episodes)})"),
        ("with errors", f"{stats.with_errors}"),
        ("without agents", f"{stats.without_agents}"),
        ("calls (kept)", f"{stats.calls} ({stats.kept_calls})"),
        ("prompt tokens", f"{stats.prompt_tokens}"),
        ("completion tokens", f"{stats.completion_tokens}"),
        ("distinct tokens stored", f"{stats.stored_tokens}"),
    ]
    rows += [(f"run {kind}", f"{count}") for kind, count in sorted(stats.run_types.items())]
    for row in rows:
        table.add_row(*row)
    return table


def agents_table(stats: Stats) -> Table:
    table = Table(title="agents by name", title_justify="left")
    for name in ("name", "agents", "trainable", "calls", "kept", "prompt tok", "completion tok"):
        table.add_column(name, justify="left" if name == "name" else "right")
    table.add_column("errors", justify="right")
    for name, tally in sorted(stats.agents.items()):
        table.add_row(
            name,
            str(tally.agents),
            str(tally.trainable),
            str(tally.calls),
            str(tally.kept_calls),
            str(tally.prompt_tokens),
            str(tally.completion_tokens),
            str(tally.errors),
        )
    return table


def errors_table(stats: Stats) -> Table:
    table = Table(title="errors by type", title_justify="left")
    table.add_column("type")
    table.add_column("count", justify="right")
    for kind, count in stats.errors.most_common():
        table.add_row(kind, str(count))
    return table


def spread_table(stats: Stats) -> Table:
    spread = stats.spread
    table = Table(title="off-policy steps", title_justify="left")
    for name in ("steps", "episodes (total)", "in flight", "in queue"):
        table.add_column(name, justify="right")
    steps = sorted(set(spread.by_total) | set(spread.in_flight) | set(spread.in_queue))
    for step in steps:
        table.add_row(
            str(step),
            str(spread.by_total[step]),
            str(spread.in_flight[step]),
            str(spread.in_queue[step]),
        )
    table.caption = f"frozen policy (never stale): {spread.frozen}" + (
        f" · no training step known: {spread.unknown_step}" if spread.unknown_step else ""
    )
    return table


def _report(diagnostics: Diagnostics) -> None:
    for problem in diagnostics.problems[:SHOWN_PROBLEMS]:
        style = "yellow" if problem.severity == "warning" else "red"
        err.print(f"[{style}]{problem.severity}[/]: {problem}", markup=True, highlight=False)
    hidden = len(diagnostics.problems) - SHOWN_PROBLEMS
    if hidden > 0:
        counts = ", ".join(f"{n} {kind}" for kind, n in diagnostics.counts().most_common())
        err.print(f"… and {hidden} more problems ({counts} in all)")


@app.command("stats")
def stats_command(
    files: Annotated[
        list[Path], typer.Argument(help="Episode files (.jsonl[.gz|.zst], .parquet, .arrow)")
    ],
    step: Annotated[
        int | None,
        typer.Option(
            "--step", help="Training step to measure staleness at (default: each run.step)"
        ),
    ] = None,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad", help="Skip and count unreadable lines instead of stopping at the first"
        ),
    ] = False,
) -> None:
    """Episodes, agents by name, calls, tokens, errors by type, ok rate, off-policy spread.

    Exit 0 when every episode was read (a truncated final line is only a warning), 1 when
    any line or episode could not be used (with --skip-bad: after the tables), 2 on usage
    errors.
    """
    require_files(files)
    diagnostics = Diagnostics()
    stats = collect(files, diagnostics, step, skip_bad)
    if skip_bad or not diagnostics.errors:
        for table in (summary_table(stats), agents_table(stats), errors_table(stats)):
            out.print(table)
        out.print(spread_table(stats))
    _report(diagnostics)
    if diagnostics.errors and skip_bad:
        err.print(f"skipped {len(diagnostics.errors)} unusable line(s) or episode(s)")
    elif diagnostics.errors:
        err.print("stopped at the first unusable line; --skip-bad skips such lines and goes on")
    raise typer.Exit(EXIT_FAILED if diagnostics.errors else EXIT_OK)
