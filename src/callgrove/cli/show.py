"""`callgrove show`: an episode's call trees, its rows and the check line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.tree import Tree

from callgrove.cli.app import EXIT_FAILED, app, err, out
from callgrove.cli.rows import FilesArg, Outcome, episode_rows, print_rows_table
from callgrove.rows import EpisodeRows, RowSettings


@app.command("show")
def show_command(
    files: FilesArg,
    episode_id: Annotated[str | None, typer.Option("--episode", help="Only this episode")] = None,
) -> None:
    """Each episode's call trees, its rows and the check line."""
    outcome = Outcome()
    shown = 0
    for result in episode_rows(files, RowSettings(), outcome):
        if episode_id is not None and result.episode.id != episode_id:
            continue
        shown += 1
        out.print(forest_view(result))
        print_rows_table(result)
    if episode_id is not None and not shown:
        err.print(f"error: no episode {episode_id!r} in {', '.join(map(str, files))}")
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(outcome.report())


def forest_view(result: EpisodeRows) -> Tree:
    """A rich Tree per call tree: call id, agent, purpose, token counts, leaf and row markers."""
    forest = result.forest
    row_of_leaf = {id(row.leaf): row for row in result.rows}
    trained_in = {id(c): row for row in result.rows for c in row.trains}
    episode = result.episode
    top = Tree(
        f"[bold]{episode.id}[/]  reward {episode.reward:g}  {len(forest.roots)} trees, {len(forest.leaves)} leaves"
    )

    def label(index: int) -> str:
        call = forest.calls[index]
        agent = call.agent
        parts = [f"[bold]{call.id}[/]", f"{agent.id}·{agent.name}" if agent else "?"]
        if call.purpose != "turn":
            parts.append(f"[magenta]{call.purpose}[/]")
        parts.append(
            f"[dim]+{call.full_len - (forest.calls[forest.parent[index]].full_len if forest.parent[index] >= 0 else 0)} tok, completion {len(call.completion_ids)}[/]"
        )
        parts.append(f"trained in row {trained_in[id(call)].index + 1}")
        if id(call) in row_of_leaf:
            parts.append(f"[green]leaf → row {row_of_leaf[id(call)].index + 1}[/]")
        return "  ".join(parts)

    def grow(node: Tree, index: int) -> None:
        for child in forest.children[index]:
            grow(node.add(label(child)), child)

    for root in forest.roots:
        grow(top.add(label(root)), root)
    return top
