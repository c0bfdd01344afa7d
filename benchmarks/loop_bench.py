"""Loop overhead: episodes per second through dispatch, recording, rows and writing, with a
no-op environment and a no-op policy (so only callgrove's own work is timed).

Each episode is one leader call (a 16-token prompt, a 4-token answer). Steps run as in
`callgrove train`: the dispatcher launches groups and hands them to the step, whose credit,
rows, degeneracy and samples are built, and the step's episodes are written one per line.

Prints episodes per wall-clock second, and per second of this process's CPU time: on a
machine shared with other jobs the first falls with the load, the second measures the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from callgrove.credit import GRPO
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.dispatcher import Dispatcher, DispatchSettings
from callgrove.orchestrator.sinks import write_episodes_atomically
from callgrove.orchestrator.step import prepare_step
from callgrove.policy import Sample, SamplingParams
from callgrove.policy.render import CharRenderer

RENDERER = CharRenderer()
ANSWER = np.array([5, 6, 7, RENDERER.END], dtype=np.int32)
LOGPROBS = np.full(4, -0.5)


class NoopPolicy:
    version = 0

    async def sample(self, prompt_ids, params) -> Sample:
        return Sample(ANSWER, LOGPROBS, self.version, "stop")


class NoopEnv:
    name = "noop"

    def task(self, rng):
        return "12345"

    def eval_tasks(self):
        return []

    async def run(self, episode, task):
        await episode.leader.ask(task)
        return 1.0


async def run(
    steps: int, group_size: int, groups_per_step: int, out: Path
) -> tuple[int, float, float]:
    policy = NoopPolicy()
    settings = DispatchSettings(
        group_size=group_size,
        groups_per_step=groups_per_step,
        max_in_flight=group_size * groups_per_step * 2,
        max_off_policy_steps=1,
    )
    params = SamplingParams(max_tokens=4, stop_token_ids=RENDERER.stop_token_ids)
    dispatcher = Dispatcher(NoopEnv(), policy, RENDERER, params, settings, run_id="bench")
    degeneracy = DegeneracySettings(stop_token_ids=RENDERER.stop_token_ids)
    algorithm = GRPO()
    dispatcher.start()
    episodes = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        collected = await dispatcher.collect(step)
        groups = [g.episodes for g in collected.trained]
        prepare_step(groups, algorithm, degeneracy)
        flat = [e for g in groups for e in g]
        write_episodes_atomically(out / f"step_{step}.jsonl", flat)
        episodes += len(flat)
        policy.version = step
        await dispatcher.notify()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await dispatcher.stop()
    return episodes, elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--groups-per-step", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        episodes, elapsed, cpu = asyncio.run(
            run(args.steps, args.group_size, args.groups_per_step, Path(folder))
        )
    load = os.getloadavg()[0]
    print(
        f"loop overhead: {episodes} no-op episodes in {elapsed:.2f} s = "
        f"{episodes / elapsed:,.0f} episodes/s (dispatch, recording, credit, rows, samples, "
        f"writing); {cpu:.2f} s of CPU = {episodes / cpu:,.0f} episodes per CPU-second; "
        f"load average {load:.1f}"
    )


if __name__ == "__main__":
    main()
