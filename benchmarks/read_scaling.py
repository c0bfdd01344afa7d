"""Does reading an episode file cost in proportion to its size, and if not, where does it grow?

Each form (JSON Lines, Parquet, Arrow IPC) is read with `load()` at a quarter, a half and all
of N synthetic episodes (the sizes `callgrove bench` uses), every file once a round, rounds
interleaved, by CPU time. For each size it prints what the time is made of:

- the scaling factor: time growth over call-token growth from the smallest to the largest
  size, best CPU time of the rounds (1.00 is linear; the target is at most 1.10);
- the cost along one read: CPU time per call token in each quarter of the read, each episode
  timed as it comes out of `load()` and taken at its best over the rounds, and the same summed
  over the whole read (a scaling factor that load in any one round moves less). Work that grows
  with what has been read already (a table looked up per call, a list copied, memory that gets
  dearer) makes the later quarters of the largest read dearer than the smallest read. The
  binary forms decode a batch at a time, which lands on the batch's first episode: their
  quarters are lumpy, their sums are not;
- the garbage collector's time inside the read (every collection, `gc.callbacks`) and the
  page faults it took (memory the process had to get afresh), best and worst of the rounds.

`--hold` keeps every size's episodes, forests and rows alive while reading, as the bench does,
so that a collector walking all live objects would show. Like `callgrove bench`, it first has
malloc keep freed memory (`--no-keep-freed-memory` leaves glibc's defaults, under which the
largest size can take page faults the smaller ones do not). CPU time counts the reader's threads
(pyarrow decodes Parquet pages on several).

    .venv/bin/python benchmarks/read_scaling.py                    # 200 episodes at 4k
    .venv/bin/python benchmarks/read_scaling.py --context 16k --episodes 50 --hold
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from callgrove.bench import BenchSettings
from callgrove.bench.suite import FORMS, TARGETS, keep_freed_memory
from callgrove.episode import Episode, load, save
from callgrove.forest import build_forest
from callgrove.rows import build_rows
from callgrove.synth import PRESETS, call_tokens, synth_episodes


@dataclass
class Reads:
    """Every round's read of one file: CPU time, each episode's CPU time, collector time and
    page faults."""

    tokens: np.ndarray  # each episode's call tokens
    seconds: list[float] = field(default_factory=list)
    per_episode: list[np.ndarray] = field(default_factory=list)
    gc_seconds: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)

    def episode_best(self) -> np.ndarray:
        """Each episode's CPU time at its best over the rounds."""
        return np.min(np.stack(self.per_episode), axis=0)


class CollectorClock:
    """CPU time spent inside the garbage collector since the last `reset`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started

    def reset(self) -> None:
        self.seconds = 0.0


def read_once(path: Path, reads: Reads, collector: CollectorClock) -> None:
    """One timed `list(load(path))`, stamping the CPU clock as each episode comes out."""
    gc.collect()
    collector.reset()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    stamps = [time.process_time()]
    episodes = []
    for episode in load(path):
        episodes.append(episode)
        stamps.append(time.process_time())
    reads.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    reads.gc_seconds.append(collector.seconds)
    reads.seconds.append(stamps[-1] - stamps[0])
    reads.per_episode.append(np.diff(stamps))


def held_data(episodes: list[Episode]) -> tuple:
    """What the bench keeps alive besides the files: the episodes, forests and rows."""
    forests = [build_forest(e) for e in episodes]
    return (
        episodes,
        forests,
        [build_rows(e, forest=f) for e, f in zip(episodes, forests, strict=True)],
    )


def quarters(reads: Reads) -> list[float]:
    """CPU nanoseconds per call token in each quarter of a read (episodes at their best)."""
    parts = zip(
        np.array_split(reads.episode_best(), 4), np.array_split(reads.tokens, 4), strict=True
    )
    return [1e9 * float(seconds.sum()) / int(tokens.sum()) for seconds, tokens in parts]


def report(form: str, by_size: dict[int, Reads]) -> bool:
    sizes = list(by_size)
    small, large = by_size[sizes[0]], by_size[sizes[-1]]
    print(f"\n{form}")
    print("  episodes  best CPU ms  ns per call token, quarters of the read  gc ms  page faults")
    for size, reads in by_size.items():
        along = " ".join(f"{q:7.1f}" for q in quarters(reads))
        gc_ms = f"{1e3 * min(reads.gc_seconds):.1f}-{1e3 * max(reads.gc_seconds):.1f}"
        faults = f"{min(reads.faults)}-{max(reads.faults)}"
        print(f"  {size:8d}  {1e3 * min(reads.seconds):11.1f}  {along}   {gc_ms:>9}  {faults}")
    work = int(large.tokens.sum()) / int(small.tokens.sum())
    factor = (min(large.seconds) / min(small.seconds)) / work
    per_token = [float(r.episode_best().sum()) / int(r.tokens.sum()) for r in (small, large)]
    met = factor <= TARGETS["scaling"]
    print(
        f"  scaling x{factor:.3f} by best CPU time ({'met' if met else 'MISSED'}, at most "
        f"x{TARGETS['scaling']:.1f}); by the summed per-episode bests x{per_token[1] / per_token[0]:.3f}"
    )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", choices=list(PRESETS), default="4k")
    parser.add_argument("--episodes", type=int, default=200, help="the largest size")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--forms", default=",".join(FORMS), help="of: " + ", ".join(FORMS))
    parser.add_argument("--hold", action="store_true", help="keep every size's data alive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep-freed-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="have malloc keep freed memory (glibc), as the bench does; --no-keep-freed-memory "
        "leaves its defaults",
    )
    args = parser.parse_args()
    kept = args.keep_freed_memory and keep_freed_memory()
    forms = [name.strip() for name in args.forms.split(",")]
    sizes = BenchSettings(episodes={args.context: args.episodes}).sizes(args.context)
    work = Path(tempfile.mkdtemp(prefix="read-scaling-"))
    reads: dict[tuple[str, int], Reads] = {}
    held = []
    for size in sizes:
        episodes = list(synth_episodes(PRESETS[args.context], size, args.seed))
        for form in forms:
            path = work / f"{size}{FORMS[form]}"
            save(path, episodes)
            reads[form, size] = Reads(np.array([call_tokens(e) for e in episodes]))
        if args.hold:
            held.append(held_data(episodes))
        del episodes
    paths = {(form, size): work / f"{size}{FORMS[form]}" for form, size in reads}
    collector = CollectorClock()
    print(
        f"{args.context}: {', '.join(map(str, sizes))} episodes, {args.rounds} rounds, "
        f"{'every size held' if args.hold else 'nothing else held'}, malloc: "
        f"{'freed memory kept' if kept else 'default'}"
    )
    for _ in range(args.rounds):
        for key, path in paths.items():
            read_once(path, reads[key], collector)
    met = [report(form, {size: reads[form, size] for size in sizes}) for form in forms]
    for path in paths.values():
        path.unlink()
    work.rmdir()
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
