"""Sample building and packing throughput, in row tokens per second.

    python benchmarks/packing_bench.py [--episodes 32] [--seq-len 32768] [--ranks 8] [--repeat 10]

The workload is a group of fork-heavy episodes: a leader of 40 calls whose history grows to
about 8k tokens, forking 8 subagents at different depths, each running 4 calls of its own.
The episodes are credited by GRPO and their rows built (untimed). Timed, each the best of
`--repeat` runs: the rows stage materialising its tokens and loss masks (for reference; it is
not part of the target), `build_samples` over all the rows at once, and `pack` into
micro-batches across ranks. The target (50M row tokens/s) is for build samples + pack.

`measure(episodes, settings, repeats)` and `fork_heavy_episode(...)` are importable by other
benchmarks.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass

from callgrove.batch import PackSettings, build_samples, pack
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import Episode
from callgrove.rows import build_rows
from callgrove.synth import Shape, synth_episode

TARGET_TOKENS_PER_SECOND = 50e6


def fork_heavy_episode(
    episode_id: str,
    leader_calls: int = 40,
    forks: int = 8,
    fork_calls: int = 4,
    history: int = 8192,
    seed: int = 0,
) -> Episode:
    """A leader whose history reaches about `history` tokens over `leader_calls` calls, forking
    `forks` subagents at evenly spread depths (`callgrove.synth`, no compactions)."""
    shape = Shape(
        leader_calls=leader_calls,
        forks=forks,
        subagent_calls=fork_calls,
        fresh=0,
        background=0,
        twins=0,
        compactions=0,
        context=history,
        system=history // leader_calls,
    )
    episode = synth_episode(shape, seed, episode_id)
    episode.group = "bench"  # one group, credited together
    return episode


@dataclass(frozen=True)
class Figures:
    """Best-of-repeats seconds per stage (each stage's best run; `build_and_pack_seconds` is the
    best run of the two together)."""

    samples: int
    tokens: int
    rows_seconds: float
    build_seconds: float
    pack_seconds: float
    build_and_pack_seconds: float
    padding_fraction: float
    micro_batches: int

    def rate(self, seconds: float) -> float:
        """Row tokens per second."""
        return self.tokens / seconds if seconds else float("inf")


def measure(episodes: Sequence[Episode], settings: PackSettings, repeats: int = 5) -> Figures:
    """Best of `repeats` for each stage over fresh rows of `episodes` (credited by GRPO first):
    materialising the rows' tokens and masks (the rows stage, for reference), `build_samples`,
    then `pack`."""
    finalize_group(GRPO(), episodes)
    runs = []
    for _ in range(repeats):
        rows = [build_rows(episode) for episode in episodes]
        gc.collect()
        start = time.perf_counter()
        for episode_rows in rows:
            for row in episode_rows.rows:
                _ = episode_rows.token_ids(row), episode_rows.loss_mask(row)
        materialised = time.perf_counter()
        samples = build_samples(rows)
        built = time.perf_counter()
        packed = pack(samples, settings)
        done = time.perf_counter()
        runs.append((materialised - start, built - materialised, done - built))
    return Figures(
        samples=len(samples),
        tokens=sum(s.num_tokens for s in samples),
        rows_seconds=min(r[0] for r in runs),
        build_seconds=min(r[1] for r in runs),
        pack_seconds=min(r[2] for r in runs),
        build_and_pack_seconds=min(r[1] + r[2] for r in runs),
        padding_fraction=packed.padding_fraction,
        micro_batches=len(packed.micro_batches),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    episodes = [fork_heavy_episode(f"ep{i}", seed=i) for i in range(args.episodes)]
    figures = measure(episodes, PackSettings(args.seq_len, ranks=args.ranks), args.repeat)
    million = 1e6
    print(
        f"{args.episodes} fork-heavy episodes: {figures.samples} samples, "
        f"{figures.tokens / million:.2f}M row tokens, seq_len {args.seq_len}, {args.ranks} ranks, "
        f"best of {args.repeat}"
    )
    for label, seconds in (
        ("rows: tokens + masks (reference)", figures.rows_seconds),
        ("build samples", figures.build_seconds),
        ("pack", figures.pack_seconds),
    ):
        print(f"  {label:34s} {figures.rate(seconds) / million:8.1f}M tok/s")
    rate = figures.rate(figures.build_and_pack_seconds)
    verdict = "meets" if rate >= TARGET_TOKENS_PER_SECOND else "BELOW"
    print(
        f"  {'build samples + pack':34s} {rate / million:8.1f}M tok/s "
        f"({verdict} the {TARGET_TOKENS_PER_SECOND / million:.0f}M tok/s target)"
    )
    print(
        f"  {figures.micro_batches} micro-batches, padding fraction {figures.padding_fraction:.3f}"
    )


if __name__ == "__main__":
    main()
