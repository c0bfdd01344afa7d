"""`callgrove synth`: write synthetic multi-agent episodes of a chosen shape (seeded)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from callgrove.cli.app import OutputOption, app, err, one_output, progress_bar, require_output, safe
from callgrove.episode import open_writer
from callgrove.errors import EXIT_USAGE, UsageError
from callgrove.synth import PRESETS, Shape, call_tokens, synth_episodes


@app.command("synth")
def synth_command(
    out: Annotated[
        Path | None,
        typer.Argument(
            metavar="OUT",
            help="Episode file (.jsonl[.gz|.zst], .parquet, .arrow)",
            show_default=False,
        ),
    ] = None,
    out_option: OutputOption = None,
    episodes: Annotated[int, typer.Option("--episodes", "-n", min=1, help="How many")] = 8,
    preset: Annotated[
        str, typer.Option(help=f"Base shape: {', '.join(PRESETS)}; the options below override it")
    ] = "4k",
    seed: Annotated[int, typer.Option(help="Episode i is generated from seed + i")] = 0,
    context: Annotated[int | None, typer.Option(help="Tokens a leader's history reaches")] = None,
    leader_calls: Annotated[int | None, typer.Option(min=1, help="Calls of the leader")] = None,
    subagent_calls: Annotated[int | None, typer.Option(min=1, help="Calls per subagent")] = None,
    fresh: Annotated[int | None, typer.Option(min=0, help="Fresh subagents")] = None,
    forks: Annotated[int | None, typer.Option(min=0, help="Forks of the leader")] = None,
    fork_depth: Annotated[int | None, typer.Option(min=1, help="Forks of forks, down to")] = None,
    background: Annotated[int | None, typer.Option(min=0, help="Background agents")] = None,
    twins: Annotated[int | None, typer.Option(min=0, help="Fresh subagents repeated")] = None,
    compactions: Annotated[int | None, typer.Option(min=0, help="Compactions per agent")] = None,
    system: Annotated[int | None, typer.Option(min=1, help="System prompt tokens")] = None,
) -> None:
    """Write seeded synthetic episodes: a leader with fresh, fork, background and twin
    subagents that compact; the same options and seed give the same file."""
    out = one_output(out, out_option)
    if preset not in PRESETS:
        err.print(f"error: --preset {preset!r}: choose one of {', '.join(PRESETS)}")
        raise typer.Exit(EXIT_USAGE)
    given = {
        name: value
        for name, value in {
            "context": context,
            "leader_calls": leader_calls,
            "subagent_calls": subagent_calls,
            "fresh": fresh,
            "forks": forks,
            "fork_depth": fork_depth,
            "background": background,
            "twins": twins,
            "compactions": compactions,
            "system": system,
        }.items()
        if value is not None
    }
    try:
        shape: Shape = replace(PRESETS[preset], **given)
    except ValueError as error:
        raise UsageError(str(error)) from None
    require_output(out, [])
    tokens = 0
    with progress_bar("episodes") as progress, open_writer(out) as writer:
        task = progress.add_task(out.name, total=episodes)
        for episode in synth_episodes(shape, episodes, seed):
            writer.write(episode)
            tokens += call_tokens(episode)
            progress.advance(task)
    err.print(
        f"{safe(out)}: {episodes} episodes, {shape.agents} agents and {shape.calls} calls each, "
        f"{tokens / 1e6:.2f}M call tokens"
    )
