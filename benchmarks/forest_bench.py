"""Forest + rows + check on a large synthetic episode, and how the time grows with its size.

    python benchmarks/forest_bench.py [--calls 2000] [--agents 50] [--prompt 16000] [--repeat 5]

The episode comes from `callgrove.synth`, held the way callgrove holds one: each call's prompt
references its history instead of copying it. Agents are a leader and subagents, half of them
forks from the leader at spread depths, and every agent compacts every 20 calls (the next call
is a new root). Parents are then discovered from the tokens alone.

Prints: the time of forest + rows + check at the base size and at 2x and 4x the calls and the
tokens, each as a ratio to proportional growth, and the row materialization time against a
plain numpy.concatenate of the same outputs.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from callgrove.episode import Episode
from callgrove.forest import build_forest
from callgrove.rows import build_rows, check_rows
from callgrove.synth import Shape, synth_episode


def synthetic_episode(calls: int, agents: int, mean_prompt: int, seed: int = 0) -> Episode:
    """`calls` calls over `agents` agents (a leader, half forks, half fresh subagents, each
    compacting every 20 calls) whose prompts average about `mean_prompt` tokens."""
    per_agent = max(1, calls // agents)
    shape = Shape(
        leader_calls=per_agent,
        subagent_calls=per_agent,
        forks=agents // 2,
        fresh=agents - 1 - agents // 2,
        background=0,
        twins=0,
        compactions=max(0, per_agent // 20 - 1),
        system=mean_prompt * 2 // 3,
        context=mean_prompt * 4 // 3,
    )
    return synth_episode(shape, seed)


def forest_rows_check(episode: Episode) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    result = build_rows(episode, forest=build_forest(episode))
    for row in result.rows:
        _ = result.token_ids(row), result.loss_mask(row)
    summary = check_rows(result)
    elapsed = time.perf_counter() - start
    assert summary.ok, summary.violations[:3]
    return elapsed, len(result.rows)


def best_of(repeat: int, episode: Episode) -> tuple[float, int]:
    runs = [forest_rows_check(episode) for _ in range(repeat)]
    return min(t for t, _ in runs), runs[0][1]


def materialization(episode: Episode, repeat: int) -> tuple[float, float, int]:
    result = build_rows(episode)
    outputs = []
    best_ours = best_plain = float("inf")
    for _ in range(repeat):
        for row in result.rows:
            row.__dict__.pop("_materialized", None)
        start = time.perf_counter()
        outputs = [(result.token_ids(row), result.loss_mask(row)) for row in result.rows]
        best_ours = min(best_ours, time.perf_counter() - start)
        start = time.perf_counter()
        np.concatenate([t for t, _ in outputs])
        np.concatenate([m for _, m in outputs])
        best_plain = min(best_plain, time.perf_counter() - start)
    return best_ours, best_plain, sum(len(t) for t, _ in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--prompt", type=int, default=16000, help="mean prompt length in tokens")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    base = synthetic_episode(args.calls, args.agents, args.prompt)
    prompt_tokens = sum(c.prompt_len for c in base.calls())
    distinct = sum(len(c.prompt_suffix) + len(c.completion_ids) for c in base.calls())
    print(
        f"episode: {args.calls} calls, {args.agents} agents, {prompt_tokens / 1e6:.1f}M prompt tokens "
        f"(mean {prompt_tokens / args.calls:,.0f}), {distinct / 1e6:.2f}M distinct tokens"
    )
    base_time, rows = best_of(args.repeat, base)
    print(
        f"forest + rows + check: {base_time * 1000:.0f} ms ({rows} rows; target < 1000 ms); "
        f"{prompt_tokens / base_time / 1e6:.0f}M prompt tokens/s"
    )

    print("scaling (time ratio / size ratio; 1.00 is proportional, target <= 1.30):")
    for label, calls, agents, prompt in (
        ("2x calls", 2 * args.calls, 2 * args.agents, args.prompt),
        ("4x calls", 4 * args.calls, 4 * args.agents, args.prompt),
        ("2x tokens", args.calls, args.agents, 2 * args.prompt),
        ("4x tokens", args.calls, args.agents, 4 * args.prompt),
    ):
        episode = synthetic_episode(calls, agents, prompt)
        size = sum(c.prompt_len for c in episode.calls()) / prompt_tokens
        elapsed, _ = best_of(args.repeat, episode)
        print(
            f"  {label:9s}: {elapsed * 1000:7.0f} ms, size x{size:.2f}, time x{elapsed / base_time:.2f}, "
            f"ratio {elapsed / base_time / size:.2f}"
        )
        del episode

    ours, plain, total = materialization(base, args.repeat)
    print(
        f"row materialization: {ours * 1000:.1f} ms for {total / 1e6:.1f}M row tokens + masks; "
        f"plain numpy.concatenate of the same outputs {plain * 1000:.1f} ms; ratio {ours / plain:.2f} (target <= 3)"
    )


if __name__ == "__main__":
    main()
