"""Loop overhead: episodes per second through dispatch, recording, rows and writing, with a
no-op environment and a no-op policy (so only callgrove's own work is timed).

Each episode is one leader call (a 16-token prompt, a 4-token answer). Steps run as in
`callgrove train` (under the same collector settings, `steady_heap`): the dispatcher launches
groups and hands each step its groups, the step gives credit and builds rows, degeneracy
measurements and samples, and the step's episodes are written one per line, atomically.
Only the optimizer step is missing.

The figure aimed at is episodes per wall-clock second; the command runs the whole measurement
`--runs` times and prints the best and the median, each run's CPU time (this process's) and
the load average. On a machine shared with other jobs the wall-clock figure falls with the
load while the CPU figure does not: episodes per CPU-second say what the loop itself costs.

    python benchmarks/loop_bench.py [--runs 5] [--steps 10] [--group-size 16] [--groups-per-step 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from callgrove.chat import CharFormat
from callgrove.credit import GRPO
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.dispatcher import Dispatcher, DispatchSettings
from callgrove.orchestrator.loop import steady_heap
from callgrove.orchestrator.sinks import write_episodes_atomically
from callgrove.orchestrator.step import prepare_step
from callgrove.policy import Completion, SamplingParams

TARGET = 2_000  # episodes per wall-clock second
CHAT = CharFormat()
ANSWER = np.array([5, 6, 7, CHAT.END], dtype=np.int32)
LOGPROBS = np.full(4, -0.5)


class NoopPolicy:
    version = 0

    async def sample(self, prompt_ids, params) -> Completion:
        return Completion(ANSWER, LOGPROBS, self.version, "stop")


class NoopEnv:
    name = "noop"

    def task(self, rng):
        return "12345"

    def eval_tasks(self):
        return []

    async def run(self, episode, task):
        await episode.leader.ask(task)
        return 1.0


@dataclass(frozen=True)
class Run:
    episodes: int  # written: trained, and stale ones dropped
    trained: int
    seconds: float
    cpu_seconds: float
    samples: int
    written_lines: int

    @property
    def per_second(self) -> float:
        return self.episodes / self.seconds

    @property
    def per_cpu_second(self) -> float:
        return self.episodes / self.cpu_seconds


async def run(steps: int, group_size: int, groups_per_step: int, out: Path) -> Run:
    policy = NoopPolicy()
    settings = DispatchSettings(
        group_size=group_size,
        groups_per_step=groups_per_step,
        max_in_flight=group_size * groups_per_step * 2,
        max_off_policy_steps=1,
    )
    params = SamplingParams(max_tokens=4, stop_token_ids=CHAT.stop_token_ids)
    dispatcher = Dispatcher(NoopEnv(), policy, CHAT, params, settings, run_id="bench")
    degeneracy = DegeneracySettings(stop_token_ids=CHAT.stop_token_ids)
    algorithm = GRPO()
    episodes = trained = samples = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    dispatcher.start()
    for step in range(1, steps + 1):
        collected = await dispatcher.collect(step)
        groups = [g.episodes for g in collected.trained]
        prepared = prepare_step(groups, algorithm, degeneracy)
        written = [e for g in [*collected.trained, *collected.stale] for e in g.episodes]
        write_episodes_atomically(out / f"step_{step}.jsonl", written)
        episodes += len(written)
        trained += sum(len(g) for g in groups)
        samples += len(prepared.samples)
        policy.version = step
        await dispatcher.notify()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await dispatcher.stop()
    lines = sum(
        len((out / f"step_{s}.jsonl").read_bytes().splitlines()) for s in range(1, steps + 1)
    )
    return Run(episodes, trained, elapsed, cpu, samples, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--groups-per-step", type=int, default=32)
    args = parser.parse_args()
    runs = []
    for number in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as folder, steady_heap():
            result = asyncio.run(
                run(args.steps, args.group_size, args.groups_per_step, Path(folder))
            )
        if result.written_lines != result.episodes or result.samples != result.trained:
            raise SystemExit(
                f"run {number}: {result.episodes} episodes ({result.trained} trained), "
                f"{result.written_lines} lines written, {result.samples} samples: every "
                "episode must be written, and every one trained must give its sample"
            )
        runs.append(result)
        print(
            f"run {number}: {result.episodes} no-op episodes in {result.seconds:.2f} s = "
            f"{result.per_second:,.0f} episodes/s; {result.cpu_seconds:.2f} s of CPU = "
            f"{result.per_cpu_second:,.0f} episodes per CPU-second; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
    wall = sorted(r.per_second for r in runs)
    cpu = sorted(r.per_cpu_second for r in runs)
    best, median = wall[-1], statistics.median(wall)
    print(
        f"loop overhead (dispatch, recording, credit, rows, degeneracy, samples, writing) over "
        f"{len(runs)} runs: best {best:,.0f}, median {median:,.0f} episodes per wall-clock "
        f"second; best {cpu[-1]:,.0f}, median {statistics.median(cpu):,.0f} episodes per "
        f"CPU-second; load average (1, 5, 15 min) "
        + ", ".join(f"{load:.1f}" for load in os.getloadavg())
        + f"; on {os.cpu_count()} cores"
    )
    verdicts = ", ".join(
        f"{name} {'met' if value >= TARGET else 'MISSED'}"
        for name, value in (("median", median), ("best", best))
    )
    print(f"target {TARGET:,} episodes per wall-clock second: {verdicts}")


if __name__ == "__main__":
    main()
