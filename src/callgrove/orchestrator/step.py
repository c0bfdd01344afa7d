"""The step: a step's groups of episodes become the samples one optimizer step trains on.

    groups -> finalize_group (the configured algorithm: credit on every call)
           -> rows (one per leaf, each kept call trained once)
           -> degeneracy (every detector measures, the drop policy decides)
           -> samples (advantages, sampling logprobs and distributions on the loss tokens)

A trained call that recorded no `sampling` (an environment's own policy client that could not
tell) is scored under the run's `[sampling]` settings, and the step counts such calls.

Episodes that failed take part in nothing (the algorithms give them no credit) but are still
written with their group. The learner then forwards the samples tree-packed or packed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from callgrove.batch import Sample, build_samples, fill_unknown_sampling
from callgrove.credit import Algorithm, finalize_group
from callgrove.episode import Episode
from callgrove.forest import compact_prompts
from callgrove.orchestrator import degeneracy
from callgrove.policy import SamplingParams
from callgrove.rows import EpisodeRows, RowSettings, build_rows


@dataclass
class PreparedStep:
    samples: list[Sample]
    episode_rows: list[EpisodeRows]
    """Rows of the completed episodes, drop policy applied."""
    degeneracy: degeneracy.DegeneracyReport
    unassigned_calls: int = 0
    advantages: dict[str, list[float]] = field(default_factory=dict)  # seat -> per trace
    unknown_sampling_calls: int = 0
    """Trained calls that recorded no `sampling`, scored under the run's settings."""
    seconds: dict[str, float] = field(default_factory=dict)
    """`credit`: the algorithm's credit on every group; `batching`: rows, degeneracy and
    samples."""


def prepare_step(
    groups: Sequence[Sequence[Episode]],
    algorithm: Algorithm,
    degeneracy_settings: degeneracy.DegeneracySettings,
    sampling: SamplingParams | None = None,
    rows: RowSettings | None = None,
) -> PreparedStep:
    """`sampling`: the run's own settings, for trained calls that recorded none (without it
    such calls stay unknown, and a learner that scores them refuses). `rows`: the row scheme
    and its choices (default: every kept call trained once)."""
    rows = rows or RowSettings()
    report = degeneracy.DegeneracyReport()
    all_rows: list[EpisodeRows] = []
    unassigned = 0
    advantages: dict[str, list[float]] = {}
    started = time.perf_counter()
    credit_seconds = 0.0
    for group in groups:
        credit_started = time.perf_counter()
        credit = finalize_group(algorithm, [rows.for_credit(episode) for episode in group])
        credit_seconds += time.perf_counter() - credit_started
        unassigned += sum(credit.unassigned_calls.values())
        for given in credit.credits:
            advantages.setdefault(given.trace.seat or "episode", []).append(given.advantage)
        for episode in group:
            calls = sum(len(agent.calls) for agent in episode.agents)
            if calls > 1:  # prompts held by reference: memory and files grow with new tokens
                compact_prompts(episode)
            if episode.ok and calls:
                all_rows.append(build_rows(episode, rows))
    kept = degeneracy.apply(all_rows, degeneracy_settings, report)
    samples = build_samples(kept) if kept else []
    unknown = sum(
        call.sampling is None for rows in kept for row in rows.rows for call in row.trains
    )
    if unknown and sampling is not None:
        fill_unknown_sampling(samples, sampling.temperature, sampling.top_p, sampling.top_k)
    seconds = {
        "credit": credit_seconds,
        "batching": time.perf_counter() - started - credit_seconds,
    }
    return PreparedStep(samples, kept, report, unassigned, advantages, unknown, seconds)
