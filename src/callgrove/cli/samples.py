"""`callgrove samples`: episodes to the credited samples a trainer takes, in a file.

Every episode of the inputs is read first: a group is scored together, and its episodes may
lie in several files. With `--algorithm` each group is scored (`scoring.score_groups`);
without it the advantages the episodes carry are used, and an episode that carries none is an
error, never a sample of `null` advantages. Failed episodes (`ok: false`) take no credit and
episodes without calls have no rows: both are skipped and counted. Supervised episodes
(imported transcripts) give samples without advantages, for a cross-entropy loss, and are
counted apart. Rows that train no token (a twin's duplicate, a row that only carries context)
give no sample: every trainer would refuse it. They are counted, never written.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import orjson
import typer
from rich.table import Table

from callgrove.batch import SAMPLE_FORMS, Sample, build_samples, sample_form, write_samples
from callgrove.cli.accounting import (
    AcceptLossOption,
    CommandOutcome,
    ReadTokenizerOption,
    reading_chat,
)
from callgrove.cli.app import (
    FilesArg,
    app,
    episode_inputs,
    err,
    progress_bar,
    read_input,
    reading,
    require_output,
    safe,
)
from callgrove.cli.rows import MaxIdentical
from callgrove.cli.scoring import (
    AlgorithmName,
    AlgorithmOption,
    DecayOption,
    LocalSeatOption,
    Located,
    ScaleOption,
    ScopeOption,
    Scoring,
    chosen_algorithm,
    never_scored,
    score_groups,
    unscored_message,
)
from callgrove.errors import UsageError
from callgrove.formats.output import NewFile
from callgrove.formats.problems import InputError
from callgrove.rows import RowSettings, build_rows

SKIPPED_FAILED = "failed (ok false): no credit"
SKIPPED_NO_CALLS = "no calls: no rows"
SKIPPED_REFUSED = "in a group that was not scored"
SKIPPED_STALE = "dropped by the training loop as stale (never trained there)"


@dataclass
class SampleTally:
    """What the samples written add up to, and what was left out and why."""

    read: int = 0  # episodes read once
    sampled: int = 0  # episodes that gave samples
    samples: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    supervised: int = 0  # episodes whose samples carry no advantages (cross-entropy)
    unknown_sampling_tokens: int = 0  # trained tokens whose call recorded no sampling
    untrained_rows: int = 0  # rows that train no token (duplicates, context only): not written
    skipped: Counter[str] = field(default_factory=Counter)

    def add(self, samples: list[Sample]) -> list[Sample]:
        """Count `samples` and return those that train a token."""
        trains = [sample for sample in samples if sample.num_loss_tokens]
        self.untrained_rows += len(samples) - len(trains)
        self.samples += len(trains)
        for sample in trains:
            self.num_tokens += sample.num_tokens
            self.num_loss_tokens += sample.num_loss_tokens
            trained = sample.loss_mask == 1
            self.unknown_sampling_tokens += int(np.isnan(sample.temperatures[trained]).sum())
        return trains


SamplesOutOption = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        metavar="OUT",
        help=f"The samples file; its form follows the suffix ({', '.join(SAMPLE_FORMS)}).",
        show_default=False,
    ),
]
SummaryJsonOption = Annotated[
    bool, typer.Option("--json", help="The summary as one JSON object on stdout.")
]


@app.command("samples")
def samples_command(
    files: FilesArg,
    out_file: SamplesOutOption,
    algorithm_name: AlgorithmOption = None,
    scope: ScopeOption = None,
    scale_by_std: ScaleOption = False,
    local_seats: LocalSeatOption = None,
    decay: DecayOption = None,
    max_identical: MaxIdentical = 1,
    as_json: SummaryJsonOption = False,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    """Score groups, build rows and samples, and write them for a trainer.

    Each sample is a row with every per-token array a trainer takes (token_ids, loss_mask,
    logprobs, advantages, position_ids, policy_versions, temperatures, top_p, top_k) and its
    episode, group, agent, seat and row; `callgrove.read_samples` reads the file back.
    """
    form = _out_form(out_file)
    algorithm = chosen_algorithm(algorithm_name, scope, scale_by_std, local_seats, decay)
    files = episode_inputs(files)
    require_output(out_file, files, "--out")
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    tally = SampleTally()
    located = _read(files, outcome)
    tally.read = outcome.intake.admitted
    located = _without_stale(located, tally)
    scoring = score_groups(located, algorithm, outcome.diagnostics) if algorithm else None
    settings = RowSettings(max_identical_trained=max_identical)
    samples = _samples(located, scoring, settings, tally, outcome)
    status = outcome.report()
    if samples or not outcome.diagnostics.errors:
        _write(out_file, samples, form)
    else:  # a failed rerun must not replace a good file with an empty one
        err.print(f"nothing usable: {safe(out_file)} was not written")
    if as_json:
        record = _summary_record(out_file, form, algorithm_name, scoring, tally, outcome)
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    else:
        err.print(_summary_table(out_file, form, algorithm_name, scoring, tally, outcome))
    raise typer.Exit(status)


def _out_form(out_file: Path) -> str:
    """The samples form `--out`'s suffix names; a usage error for one that names none."""
    try:
        return sample_form(out_file)
    except ValueError as error:
        raise UsageError(f"--out {error}") from None


def _without_stale(located: list[Located], tally: SampleTally) -> list[Located]:
    """`located` less the episodes the training loop dropped as stale (counted as skipped):
    whole groups it left untrained, which scoring them now would train."""
    kept = [item for item in located if not _dropped_as_stale(item.episode)]
    if len(kept) < len(located):
        tally.skipped[SKIPPED_STALE] += len(located) - len(kept)
    return kept


def _samples(
    located: list[Located],
    scoring: Scoring | None,
    settings: RowSettings,
    tally: SampleTally,
    outcome: CommandOutcome,
) -> list[Sample]:
    """The samples of every episode that gives some, counted in `tally`; an episode that
    gives none is counted as skipped, or failed in `outcome` when it is an error."""
    samples: list[Sample] = []
    for item in located:
        episode = item.episode
        if scoring is not None and id(item) in scoring.refused:
            tally.skipped[SKIPPED_REFUSED] += 1
            continue
        if not episode.ok:
            tally.skipped[SKIPPED_FAILED] += 1
            continue
        if not any(agent.calls for agent in episode.agents):
            tally.skipped[SKIPPED_NO_CALLS] += 1
            continue
        if never_scored(episode):
            outcome.failed(item.file, item.line, episode.id, unscored_message(episode))
            continue
        try:
            made = build_samples(build_rows(episode, settings))
        except ValueError as error:  # an episode that cannot become rows must not stop the rest
            message = error.problem.message if isinstance(error, InputError) else error
            outcome.failed(item.file, item.line, episode.id, message)
            continue
        tally.sampled += 1
        tally.supervised += episode.supervised
        samples.extend(tally.add(made))
    return samples


def _summary_record(
    path: Path,
    form: str,
    algorithm_name: AlgorithmName | None,
    scoring: Scoring | None,
    tally: SampleTally,
    outcome: CommandOutcome,
) -> dict[str, object]:
    """The summary as `--json` writes it on stdout."""
    return {
        "out": str(path),
        "form": form,
        "algorithm": None if algorithm_name is None else algorithm_name.value,
        "episodes_read": tally.read,
        "episodes_sampled": tally.sampled,
        "episodes_lost": len(outcome.intake.lost),
        "read_twice": outcome.intake.read_twice,
        "lost_calls": len(outcome.intake.lost_calls),
        "exactly_once": outcome.whole,
        "groups_scored": None if scoring is None else scoring.groups,
        "samples": tally.samples,
        "num_tokens": tally.num_tokens,
        "num_loss_tokens": tally.num_loss_tokens,
        "supervised_episodes": tally.supervised,
        "unknown_sampling_tokens": tally.unknown_sampling_tokens,
        "untrained_rows": tally.untrained_rows,
        "skipped": dict(tally.skipped),
        "errors": len(outcome.diagnostics.errors),
    }


def _dropped_as_stale(episode) -> bool:
    return (episode.meta or {}).get("dropped") == "stale"


def _read(files: list[Path], outcome: CommandOutcome) -> list[Located]:
    located: list[Located] = []
    with progress_bar("bytes") as progress:
        for path in files:
            pairs = read_input(path, outcome.diagnostics, chat=outcome.chat)
            pairs = reading(progress, path, pairs)
            located.extend(
                Located(episode, path, line)
                for line, episode in pairs
                if outcome.admit(episode, path, line)
            )
    return located


def _write(path: Path, samples: list[Sample], form: str) -> None:
    """The samples written beside `path` and moved into place once complete."""
    new = NewFile(path)
    try:
        write_samples(new.temp, samples, form=form)
    except BaseException:
        new.discard()
        raise
    new.commit()


def _summary_table(path, form, algorithm_name, scoring, tally: SampleTally, outcome) -> Table:
    table = Table(
        title=safe(f"samples -> {path} ({form})"), title_justify="left", show_header=False
    )
    table.add_column("what")
    table.add_column("count", justify="right")
    if scoring is None:
        table.add_row("advantages", "as the episodes carry them")
    else:
        table.add_row("algorithm", algorithm_name.value)
        table.add_row("groups scored", f"{scoring.groups:,}")
        if scoring.alone:
            table.add_row("episodes with no group (scored alone)", f"{scoring.alone:,}")
    for what, count in (
        ("episodes read", tally.read),
        ("episodes sampled", tally.sampled),
        ("samples", tally.samples),
        ("num_tokens", tally.num_tokens),
        ("num_loss_tokens", tally.num_loss_tokens),
    ):
        table.add_row(what, f"{count:,}")
    if tally.supervised:
        table.add_row("supervised episodes (no advantages: cross-entropy)", f"{tally.supervised:,}")
    if tally.unknown_sampling_tokens:
        table.add_row(
            "trained tokens with no recorded sampling (NaN temperature, top_p)",
            f"{tally.unknown_sampling_tokens:,}",
        )
    if tally.untrained_rows:
        table.add_row(
            "rows that train no token (duplicates, context only): not written",
            f"{tally.untrained_rows:,}",
        )
    for reason, count in tally.skipped.most_common():
        table.add_row(f"skipped: {reason}", f"{count:,}")
    if outcome.diagnostics.errors:
        table.add_row("not used: errors (on stderr)", f"{len(outcome.diagnostics.errors):,}")
    return table
