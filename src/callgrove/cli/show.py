"""`callgrove show`: an episode's call trees, its rows and the check line, or its picture."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.tree import Tree

from callgrove.cli.app import EXIT_FAILED, EXIT_USAGE, app, err, out
from callgrove.cli.rows import FilesArg, Outcome, episode_rows, print_rows_table
from callgrove.pictures import Picture, layout, render_html, render_svg
from callgrove.rows import EpisodeRows, RowSettings

SVG_HELP = (
    "Draw the episode as SVG to this path. With several episodes, one file per episode beside "
    "it, named STEM.EPISODE-ID.svg (characters of the id other than letters, digits, '.', '_' "
    "and '-' become '_'); --episode draws just one."
)
HTML_HELP = (
    "Write one self-contained HTML page (no network) with a section per episode; hover a "
    "call to see its text and token counts."
)


SHOW_HELP = (
    "Each episode's call trees, its rows and the check line; or its picture (--svg, --html)."
    "\n\nA picture has one lane per agent in ledger order and a box per call placed by seq, "
    "with parent arrows, dashed hand-over links where agents start, compactions and leaves "
    "marked, and each row's colour on the calls it trains. With --svg or --html the files are "
    "the output: the terminal view is not printed, and each written path is reported on stderr."
)


@app.command("show", help=SHOW_HELP)
def show_command(
    files: FilesArg,
    episode_id: Annotated[str | None, typer.Option("--episode", help="Only this episode")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help=SVG_HELP)] = None,
    html: Annotated[Path | None, typer.Option("--html", help=HTML_HELP)] = None,
) -> None:
    drawing = svg is not None or html is not None
    outcome = Outcome()
    pictures: list[Picture] = []
    shown = 0
    for result in episode_rows(files, RowSettings(), outcome):
        if episode_id is not None and result.episode.id != episode_id:
            continue
        shown += 1
        if drawing:
            pictures.append(layout(result))
        else:
            out.print(forest_view(result))
            print_rows_table(result)
    if episode_id is not None and not shown:
        err.print(f"error: no episode {episode_id!r} in {', '.join(map(str, files))}")
        raise typer.Exit(EXIT_FAILED)
    if drawing:
        _write_pictures(pictures, svg, html, title=", ".join(path.name for path in files))
    raise typer.Exit(outcome.report())


def _write_pictures(
    pictures: list[Picture], svg: Path | None, html: Path | None, title: str
) -> None:
    if not pictures:
        err.print("error: no episode to draw")
        raise typer.Exit(EXIT_FAILED)
    if svg is not None:
        paths = svg_file_names(svg, [p.episode.id for p in pictures])
        for picture, path in zip(pictures, paths, strict=True):
            _write(path, render_svg(picture))
            err.print(f"wrote {path} (episode {picture.episode.id})", markup=False)
    if html is not None:
        _write(html, render_html(pictures, title))
        err.print(f"wrote {html} ({len(pictures)} episode(s))")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        err.print(f"error: cannot write {path}: {error.strerror or error}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None


def svg_file_names(path: Path, episode_ids: list[str]) -> list[Path]:
    """`path` for one episode; STEM.EPISODE-ID.svg beside it for each of several."""
    if len(episode_ids) == 1:
        return [path]
    names = [
        path.with_name(f"{path.stem}.{re.sub(r'[^A-Za-z0-9._-]', '_', i)}{path.suffix or '.svg'}")
        for i in episode_ids
    ]
    clashes = sorted({str(n) for n in names if names.count(n) > 1})
    if clashes:
        err.print(
            f"error: --svg: episode ids give the same file name ({', '.join(clashes)}); "
            "draw them one at a time with --episode",
            markup=False,
        )
        raise typer.Exit(EXIT_USAGE)
    return names


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
