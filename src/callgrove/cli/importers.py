"""`callgrove import claude-code|codex|join`: harness transcripts in, episodes out."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from callgrove.chat import BuiltinFormat, ChatFormat
from callgrove.cli.app import app, err, require_output, safe
from callgrove.cli.model_options import (
    ChatTemplateOption,
    ModelOption,
    TokenizerOption,
    open_chat,
)
from callgrove.episode import Episode, encode_episode, load, save
from callgrove.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from callgrove.forest import compact_prompts
from callgrove.formats.problems import Diagnostics, InputError
from callgrove.transcripts import (
    ImportReport,
    Transcript,
    TranscriptRenderer,
    import_claude_code,
    import_codex,
)
from callgrove.transcripts.join import join_capture

import_app = typer.Typer(
    help="Import harness transcripts (Claude Code, Codex) as episodes.", no_args_is_help=True
)
app.add_typer(import_app, name="import")

OutOption = Annotated[
    Path | None, typer.Option("--out", "-o", help="Episode file to write (default: stdout).")
]
AllowDroppedOption = Annotated[
    bool,
    typer.Option(
        "--allow-dropped-content",
        help="Import even where the chat template leaves message content out of the tokens "
        "(counted as warnings); by default that is an error.",
    ),
]
VarOption = Annotated[
    list[str] | None,
    typer.Option("--template-var", help="KEY=VALUE passed to the template (e.g. bos_token=<s>)."),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="The import's summary on stdout as one JSON object (the episodes then go to -o).",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="List every skipped line with its number.")
]


def _chat_format(
    model: str | None,
    tokenizer: Path | None,
    template: Path | None,
    variables: list[str] | None,
    allow_dropped: bool = False,
) -> ChatFormat:
    pairs = dict(v.split("=", 1) for v in variables or [] if "=" in v)
    try:
        return open_chat(model, tokenizer, template, variables=pairs, allow_dropped=allow_dropped)
    except (InputError, ValueError) as error:
        err.print(f"[red]error[/red]: {safe(str(error))}")
    except Exception as error:  # tokenizers raises plain exceptions for unreadable files
        err.print(f"[red]error[/red]: {safe(str(tokenizer))}: {safe(str(error))}")
    raise typer.Exit(EXIT_USAGE)


def _run_import(
    importer: Callable[[Path, ImportReport], list[Transcript]],
    path: Path,
    out: Path | None,
    chat_format: ChatFormat,
    verbose: bool,
    as_json: bool = False,
) -> None:
    if as_json and out is None:
        err.print("error: --json prints the summary on stdout: write the episodes with -o FILE")
        raise typer.Exit(EXIT_USAGE)
    require_output(out, [path], "--out")
    report = ImportReport()
    transcripts = importer(path, report)
    renderer = TranscriptRenderer(chat_format)
    episodes = renderer.episodes(transcripts, report.diagnostics)
    for what, count in sorted(getattr(chat_format, "dropped", {}).items()):
        report.problem(
            f"chat template drops content ({what}) in {count} message(s); kept as allowed by "
            "--allow-dropped-content",
            getattr(chat_format, "template_path", None),
            severity="warning",
        )
    failed = bool(report.diagnostics.errors)
    # Lines that could not be used are reported and the rest imported; an import that made
    # nothing at all leaves an earlier --out file as it was.
    kept = failed and not episodes and out is not None
    if not kept:
        _write(episodes, out)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(_summary_record(episodes, report)) + b"\n")
    _summary(episodes, report, verbose)
    if kept:
        err.print(f"nothing written to {safe(out)}: no episode was imported")
    raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)


def _write(episodes: list[Episode], out: Path | None) -> None:
    for episode in episodes:
        compact_prompts(episode)  # the written prompts reference each call's forest parent
    if out is not None:
        save(out, episodes)
        return
    stream = sys.stdout.buffer
    for episode in episodes:
        stream.write(encode_episode(episode))
    stream.flush()


def _summary_record(episodes: list[Episode], report: ImportReport) -> dict[str, object]:
    """What the summary on stderr says, as one JSON object (`--json`)."""
    return {
        "episodes": [
            {
                "episode": episode.id,
                "agents": len(episode.agents),
                "calls": sum(1 for _ in episode.calls()),
                "kept_calls": sum(c.kept for c in episode.calls()),
                "compaction_calls": sum(c.purpose == "compaction" for c in episode.calls()),
                "gaps": len(episode.gaps or []),
            }
            for episode in episodes
        ],
        "lines_read": sum(report.lines_read.values()),
        "lines_used": sum(len(lines) for lines in report.used.values()),
        "lines_skipped": len(report.skipped),
        "skipped": dict(report.skipped_reasons()),
        "errors": len(report.diagnostics.errors),
        "warnings": len(report.diagnostics.warnings),
    }


def _summary(episodes: list[Episode], report: ImportReport, verbose: bool) -> None:
    table = Table(title="imported episodes", title_justify="left")
    for column in ("episode", "agents", "calls", "kept", "compactions", "distinct tokens", "gaps"):
        table.add_column(column, justify="left" if column == "episode" else "right")
    for episode in episodes:
        calls = list(episode.calls())
        table.add_row(
            safe(episode.id),
            str(len(episode.agents)),
            str(len(calls)),
            str(sum(c.kept for c in calls)),
            str(sum(c.purpose == "compaction" for c in calls)),
            str(sum(len(c.prompt_suffix) + len(c.completion_ids) for c in calls)),
            str(len(episode.gaps or [])),
        )
    if episodes:  # an empty table says nothing the counts below do not
        err.print(table)
    read = sum(report.lines_read.values())
    used = sum(len(lines) for lines in report.used.values())
    err.print(
        f"{read} lines read from {len(report.lines_read)} file(s): {used} used, "
        f"{len(report.skipped)} skipped, {len(report.diagnostics.problems)} problem(s)"
    )
    for reason, count in report.skipped_reasons().most_common():
        err.print(f"  skipped {count:>5}  {safe(reason)}")
    if verbose:
        for problem in report.skipped:
            err.print(f"  {safe(str(problem))}")
    for problem in report.diagnostics.problems:
        colour = "red" if problem.severity == "error" else "yellow"
        err.print(f"[{colour}]{problem.severity}[/{colour}]: {safe(str(problem))}")
    for episode in episodes:
        for gap in episode.gaps or []:
            where = (
                f"in {episode.id}: {gap.agent or gap.file or gap.kind}: {gap.reason or gap.kind}"
            )
            err.print(f"[yellow]gap[/yellow] {safe(where)}")
    if not episodes:
        return
    err.print(
        "[bold]These episodes are for supervised training:[/bold] transcripts carry no sampling "
        "logprobs (objective=supervised, logprobs=null), so their rows cannot train "
        "importance-weighted RL. Join a capture (`callgrove import join`) for exact tokens."
    )


def _importer_command(name: str, importer: Callable[..., Any], what: str, doc: str) -> None:
    """`callgrove import NAME`: the importer over a file or folder of `what`, with the chat
    options every importer takes."""

    def command(
        path: Path,
        out: OutOption = None,
        model: ModelOption = None,
        tokenizer: TokenizerOption = None,
        chat_template: ChatTemplateOption = None,
        template_var: VarOption = None,
        allow_dropped_content: AllowDroppedOption = False,
        verbose: VerboseOption = False,
        as_json: JsonOption = False,
    ) -> None:
        chat = _chat_format(model, tokenizer, chat_template, template_var, allow_dropped_content)
        _run_import(importer, path, out, chat, verbose, as_json)

    # Set as an object: this module's annotations are strings, and `what` is not a global.
    command.__annotations__["path"] = Annotated[Path, typer.Argument(help=what)]
    import_app.command(name, help=doc)(command)


_importer_command(
    "claude-code",
    import_claude_code,
    "A session .jsonl file or a project folder.",
    "Claude Code sessions with their subagents, one episode per session.",
)
_importer_command(
    "codex",
    import_codex,
    "A rollout .jsonl file or a sessions folder.",
    "Codex rollouts, subagent threads joined to their parents, one episode per root thread.",
)


@import_app.command("join")
def join(
    transcript: Annotated[Path, typer.Argument(help="Episodes written by `callgrove import`.")],
    capture: Annotated[Path, typer.Argument(help="Episodes with the captured tokens.")],
    out: OutOption = None,
    tokenizer: TokenizerOption = None,
    as_json: JsonOption = False,
) -> None:
    """The capture's tokens and logprobs with the transcript's agent structure."""
    if as_json and out is None:
        err.print("error: --json prints the summary on stdout: write the episodes with -o FILE")
        raise typer.Exit(EXIT_USAGE)
    require_output(out, [transcript, capture], "--out")
    if tokenizer is None:
        decode = BuiltinFormat().decode
    else:
        from callgrove.chat.template import load_tokenizer

        loaded = load_tokenizer(tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer)
        decode = lambda ids: loaded.decode(ids.tolist(), skip_special_tokens=False)  # noqa: E731
    diagnostics = Diagnostics()
    transcripts = list(load(transcript, diagnostics))
    captures = {e.id: e for e in load(capture, diagnostics)}
    joined: list[Episode] = []
    summary: list[dict[str, object]] = []
    for episode in transcripts:
        match = captures.pop(episode.id, None)
        if match is None and len(transcripts) == 1 and len(captures) == 1:
            match = captures.popitem()[1]
        if match is None:
            err.print(
                f"[red]error[/red]: episode {safe(episode.id)}: no capture episode with this id"
            )
            summary.append({"episode": episode.id, "capture": None})
            continue
        result = join_capture(episode, match, decode)
        joined.append(result.episode)
        summary.append(
            {
                "episode": episode.id,
                "capture": match.id,
                "matched": len(result.matched),
                "unmatched_transcript": list(result.unmatched_transcript),
                "unmatched_capture": list(result.unmatched_capture),
            }
        )
        line = (
            f"{episode.id}: {len(result.matched)} calls matched; unmatched "
            f"{len(result.unmatched_transcript)} in the transcript "
            f"{result.unmatched_transcript or ''}, {len(result.unmatched_capture)} in the capture "
            f"{result.unmatched_capture or ''}"
        )
        err.print(safe(line))
    for problem in diagnostics.problems:
        err.print(f"[red]{problem.severity}[/red]: {safe(str(problem))}")
    failed = bool(diagnostics.errors) or len(joined) < len(transcripts)
    if failed and not joined and out is not None:  # nothing joined: an earlier file stays
        err.print(f"nothing written to {safe(out)}: no episode was joined")
    else:
        _write(joined, out)
    if as_json:
        record = {"episodes": summary, "errors": len(diagnostics.errors)}
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)
