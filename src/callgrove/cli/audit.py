"""`callgrove audit CAPTURE BATCH`: for every token a policy sampled in the capture, how many
times the batch a trainer was fed trains it, in which context, in whose row and with what
advantage (`callgrove.audit`)."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Annotated

import numpy as np
import orjson
import typer
from rich import box
from rich.table import Table

from callgrove.audit import AuditReport, CallAudit, Referee
from callgrove.audit.batches import BATCH_FORMS, read_batch
from callgrove.audit.stacks import STACKS
from callgrove.cli.accounting import (
    SHOWN_PROBLEMS,
    AcceptLossOption,
    CommandOutcome,
    ReadTokenizerOption,
    reading_chat,
)
from callgrove.cli.app import (
    InvocationsOption,
    app,
    cell,
    episode_inputs,
    err,
    out,
    progress_bar,
    read_input,
    reading,
    safe,
)
from callgrove.errors import EXIT_FAILED, InvalidValue
from callgrove.formats.output import NewFile

EXACT = "exact: no sampled token trains twice or in a wrong context"


@app.command("audit")
def audit_command(
    capture: Annotated[
        list[Path],
        typer.Argument(
            help="The episodes (files or folders, any form callgrove reads), then the batch: "
            "callgrove samples (.parquet, .arrow, .jsonl), prime-rl TrainingSamples "
            "(.msgpack), or a TRL / verl / OpenRLHF / NeMo RL batch saved as tensors (.pt, .npz).",
            show_default=False,
        ),
    ],
    batch_form: Annotated[
        str | None,
        typer.Option(
            "--batch-form",
            help=f"The batch's form, when its file does not tell it: {', '.join(BATCH_FORMS)}.",
        ),
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            "--stack",
            help="Referee this stack's rows, built from the capture itself (every argument is "
            f"then capture): {', '.join(STACKS)}.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The report as one JSON object on stdout.")
    ] = False,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the JSON report to this file.")
    ] = None,
    invocations: InvocationsOption = None,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    """Referee a trainer's batch against the capture it came from.

    For every sampled token (a completion token of a kept call of a trainable agent): trained
    0, 1 or 2+ times; trained in a wrong context (its tokens behind other tokens than it was
    sampled after); which agent's row trained it and with what advantage. Also every loss-on
    token no policy sampled. Exit 1 when a sampled token trains twice or in a wrong context,
    or when the capture could not be read whole. With `--stack`, the rows are the ones that
    stack's builder makes of the capture (docs/audit.md says how each is run)."""
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    if stack is not None:
        if stack not in STACKS:
            raise InvalidValue(f"--stack {stack!r}: one of {', '.join(STACKS)}")
        capture_paths, batch_name, form = capture, f"{STACKS[stack].name}'s rows", stack
        episodes = list(_episodes(capture_paths, outcome, invocations))
        referee = Referee(episodes)
        rows = (row for episode in episodes for row in STACKS[stack].rows(episode))
    else:
        if len(capture) < 2:
            raise InvalidValue("audit takes the capture (one or more paths), then the batch")
        *capture_paths, batch_path = capture
        if batch_form is not None and batch_form not in BATCH_FORMS:
            raise InvalidValue(f"--batch-form {batch_form!r}: one of {', '.join(BATCH_FORMS)}")
        form, rows = read_batch(batch_path, batch_form)  # before the capture: it fails sooner
        batch_name = str(batch_path)
        referee = Referee(_episodes(capture_paths, outcome, invocations))
    for row in rows:
        referee.take(row)
    report = referee.report()
    status = outcome.report()
    record = _record(report, form, capture_paths, batch_name)
    if output is not None:
        new = NewFile(output)
        new.temp.write_bytes(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))
        new.commit()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    else:
        out.print(_seat_table(report, form, batch_name))
        for line in _problems(report):
            err.print(safe(line))
        for line in _summary(report):
            out.print(safe(line))
    raise typer.Exit(EXIT_FAILED if not report.exact else status)


def _episodes(paths: list[Path], outcome: CommandOutcome, invocations: Path | None):
    """Every episode of the capture read once; what could not be read is in `outcome`."""
    with progress_bar("bytes") as progress:
        for path in episode_inputs(paths, invocations):
            located = read_input(path, outcome.diagnostics, invocations, outcome.chat)
            for line, episode in reading(progress, path, located):
                if outcome.admit(episode, path, line):
                    yield episode


def _record(report: AuditReport, form: str, capture: list[Path], batch: str) -> dict:
    return {
        "capture": [str(path) for path in capture],
        "batch": batch,
        "batch_form": form,
        "total": report.totals(),
        "calls": [call.record() for call in report.calls],
        "trained_unsampled": [
            {"row": unsampled.row, "positions": unsampled.positions}
            for unsampled in report.unsampled
        ],
    }


def _seat_table(report: AuditReport, form: str, batch: str) -> Table:
    """One line per seat (agent name): its sampled tokens and how the batch trained them."""
    table = Table(
        title=safe(f"audit of {batch} ({form}): sampled tokens by seat"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for number, name in enumerate(
        (
            "seat",
            "calls",
            "sampled",
            "trained 0",
            "1",
            "2+",
            "wrong context",
            "in rows of",
            "advantage",
        )
    ):
        table.add_column(name, justify="left" if number in (0, 7) else "right")
    by_seat: dict[str, list[CallAudit]] = defaultdict(list)
    for call in report.to_train():
        by_seat[call.seat].append(call)
    for seat, calls in by_seat.items():
        owners: Counter[str] = Counter()
        advantages = []
        for call in calls:
            for training in call.trainings:
                owners[training.row_seat] += training.tokens
                if training.advantage is not None:
                    advantages.append(training.advantage)
        twice = sum(c.twice_or_more for c in calls)
        wrong = sum(c.wrong_context_tokens for c in calls)
        table.add_row(
            cell(seat),
            f"{len(calls):,}",
            f"{sum(c.tokens for c in calls):,}",
            _untrained(calls),
            f"{sum(c.once for c in calls):,}",
            cell(f"{twice:,}", "red" if twice else ""),
            cell(f"{wrong:,}", "red" if wrong else ""),
            cell(", ".join(f"{name} {count:,}" for name, count in owners.most_common(3))),
            _spread(advantages),
        )
    return table


def _untrained(calls: list[CallAudit]) -> str:
    untrained = sum(c.untrained for c in calls)
    twins = sum(c.twin_untrained for c in calls)
    return f"{untrained:,}" + (f" ({twins:,} twin)" if twins else "")


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    if np.isclose(low, high):
        return f"{low:+.3g}"
    return f"{low:+.3g} … {high:+.3g}"


def _problems(report: AuditReport) -> list[str]:
    """The calls trained twice or in a wrong context, and the rows training unsampled tokens,
    the first `SHOWN_PROBLEMS` of each."""
    twice = [c for c in report.to_train() if c.twice_or_more]
    wrong = [c for c in report.to_train() if c.wrong_context_tokens]
    lines = []
    for call in twice[:SHOWN_PROBLEMS]:
        rows = ", ".join(sorted({t.row for t in call.trainings}))
        lines.append(
            f"trained twice: episode {call.episode}, call {call.call} ({call.seat}): "
            f"{call.twice_or_more:,} of {call.tokens:,} tokens, in {rows}"
        )
    for call in wrong[:SHOWN_PROBLEMS]:
        rows = ", ".join(sorted({t.row for t in call.trainings if not t.in_context}))
        lines.append(
            f"wrong context: episode {call.episode}, call {call.call} ({call.seat}): "
            f"{call.wrong_context_tokens:,} tokens, in {rows}"
        )
    for unsampled in report.unsampled[:SHOWN_PROBLEMS]:
        lines.append(
            f"not sampled: {unsampled.row}: {len(unsampled.positions):,} loss-on token(s) no "
            f"policy sampled, from position {unsampled.positions[0]:,}"
        )
    hidden = len(twice) + len(wrong) + len(report.unsampled) - len(lines)
    if hidden > 0:
        lines.append(f"… and {hidden:,} more (--json lists every one)")
    return lines


def _summary(report: AuditReport) -> list[str]:
    twins = (
        f" ({report.twin_untrained:,} of them a twin's, trained there)"
        if report.twin_untrained
        else ""
    )
    lines = [
        f"sampled: {report.sampled_tokens:,} tokens to train; trained once "
        f"{report.once:,}, never {report.untrained:,}{twins}, twice or more "
        f"{report.twice_or_more:,}, in a wrong context {report.wrong_context:,}",
        f"batch: {report.rows:,} rows, {report.row_tokens:,} tokens forwarded "
        f"({report.forwarded_per_sampled:.2f} per sampled token), {report.loss_tokens:,} "
        f"loss-on; {report.unsampled_tokens:,} no policy sampled; "
        f"{report.trained_not_to_train:,} of calls not to train",
    ]
    if report.exact:
        lines.append(EXACT)
    else:
        lines.append(
            f"NOT exact: {report.twice_or_more:,} sampled token(s) trained twice or more, "
            f"{report.wrong_context:,} in a wrong context"
        )
    return lines
