"""`callgrove stats`: what a set of episode files holds, read in one streaming pass.

First what an RL engineer reads: the ok rate, rewards (overall, per seat, per group),
advantages, the rows they make (tokens, loss tokens, duplicates); then agents by name,
errors by type and how far off-policy the episodes are. Memory does not grow with the
files: each episode is tallied and dropped. Tables with nothing to show are left out, and
episodes never scored (imported transcripts) count as "no reward", never as 0.
"""

from __future__ import annotations

import gc
import math
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated

import numpy as np
import orjson
import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from callgrove.cli.accounting import (
    SHOWN_PROBLEMS,
    AcceptLossOption,
    CommandOutcome,
    ReadTokenizerOption,
    reading_chat,
)
from callgrove.cli.app import (
    FilesArg,
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
from callgrove.cli.rows import episode_reward
from callgrove.cli.shards import (
    Executor,
    ExecutorOption,
    JobsOption,
    Shard,
    ShardResult,
    in_shards,
    merged,
    plan_shards,
    renumber,
    renumbered_reads,
    run_shards,
)
from callgrove.episode import Episode, Stats
from callgrove.formats.problems import Diagnostics
from callgrove.rows import build_rows

COLLECT_EVERY = 64
# Up to this many groups each get a line in the rewards table; past it, a summary line.
GROUPS_LISTED = 8
BAR_WIDTH = 30
NO_REWARD = "no reward"


@dataclass
class Moments:
    """Count, mean, standard deviation (population), min and max of a stream of numbers."""

    count: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.total_sq += value * value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def merge(self, part: Moments) -> Moments:
        """`part`'s numbers added in (the moments of one shard of the stream)."""
        self.count += part.count
        self.total += part.total
        self.total_sq += part.total_sq
        self.low, self.high = min(self.low, part.low), max(self.high, part.high)
        return self

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        if not self.count:
            return math.nan
        return math.sqrt(max(self.total_sq / self.count - self.mean**2, 0.0))

    def record(self) -> dict[str, float | int | None]:
        if not self.count:
            return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
        return {
            "count": self.count,
            "mean": self.mean,
            "std": self.std,
            "min": self.low,
            "max": self.high,
        }


@dataclass
class Learning:
    """What training would see: rewards, advantages and the rows the episodes make."""

    reward: Moments = field(default_factory=Moments)
    unscored: int = 0
    seat_rewards: dict[str, Moments] = field(default_factory=dict)
    group_rewards: dict[str, Moments] = field(default_factory=dict)
    advantages: dict[str, Moments] = field(default_factory=dict)
    rows: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    duplicates: int = 0
    unbuildable: int = 0

    def add(self, episode: Episode) -> None:
        if episode.scored:
            self.reward.add(episode_reward(episode))
            if episode.group is not None:
                self.group_rewards.setdefault(episode.group, Moments()).add(episode_reward(episode))
            for agent in episode.agents:
                self.seat_rewards.setdefault(agent.name, Moments()).add(episode.reward_of(agent))
        else:
            self.unscored += 1
        for call in episode.calls():
            if call.advantages is not None:
                value = float(np.mean(call.advantages))
                self.advantages.setdefault("all", Moments()).add(value)
                self.advantages.setdefault(episode.agent_of(call).name, Moments()).add(value)
        if not episode.agents:
            return
        try:
            result = build_rows(episode)
        except Exception:  # counted and shown: `callgrove rows` names the reason
            self.unbuildable += 1
            return
        rows = result.rows
        self.rows += len(rows)
        self.num_tokens += sum(row.num_tokens for row in rows)
        self.num_loss_tokens += sum(result.num_loss_tokens(row) for row in rows)
        self.duplicates += sum(row.duplicate_of is not None for row in rows)


def collect(
    files: Iterable[Path],
    outcome: CommandOutcome,
    training_step: int | None = None,
    skip_bad: bool = False,
    invocations: Path | None = None,
) -> tuple[Stats, Learning]:
    """Stream every episode `outcome` admits into one `Stats` and `Learning`. Problems go to
    `outcome`; without `skip_bad` the first error stops the reading (the error is the last
    problem recorded)."""
    stats, learning = Stats(), Learning()
    diagnostics = outcome.diagnostics
    with progress_bar("bytes") as progress:
        for path in files:
            located = read_input(path, diagnostics, invocations, outcome.chat)
            located = reading(progress, path, located)
            episodes = (e for line, e in located if outcome.admit(e, path, line))
            if not tally(episodes, diagnostics, stats, learning, training_step, skip_bad):
                return stats, learning
    return stats, learning


def tally(
    episodes: Iterable[Episode],
    diagnostics: Diagnostics,
    stats: Stats,
    learning: Learning,
    training_step: int | None,
    skip_bad: bool,
) -> bool:
    """Add a stream of episodes to `stats` and `learning`; False when an error stopped it
    (without `skip_bad`, the first error does)."""
    seen_errors = len(diagnostics.errors)
    for episode in episodes:
        if not skip_bad and len(diagnostics.errors) > seen_errors:
            return False
        stats.add(episode, training_step)
        learning.add(episode)
        if stats.episodes % COLLECT_EVERY == 0:
            # An episode is a reference cycle (agent <-> call), freed only by the cycle
            # collector; run it as we go so memory stays flat.
            gc.collect()
    return skip_bad or len(diagnostics.errors) == seen_errors


def stats_of_shard(
    shard: Shard, _parts: Path, training_step: int | None, skip_bad: bool
) -> ShardResult:
    """One shard's `Stats` and `Learning` (the work of a process or a Ray task)."""
    diagnostics = Diagnostics()
    stats, learning = Stats(), Learning()
    episodes = (episode for _line, episode in shard.episodes(diagnostics))
    tally(episodes, diagnostics, stats, learning, training_step, skip_bad)
    return ShardResult(shard, shard.line_count(), diagnostics.problems, (stats, learning))


def collect_sharded(
    files: Sequence[Path],
    outcome: CommandOutcome,
    training_step: int | None,
    skip_bad: bool,
    jobs: int,
    executor: Executor,
) -> tuple[Stats, Learning]:
    """`collect`, shard by shard on `executor`; the same tallies, problems in file order
    (without `skip_bad`, up to the first error)."""
    work = partial(stats_of_shard, training_step=training_step, skip_bad=skip_bad)
    with tempfile.TemporaryDirectory(prefix="callgrove-stats-") as parts:
        results = run_shards(plan_shards(files, jobs), work, Path(parts), jobs, executor)
    stats, learning = Stats(), Learning()
    for result in results:
        merged(stats, result.value[0])
        merged(learning, result.value[1])
    outcome.intake.admit_all(renumbered_reads(results))
    for problem in renumber(results):
        outcome.diagnostics.add(problem)
        if problem.severity == "error" and not skip_bad:
            break
    return stats, learning


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _table(title: str, *columns: str, header: bool = True) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        show_header=header,
        box=box.SIMPLE_HEAD,
        show_edge=False,  # the room an 80-column terminal needs for every column
        pad_edge=False,
    )
    for number, name in enumerate(columns):
        table.add_column(name, justify="left" if number == 0 else "right")
    return table


def summary_table(stats: Stats, learning: Learning) -> Table:
    table = _table("episodes", "what", "count", header=False)
    rows = [
        ("episodes", f"{stats.episodes:,}"),
        ("ok", f"{stats.ok:,} ({_percent(stats.ok, stats.episodes)})"),
        ("with errors", f"{stats.with_errors:,}"),
        ("without agents", f"{stats.without_agents:,}"),
        ("groups", f"{len(learning.group_rewards):,}"),
        ("calls (kept)", f"{stats.calls:,} ({stats.kept_calls:,})"),
        ("prompt tokens", f"{stats.prompt_tokens:,}"),
        ("completion tokens", f"{stats.completion_tokens:,}"),
        ("distinct tokens stored", f"{stats.stored_tokens:,}"),
    ]
    if stats.routed_tokens:
        rows.append(("routes, bytes per token", f"{stats.route_bytes_per_token:.1f}"))
    rows += [(f"run {kind}", f"{count:,}") for kind, count in sorted(stats.run_types.items())]
    for what, count in rows:
        table.add_row(cell(what), count)
    return table


def _moments_row(table: Table, label: str, moments: Moments) -> None:
    table.add_row(
        cell(label),
        f"{moments.count:,}",
        _number(moments.mean),
        _number(moments.std),
        _number(moments.low),
        _number(moments.high),
    )


def rewards_table(learning: Learning) -> RenderableType:
    """Overall, per seat and per group; a group whose episodes all got one reward gives
    group-relative algorithms nothing to learn from, so those are counted."""
    if not learning.reward.count:
        return Text(f"rewards: {NO_REWARD} ({learning.unscored:,} episodes never scored)")
    table = _table("rewards", "", "episodes", "mean", "std", "min", "max")
    _moments_row(table, "all", learning.reward)
    for name, moments in sorted(learning.seat_rewards.items()):
        _moments_row(table, f"seat {name}", moments)
    groups = learning.group_rewards
    if len(groups) <= GROUPS_LISTED:
        for name, moments in sorted(groups.items()):
            _moments_row(table, f"group {name}", moments)
    flat = sum(1 for m in groups.values() if m.count > 1 and m.high == m.low)
    notes = []
    if groups:
        notes.append(f"{flat:,} of {len(groups):,} groups have one reward for every episode")
    if learning.unscored:
        notes.append(f"{learning.unscored:,} episodes never scored ({NO_REWARD})")
    table.caption = "\n".join(notes) or None  # a line each: short enough for 80 columns
    table.caption_justify = "left"
    return table


def advantages_table(learning: Learning) -> Table | None:
    if not learning.advantages:
        return None
    table = _table("advantages (per call)", "", "calls", "mean", "std", "min", "max")
    _moments_row(table, "all", learning.advantages["all"])
    for name, moments in sorted(learning.advantages.items()):
        if name != "all":
            _moments_row(table, f"seat {name}", moments)
    return table


def row_totals_table(learning: Learning) -> Table | None:
    if not learning.rows and not learning.unbuildable:
        return None
    table = _table("rows", "what", "count", header=False)
    for what, count in (
        ("rows", f"{learning.rows:,}"),
        ("num_tokens", f"{learning.num_tokens:,}"),
        ("num_loss_tokens", f"{learning.num_loss_tokens:,}"),
        ("loss share", _percent(learning.num_loss_tokens, learning.num_tokens)),
        ("duplicate rows (no loss)", f"{learning.duplicates:,}"),
    ):
        table.add_row(what, count)
    if learning.unbuildable:
        table.add_row(cell("episodes that make no rows", "red"), f"{learning.unbuildable:,}")
    return table


def agents_table(stats: Stats) -> Table | None:
    if not stats.agents:
        return None
    table = _table(
        "agents by name", "name", "agents", "trainable", "calls", "kept", "prompt tokens",
        "completion tokens", "errors",
    )  # fmt: skip
    for name, tally in sorted(stats.agents.items()):
        table.add_row(
            cell(name),
            *(
                f"{value:,}"
                for value in (
                    tally.agents,
                    tally.trainable,
                    tally.calls,
                    tally.kept_calls,
                    tally.prompt_tokens,
                    tally.completion_tokens,
                    tally.errors,
                )
            ),
        )
    return table


def errors_table(stats: Stats) -> Table | None:
    if not stats.errors:
        return None
    table = _table("errors by type", "type", "episodes")
    for kind, count in stats.errors.most_common():
        table.add_row(cell(kind), f"{count:,}")
    return table


# The staleness quantities, each read as its own histogram (see `off_policy_steps`).
SPREAD_QUANTITIES = (
    ("by_total", "off-policy steps (total)"),
    ("in_flight", "of which in flight (weights changed while it ran)"),
    ("in_queue", "of which in queue (waited after it finished)"),
)


def spread_view(stats: Stats) -> RenderableType | None:
    """One histogram per quantity: steps, a bar, the count of episodes."""
    spread = stats.spread
    if not spread.by_total and not spread.frozen and not spread.unknown_step:
        return None
    parts: list[RenderableType] = []
    for attribute, title in SPREAD_QUANTITIES:
        counts = getattr(spread, attribute)
        if not counts:
            continue
        table = _table(title, "steps", "", "episodes")
        table.columns[1].justify = "left"
        largest = max(counts.values())
        for step in range(min(counts), max(counts) + 1):
            count = counts[step]
            bar = "█" * (round(BAR_WIDTH * count / largest) if count else 0)
            table.add_row(f"{step:,}", Text(bar, style="cyan"), f"{count:,}")
        parts += [table, Text("")]
    notes = [f"frozen policy (never stale): {spread.frozen:,}"]
    if spread.unknown_step:
        notes.append(f"no training step known: {spread.unknown_step:,}")
    parts.append(Text(" · ".join(notes), style="dim"))
    return Group(*parts)


def stats_record(stats: Stats, learning: Learning) -> dict[str, object]:
    """Everything the tables show, as one JSON object (for CI and scripts)."""
    spread = stats.spread
    return {
        "episodes": stats.episodes,
        "ok": stats.ok,
        "ok_rate": stats.ok / stats.episodes if stats.episodes else None,
        "with_errors": stats.with_errors,
        "without_agents": stats.without_agents,
        "calls": stats.calls,
        "kept_calls": stats.kept_calls,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "distinct_tokens_stored": stats.stored_tokens,
        "route_bytes": stats.route_bytes,
        "route_bytes_per_token": stats.route_bytes_per_token if stats.routed_tokens else None,
        "run_types": dict(stats.run_types),
        "rewards": {
            "all": learning.reward.record(),
            "unscored_episodes": learning.unscored,
            "seats": {name: m.record() for name, m in sorted(learning.seat_rewards.items())},
            "groups": {name: m.record() for name, m in sorted(learning.group_rewards.items())},
        },
        "advantages": {name: m.record() for name, m in sorted(learning.advantages.items())},
        "rows": {
            "rows": learning.rows,
            "num_tokens": learning.num_tokens,
            "num_loss_tokens": learning.num_loss_tokens,
            "duplicates": learning.duplicates,
            "episodes_without_rows": learning.unbuildable,
        },
        "agents": {
            name: {
                "agents": t.agents,
                "trainable": t.trainable,
                "calls": t.calls,
                "kept_calls": t.kept_calls,
                "prompt_tokens": t.prompt_tokens,
                "completion_tokens": t.completion_tokens,
                "errors": t.errors,
            }
            for name, t in sorted(stats.agents.items())
        },
        "errors": dict(stats.errors.most_common()),
        "off_policy_steps": {
            attribute: {str(k): v for k, v in sorted(getattr(spread, attribute).items())}
            for attribute, _ in SPREAD_QUANTITIES
        }
        | {"frozen": spread.frozen, "unknown_step": spread.unknown_step},
    }


def _report(diagnostics: Diagnostics) -> None:
    for problem in diagnostics.problems[:SHOWN_PROBLEMS]:
        style = "yellow" if problem.severity == "warning" else "red"
        err.print(f"[{style}]{problem.severity}[/]: {safe(problem)}")
    hidden = len(diagnostics.problems) - SHOWN_PROBLEMS
    if hidden > 0:
        counts = ", ".join(f"{n:,} {kind}" for kind, n in diagnostics.counts().most_common())
        err.print(f"… and {hidden:,} more problems ({safe(counts)} in all)")


@app.command("stats")
def stats_command(
    files: FilesArg,
    step: Annotated[
        int | None,
        typer.Option(
            "--step", help="Training step to measure staleness at (default: each run.step)."
        ),
    ] = None,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad", help="Skip and count unreadable lines instead of stopping at the first."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object on stdout instead of the tables.")
    ] = False,
    invocations: InvocationsOption = None,
    jobs: JobsOption = 1,
    executor: ExecutorOption = Executor.process,
    accept_loss: AcceptLossOption = False,
    tokenizer: ReadTokenizerOption = None,
) -> None:
    """Ok rate, rewards, advantages, rows, agents by name, errors by type, off-policy spread.

    Exit 0 when every episode was read once and whole, 1 when any line or episode could not
    be used (a line cut off mid-write included, final or not; with --skip-bad: after the
    tables), an episode was read twice (not counted again) or a sampled call is missing from
    an episode (its gaps), 2 on usage errors.
    """
    files = episode_inputs(files, invocations)
    outcome = CommandOutcome(accept_loss=accept_loss, chat=reading_chat(tokenizer))
    diagnostics = outcome.diagnostics
    if in_shards(jobs, executor, invocations):
        stats, learning = collect_sharded(files, outcome, step, skip_bad, jobs, executor)
    else:
        stats, learning = collect(files, outcome, step, skip_bad, invocations)
    if skip_bad or not diagnostics.errors:
        if as_json:
            sys.stdout.buffer.write(orjson.dumps(stats_record(stats, learning)) + b"\n")
        else:
            views = (
                summary_table(stats, learning),
                rewards_table(learning),
                advantages_table(learning),
                row_totals_table(learning),
                agents_table(stats),
                errors_table(stats),
                spread_view(stats),
            )
            shown = [view for view in views if view is not None]
            for number, view in enumerate(shown):
                out.print(view)
                if number < len(shown) - 1:
                    out.print()
    if diagnostics.errors and not skip_bad:
        # Lines read past the first error (before the stop took effect) are not reported: the
        # run stopped there, and the message says where.
        first = diagnostics.problems.index(diagnostics.errors[0])
        _report(Diagnostics(diagnostics.problems[: first + 1]))
        err.print(
            f"stopped at the first unusable line ({safe(diagnostics.errors[0].where)}); "
            "--skip-bad skips such lines and goes on"
        )
    else:
        _report(diagnostics)
    if diagnostics.errors and skip_bad:
        err.print(f"skipped {len(diagnostics.errors):,} unusable line(s) or episode(s)")
    for line in outcome.account():
        err.print(safe(line))
    raise typer.Exit(outcome.status())
