"""Forest + rows + check on a large synthetic episode, and how the time grows with its size.

    python benchmarks/forest_bench.py [--calls 2000] [--agents 50] [--prompt 16000] [--repeat 5]

The episode is built in memory the way callgrove holds one: each call's prompt references its
history instead of copying it. Agents are a leader and subagents, half of them forks from the
leader at random depths, and every agent compacts regularly (the next call is a new root).
Parents are then discovered from the tokens alone.

Prints: the time of forest + rows + check at the base size and at 2x and 4x the calls and the
tokens, each as a ratio to proportional growth, and the row materialization time against a
plain numpy.concatenate of the same outputs.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.forest import build_forest
from callgrove.rows import build_rows, check_rows


def synthetic_episode(calls: int, agents: int, mean_prompt: int, seed: int = 0) -> Episode:
    """`calls` calls over `agents` agents whose prompts average about `mean_prompt` tokens."""
    rng = np.random.default_rng(seed)
    per_agent = calls // agents
    turns_per_tree = 20
    start_len = mean_prompt * 2 // 3
    turn_len = max(2, (mean_prompt - start_len) * 2 // turns_per_tree)
    completion_len = max(1, turn_len // 4)
    fresh = iter(range(1, 1 << 30))

    def tokens(n: int) -> np.ndarray:
        first = next(fresh)
        for _ in range(n - 1):
            next(fresh)
        return np.arange(first, first + n, dtype=np.int32) % 150_000

    seq = iter(range(1, 1 << 30))
    team = [Agent("L", "leader")]
    leader_calls: list[Call] = []
    for number in range(1, agents):
        fork = number % 2 == 1
        team.append(
            Agent(
                f"S{number}",
                "fork" if fork else "explore",
                parent="L",
                start="fork" if fork else "fresh",
            )
        )
    # Interleave: round-robin over agents so calls of different agents alternate in the ledger.
    last: dict[str, Call | None] = {a.id: None for a in team}
    made = {a.id: 0 for a in team}
    for _round in range(per_agent):
        for agent in team:
            previous = last[agent.id]
            s = next(seq)
            if previous is None:
                if agent.start == "fork" and leader_calls:
                    base = leader_calls[int(rng.integers(len(leader_calls)))]
                    call = Call(
                        f"c{s}",
                        s,
                        tokens(completion_len),
                        tokens(turn_len - completion_len),
                        base,
                        base.full_len,
                    )
                else:
                    call = Call(f"c{s}", s, tokens(completion_len), tokens(start_len))
            else:
                purpose = (
                    "compaction"
                    if made[agent.id] % turns_per_tree == turns_per_tree - 1
                    else "turn"
                )
                call = Call(
                    f"c{s}",
                    s,
                    tokens(completion_len),
                    tokens(turn_len - completion_len),
                    previous,
                    previous.full_len,
                    purpose=purpose,
                )
            call.logprobs = np.full(len(call.completion_ids), -0.5)
            agent.add(call)
            made[agent.id] += 1
            last[agent.id] = None if call.purpose == "compaction" else call
            if agent.id == "L":
                leader_calls.append(call)
    return Episode("synthetic", agents=team, rewards={"r": 1.0})


def forest_rows_check(episode: Episode) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    result = build_rows(episode, forest=build_forest(episode))
    for row in result.rows:
        _ = row.token_ids, row.loss_mask
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
        outputs = [(row.token_ids, row.loss_mask) for row in result.rows]
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
