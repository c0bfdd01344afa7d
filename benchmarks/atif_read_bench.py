"""Reading ATIF: every call of a held-out trajectory set trained exactly once, and the read speed
per step against the same episodes read from callgrove's own JSON Lines.

The set is synthetic episodes (seeds the tests never draw: from 10,000) written as ATIF, one
`.json` trajectory per episode with its subagents embedded, each model step carrying its token
ids and logprobs. The count check reads the folder back, builds the rows and checks that the
calls are exactly the model steps the files hold (counted from the JSON itself, not by the
reader) and that each trains in exactly one row. The speed check times `load()` over the folder
and over a JSON Lines file of the same episodes, rounds interleaved, best CPU time of the rounds,
and prints both per step (a step is a call). ATIF holds each step's whole prompt, callgrove's
file only what each prompt adds, so the bytes read differ too; they are printed beside.

    .venv/bin/python benchmarks/atif_read_bench.py
    .venv/bin/python benchmarks/atif_read_bench.py --episodes 100 --context 4096 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

import callgrove as cg
from callgrove.rows import build_rows
from callgrove.synth.workload import Shape, synth_episodes

HELD_OUT_SEED = 10_000


def model_steps(trajectory: dict) -> int:
    """Agent steps holding completion token ids, in a trajectory and its embedded subagents."""
    own = sum(
        step["source"] == "agent" and "completion_token_ids" in (step.get("metrics") or {})
        for step in trajectory["steps"]
    )
    return own + sum(model_steps(s) for s in trajectory.get("subagent_trajectories") or [])


def count_check(folder: Path) -> tuple[int, int, int]:
    """(model steps in the files, calls read, calls trained more or less than once)."""
    steps = sum(model_steps(orjson.loads(p.read_bytes())) for p in folder.glob("*.json"))
    calls = 0
    wrong = 0
    for episode in cg.load(folder):
        trained = Counter(c.id for row in build_rows(episode).rows for c in row.trains)
        kept = [c.id for c in episode.calls() if c.kept]
        calls += len(list(episode.calls()))
        wrong += sum(trained[c] != 1 for c in kept) + len(set(trained) - set(kept))
    return steps, calls, wrong


def read_time(path: Path) -> float:
    start = time.process_time()
    for _episode in cg.load(path):
        pass
    return time.process_time() - start


def size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir())
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    shape = Shape(context=args.context)
    episodes = list(synth_episodes(shape, args.episodes, seed=HELD_OUT_SEED))
    with tempfile.TemporaryDirectory() as temp:
        atif, jsonl = Path(temp) / "atif", Path(temp) / "episodes.jsonl"
        cg.save(atif, episodes, format="atif")
        cg.save(jsonl, episodes)
        steps, calls, wrong = count_check(atif)
        print(f"held-out set: {args.episodes} episodes, {shape}")
        print(
            f"count check: {steps} model steps in the files, {calls} calls read, "
            f"{wrong} trained other than exactly once -> {'ok' if steps == calls and not wrong else 'FAILED'}"
        )
        best = {atif: float("inf"), jsonl: float("inf")}
        for _round in range(args.rounds):
            for path in best:
                best[path] = min(best[path], read_time(path))
        per_step = {path: best[path] / steps * 1e6 for path in best}
        for path, name in ((atif, "ATIF folder"), (jsonl, "callgrove JSON Lines")):
            print(
                f"{name:>22}: {per_step[path]:8.1f} us/step  ({best[path]:.3f} s CPU, "
                f"{size(path) / 2**20:.1f} MiB)"
            )
        ratio = per_step[atif] / per_step[jsonl]
        print(f"ATIF / JSON Lines per step: {ratio:.2f}x (goal: within 2x)")
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
