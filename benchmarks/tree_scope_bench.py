"""Tree scopes on real harness episodes: tokens forwarded and optimizer-step seconds per scope.

    python benchmarks/tree_scope_bench.py [FILE ...] [--groups 8] [--budget 262144] [--repeat 2]
        [--timed row-wise group step] [--d-model 64] [--layers 2] [--threads 1] [--no-time]

The default files are `tests/data/harness_groups/` (16 Claude Code and 16 Codex episodes in 8
groups each, recorded through the gateway with identical sandbox paths; see its README). Each
group's first episode is given reward 1 and the others 0 (the recordings hold no check), and
every group is credited by GRPO. Per file: the row tokens forwarded row-wise and tree-packed at
scope tree, episode, group and step (step: tries of at most `--budget` nodes, the learner's
`seq_len`), and the seconds of one optimizer step of the reference decoder on the same samples,
row-wise (packed micro-batches of `--budget` tokens, a longer row alone) and at each scope of
`--timed` (best of `--repeat`, each on a fresh learner of one seed; scopes whose trie is the
rows themselves, as tree and episode scope are when every episode is one row, cost what
row-wise costs). Torch runs on `--threads` threads (on a shared machine one thread each is
often the fastest). The targets: step scope forwards at least 1.3x
fewer tokens than group scope, and its step is faster than group scope's by at least 0.6 times
that ratio.
"""

from __future__ import annotations

import argparse
import lzma
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from callgrove.batch import Sample, build_samples
from callgrove.batch.tree import TREE_SCOPES, TreeSettings, pack_micro_batches
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import Episode, load
from callgrove.networks.sizes import TinyConfig
from callgrove.rows import build_rows
from callgrove.train.learner import TinyLearner
from callgrove.train.settings import LearnerSettings

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "harness_groups"
TOKEN_TARGET = 1.3
TIME_SHARE_TARGET = 0.6


def read_groups(path: Path, groups: int) -> list[list[Episode]]:
    """The first `groups` groups of a file (`.xz` read through a temporary copy), credited."""
    if path.suffix == ".xz":
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as plain:
            plain.write(lzma.decompress(path.read_bytes()))
            plain.flush()
            episodes = list(load(plain.name))
    else:
        episodes = list(load(path))
    by_group: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group or episode.id, []).append(episode)
    chosen = list(by_group.values())[:groups]
    for group in chosen:
        for number, episode in enumerate(group):
            episode.rewards = {"check": 1.0 if number == 0 else 0.0}
        finalize_group(GRPO(), group)
    return chosen


def forwarded(samples: Sequence[Sample], scope: str, budget: int) -> tuple[int, int]:
    """(trie nodes, micro-batches) at `scope`."""
    dealt = pack_micro_batches(samples, TreeSettings(scope), budget)
    return sum(tree.num_tokens for tree, _ in dealt), len(dealt)


def step_seconds(
    samples: Sequence[Sample], settings: LearnerSettings, config: TinyConfig, repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        learner = TinyLearner(config, settings, seed=0)
        started = time.perf_counter()
        learner.train_step(samples)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--budget", type=int, default=1 << 18, help="trie nodes per micro-batch")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--timed", nargs="+", default=["row-wise", "group", "step"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-time", action="store_true", help="count tokens only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    files = args.files or sorted(DATA.glob("*.jsonl*"))
    for path in files:
        groups = read_groups(path, args.groups)
        samples = build_samples([build_rows(e) for group in groups for e in group])
        row_tokens = sum(s.num_tokens for s in samples)
        vocab = 1 + max(int(s.token_ids.max()) for s in samples)
        config = TinyConfig(vocab, args.d_model, 4, args.layers, 2 * args.d_model)
        episodes = sum(len(g) for g in groups)
        print(
            f"{path.name}: {episodes} episodes in {len(groups)} groups, {len(samples)} rows, "
            f"{row_tokens} row tokens (longest {max(s.num_tokens for s in samples)}), "
            f"budget {args.budget}"
        )
        longest = max(s.num_tokens for s in samples)
        rows = LearnerSettings(batching="packed", seq_len=max(args.budget, longest))
        measured = {"row-wise": (row_tokens, None, rows)}
        for scope in TREE_SCOPES:
            nodes, batches = forwarded(samples, scope, args.budget)
            settings = LearnerSettings(tree_scope=scope, seq_len=args.budget)
            measured[scope] = (nodes, batches, settings)
        seconds = {}
        for name, (nodes, batches, settings) in measured.items():
            spread = f" in {batches} micro-batches" if batches else ""
            line = f"  {name:9s} {nodes:9d} tokens forwarded ({row_tokens / nodes:5.2f}x){spread}"
            if not args.no_time and name in args.timed:
                seconds[name] = step_seconds(samples, settings, config, args.repeat)
                line += f", step {seconds[name]:7.2f} s"
            print(line, flush=True)
        token_ratio = measured["group"][0] / measured["step"][0]
        verdict = "meets" if token_ratio >= TOKEN_TARGET else "BELOW"
        print(f"  step vs group: {token_ratio:.2f}x fewer tokens ({verdict} {TOKEN_TARGET}x)")
        if seconds:
            time_ratio = seconds["group"] / seconds["step"]
            wanted = TIME_SHARE_TARGET * token_ratio
            verdict = "meets" if time_ratio >= wanted else "BELOW"
            print(f"  step vs group: {time_ratio:.2f}x faster step ({verdict} {wanted:.2f}x)")


if __name__ == "__main__":
    main()
