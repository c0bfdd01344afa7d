"""What glibc's allocator settings cost a training step's preparation, step after step.

Each step takes a fresh batch of synthetic episodes (a new seed every step, made before the
clock starts), then does what `callgrove train` does with them before the optimizer: credit
(GRPO), rows, degeneracy, samples (`orchestrator.step.prepare_step`), then tree packing and
row packing of the samples. Every mode runs in its own child process:

- `default`: glibc's malloc as it is;
- `kept`: glibc told by the environment to keep freed memory (`MALLOC_MMAP_THRESHOLD_`,
  `MALLOC_TRIM_THRESHOLD_`), as docs/performance-bench.md suggests for `callgrove train`.

Printed per mode: the median step's CPU time, of it the kernel's share, minor page faults per
step, and the child's peak resident memory. The first step is left out of the median (it grows
the heap in every mode).

    python benchmarks/step_allocator.py [--episodes 200] [--preset 4k] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

NEVER = str(2**31 - 1)
MODES = {
    "default": {},
    "kept": {"MALLOC_MMAP_THRESHOLD_": NEVER, "MALLOC_TRIM_THRESHOLD_": NEVER},
}


def child(preset: str, episodes: int, steps: int) -> None:
    """One mode's run: prints one JSON line per step."""
    from callgrove.batch import PackSettings, pack
    from callgrove.batch.tree import pack_samples
    from callgrove.credit import GRPO
    from callgrove.orchestrator.degeneracy import DegeneracySettings
    from callgrove.orchestrator.step import prepare_step
    from callgrove.synth import PRESETS, synth_episodes

    for step in range(steps):
        batch = list(synth_episodes(PRESETS[preset], episodes, seed=step * episodes))
        groups: dict[str | None, list] = {}
        for episode in batch:
            groups.setdefault(episode.group, []).append(episode)
        usage, start = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
        prepared = prepare_step(list(groups.values()), GRPO(), DegeneracySettings())
        seq_len = max(s.num_tokens for s in prepared.samples)
        tree = pack_samples(prepared.samples)
        packed = pack(prepared.samples, PackSettings(seq_len, ranks=8))
        cpu = time.process_time() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        del prepared, tree, packed
        record = {
            "cpu_s": cpu,
            "kernel_s": after.ru_stime - usage.ru_stime,
            "faults": after.ru_minflt - usage.ru_minflt,
            "peak_rss_mb": after.ru_maxrss / 1024,
        }
        print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--preset", default="4k")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.preset, args.episodes, args.steps)
        return
    print(
        f"{args.steps} steps of {args.episodes} episodes at {args.preset}, load {os.getloadavg()[0]:.2f}"
    )
    for mode, env in MODES.items():
        run = subprocess.run(
            [sys.executable, __file__, "--child", *sys.argv[1:]],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        steps = [json.loads(line) for line in run.stdout.splitlines()][1:]
        cpu = statistics.median(s["cpu_s"] for s in steps)
        kernel = statistics.median(s["kernel_s"] for s in steps)
        faults = statistics.median(s["faults"] for s in steps)
        print(
            f"{mode:>8}: median step {cpu * 1e3:.0f} ms CPU, {100 * kernel / cpu:.0f}% in the "
            f"kernel, {faults:.0f} page faults; peak RSS {steps[-1]['peak_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
