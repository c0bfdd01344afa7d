"""`callgrove show`: an episode's call trees, its rows and the check line, or its picture."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.tree import Tree

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
    err,
    out,
    require_output,
    safe,
)
from callgrove.cli.rows import (
    EpisodeOption,
    check_record,
    episode_reward,
    episode_reward_text,
    episode_rows,
    print_rows_table,
    require_episode_found,
)
from callgrove.episode.files import EPISODE_FORMS
from callgrove.errors import EXIT_FAILED, EXIT_USAGE
from callgrove.forest import Forest
from callgrove.formats.output import write_text
from callgrove.pictures import Picture, layout, render_html, render_svg
from callgrove.pictures.text import agent_labels, clip_middle
from callgrove.rows import EpisodeRows, RowSettings, check_rows
from callgrove.rows.table import row_record

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
    "Each episode's call trees, its rows and the check line; or its picture (-o FILE.svg, "
    f"-o FILE.html); or all of it as JSON (--json). Reads {EPISODE_FORMS}."
    "\n\nA picture has one lane per agent in ledger order and a box per call placed by seq, "
    "with parent arrows, dashed hand-over links where agents start, compactions and leaves "
    "marked, and each row's colour on the calls it trains. With -o the files are the output: "
    "the terminal view is not printed, and each written path is reported on stderr. "
    "--svg FILE and --html FILE name one form each (both may be given)."
)


@app.command("show", help=SHOW_HELP)
def show_command(
    files: FilesArg,
    episode_id: EpisodeOption = None,
    svg: Annotated[Path | None, typer.Option("--svg", metavar="FILE", help=SVG_HELP)] = None,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help=HTML_HELP)] = None,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Draw to FILE.svg or FILE.html, by the suffix."
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Each episode on stdout as one JSON object a line: its calls (parent, agent, "
            "purpose, tokens, the row training each), its rows and its check.",
        ),
    ] = False,
    invocations: InvocationsOption = None,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    if out_file is not None:
        if out_file.suffix not in (".svg", ".html"):
            err.print(f"error: --out {safe(out_file)}: expected an .svg or .html file")
            raise typer.Exit(EXIT_USAGE)
        svg, html = (out_file, html) if out_file.suffix == ".svg" else (svg, out_file)
    require_output(svg, files, "--svg")
    require_output(html, files, "--html")
    drawing = svg is not None or html is not None
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    pictures: list[Picture] = []
    for result in episode_rows(files, RowSettings(), outcome, episode_id, invocations):
        if drawing:
            pictures.append(layout(result))
        if as_json:
            sys.stdout.buffer.write(orjson.dumps(episode_record(result)) + b"\n")
        elif not drawing:
            out.print(forest_view(result), soft_wrap=False)  # labels wrap inside the tree
            print_rows_table(result)
    require_episode_found(episode_id, outcome, files)
    if drawing:
        _write_pictures(pictures, svg, html, files)
    raise typer.Exit(outcome.report())


def prompt_added(forest: Forest, index: int) -> int:
    """The prompt tokens a call adds to its parent's full sequence (all of them for a root)."""
    parent = forest.parent[index]
    return forest.calls[index].prompt_len - (forest.calls[parent].full_len if parent >= 0 else 0)


def episode_record(result: EpisodeRows) -> dict[str, object]:
    """What `show` prints of an episode, as one JSON object (`show --json`)."""
    forest, episode = result.forest, result.episode
    trained_in = {c.index: row.index for row in result.rows for c in row.trains}
    leaf_of = {row.leaf.index: row.index for row in result.rows}
    calls = []
    for index, call in enumerate(forest.calls):
        parent = forest.parent[index]
        agent = episode.agent_of(call)
        calls.append(
            {
                "call": call.id,
                "seq": call.seq,
                "agent": agent.id,
                "agent_name": agent.name,
                "purpose": call.purpose,
                "parent": forest.calls[parent].id if parent >= 0 else None,
                "prompt_added": prompt_added(forest, index),
                "completion": len(call.completion_ids),
                "trained_in_row": trained_in.get(call.index),
                "leaf_of_row": leaf_of.get(call.index),
            }
        )
    return {
        "episode": episode.id,
        "group": episode.group,
        "reward": episode_reward(episode) if episode.scored else None,
        "calls": calls,
        "rows": [row_record(result, row) for row in result.rows],
        "check": check_record(check_rows(result)),
    }


def _write_pictures(
    pictures: list[Picture], svg: Path | None, html: Path | None, files: list[Path]
) -> None:
    if not pictures:
        err.print("error: no episode to draw")
        raise typer.Exit(EXIT_FAILED)
    if svg is not None:
        paths = svg_file_names(svg, [p.episode.id for p in pictures])
        for picture, path in zip(pictures, paths, strict=True):
            require_output(path, files, "--svg")
            write_text(path, render_svg(picture))
            err.print(f"wrote {safe(path)} (episode {safe(picture.episode.id)})")
    if html is not None:
        write_text(html, render_html(pictures, title=", ".join(path.name for path in files)))
        err.print(f"wrote {safe(html)} ({len(pictures)} episode(s))")


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
            f"error: --svg: episode ids give the same file name ({safe(', '.join(clashes))}); "
            "draw them one at a time with --episode",
        )
        raise typer.Exit(EXIT_USAGE)
    return names


# A run of at least this many calls, each the only child of the one before, prints as one line.
CHAIN_FOLD = 3
CHAIN_SHOWN = 4  # a folded run this short names every call
ID_CHARS = 28


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else words or word + 's'}"


def forest_view(result: EpisodeRows) -> Tree:
    """A rich Tree per call tree: call id, agent, purpose, token counts, leaf and row markers.

    Branches stay visible; a linear run of calls (each the only child of the one before, as
    in a long single-agent session) folds into one line, `C1 → … → C80 (80 calls)`, so the
    tree keeps to the width of the terminal however long a session runs."""
    forest = result.forest
    row_of_leaf = {row.leaf.index: row.index for row in result.rows}
    trained_in = {c.index: row.index for row in result.rows for c in row.trains}
    episode = result.episode
    labels = agent_labels(episode.agents)
    reward = episode_reward_text(episode, lambda agent: labels[agent.id])
    top = Tree(
        f"[bold]{safe(episode.id)}[/]  {reward}  {plural(len(forest.roots), 'tree')}, "
        f"{plural(len(forest.leaves), 'leaf', 'leaves')}, {plural(len(result.rows), 'row')}"
    )

    def added(index: int) -> int:
        return prompt_added(forest, index)

    def label(index: int) -> str:
        call = forest.calls[index]
        agent = episode.agent_of(call)
        label = labels[agent.id]
        who = label if label == agent.name else f"{clip_middle(label, ID_CHARS)}·{agent.name}"
        if agent.parent is not None and agent.start:  # a gateway names every subagent alike
            who = f"{who} ({agent.start})"
        parts = [f"[bold]{safe(clip_middle(call.id, ID_CHARS))}[/]", safe(who)]
        if call.purpose != "turn":
            parts.append(f"[magenta]{safe(call.purpose)}[/]")
        parts.append(f"[dim]prompt +{added(index):,}, completion {len(call.completion_ids):,}[/]")
        parts.append(f"trained in row {trained_in[call.index]}")
        if call.index in row_of_leaf:
            parts.append(f"[green]leaf of row {row_of_leaf[call.index]}[/]")
        return "  ".join(parts)

    def chain_from(index: int) -> list[int]:
        chain = [index]
        while len(forest.children[chain[-1]]) == 1:
            chain.append(forest.children[chain[-1]][0])
        return chain

    def chain_label(chain: list[int]) -> str:
        calls = [forest.calls[i] for i in chain]
        agents = ", ".join(
            dict.fromkeys(clip_middle(labels[episode.agent_of(c).id], ID_CHARS) for c in calls)
        )
        ids = [clip_middle(c.id, ID_CHARS) for c in calls]
        compactions = sum(c.purpose == "compaction" for c in calls)
        rows = sorted({trained_in[c.index] for c in calls})
        prompt = sum(added(i) for i in chain)
        completion = sum(len(c.completion_ids) for c in calls)
        parts = [
            f"[bold]{safe(' → '.join(ids) if len(ids) <= CHAIN_SHOWN else f'{ids[0]} → … → {ids[-1]}')}[/]",
            f"{len(calls)} calls",
            safe(agents),
            f"[dim]prompt +{prompt:,}, completion {completion:,}[/]",
            f"trained in row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}",
        ]
        if compactions:
            parts.insert(3, f"[magenta]{compactions} compaction{'s' if compactions > 1 else ''}[/]")
        if calls[-1].index in row_of_leaf:
            parts.append(f"[green]leaf of row {row_of_leaf[calls[-1].index]}[/]")
        return "  ".join(parts)

    def grow(node: Tree, index: int) -> None:
        chain = chain_from(index)
        if len(chain) >= CHAIN_FOLD:
            branch = node.add(chain_label(chain))
        else:
            branch = node.add(label(index))
            chain = [index]
        for child in forest.children[chain[-1]]:
            grow(branch, child)

    for root in forest.roots:
        grow(top, root)
    return top
