"""Tree packing against row-wise batches: tokens forwarded and CPU time of a training step.

    python benchmarks/batch_bench.py [--repeat 3] [--threads 1]

Workloads: the login_bug example (`examples/login_bug.jsonl`, and its four-episode group), and a
fork-heavy episode (a leader of 40 calls whose history reaches about 8k tokens, forking 8
subagents at different depths, each running 4 calls). For each: the forwarded-token ratio
(row-wise tokens / tree-packed tokens), and a check that tree packing forwards exactly the
distinct token positions of the trie (the physical floor), counted independently here by
hashing every prefix of every row. For the fork-heavy episode: forward + backward of the
clipped policy loss on the tiny reference model, row-wise (varlen micro-batches of the packer)
against tree-packed, best of `--repeat`, alternating; the target is a time ratio of at least
0.6 x the forwarded-token ratio. Last, sample building + packing throughput, from
`benchmarks/packing_bench.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from callgrove.batch import PackSettings, build_samples, pack
from callgrove.batch.samples import fill_unknown_sampling
from callgrove.batch.tree import TreeBatch, TreeSettings, pack_episode_rows, pack_samples
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import load
from callgrove.networks.sizes import TinyConfig
from callgrove.networks.tiny import TinyDecoder
from callgrove.rows import EpisodeRows, build_rows
from callgrove.train import (
    LossSettings,
    ModelBatch,
    micro_batch_model_batch,
    policy_loss,
    tree_model_batch,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from packing_bench import fork_heavy_episode, measure  # noqa: E402

TIME_TARGET = 0.6  # time ratio at least this times the forwarded-token ratio
MODEL = TinyConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=128)
HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible modulo 2**64


def distinct_prefixes(rows: list[np.ndarray], keys: list[object]) -> int:
    """Distinct (key, prefix) pairs over all rows, by a 64-bit polynomial hash of every prefix:
    h[i] = sum_j t[j] B^(i-j) = B^i * cumsum(t[j] B^-j), all modulo 2**64 in numpy."""
    longest = max(len(r) for r in rows)
    powers = _powers(HASH_BASE, longest)
    inverse_powers = _powers(np.uint64(pow(int(HASH_BASE), -1, 2**64)), longest)
    with np.errstate(over="ignore"):
        seen = set()
        for row, key in zip(rows, keys, strict=True):
            tokens = row.astype(np.uint64) + np.uint64(1)
            hashes = powers[: len(row)] * np.cumsum(tokens * inverse_powers[: len(row)])
            seen.update(zip([key] * len(row), range(len(row)), hashes.tolist(), strict=True))
    return len(seen)


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64."""
    with np.errstate(over="ignore"):
        tail = np.cumprod(np.full(max(n - 1, 0), base, dtype=np.uint64), dtype=np.uint64)
    return np.concatenate([np.ones(1, dtype=np.uint64), tail])


def report_floor(label: str, batch: TreeBatch, rows: list[np.ndarray], keys: list[object]) -> bool:
    floor = distinct_prefixes(rows, keys)
    at_floor = batch.num_tokens == floor
    print(
        f"  {label:38s} row-wise {batch.num_row_tokens:7d}  tree {batch.num_tokens:7d}  "
        f"ratio {batch.forwarded_token_ratio:5.2f}  distinct {floor:7d} "
        f"({'at the floor' if at_floor else 'NOT at the floor'})"
    )
    return at_floor


def scope_keys(episode_rows: list[EpisodeRows], scope: str) -> list[object]:
    keys: list[object] = []
    for er in episode_rows:
        for row in er.rows:
            keys.append(
                {"tree": (er.episode.id, row.path[0].id), "episode": er.episode.id}.get(
                    scope, er.episode.group
                )
            )
    return keys


def seed_figures() -> bool:
    print("login_bug example (examples/login_bug.jsonl, login_group.jsonl)")
    ok = True
    single = [build_rows(e) for e in load(ROOT / "examples" / "login_bug.jsonl")]
    group = [build_rows(e) for e in load(ROOT / "examples" / "login_group.jsonl")]
    for label, episode_rows, scope in (
        ("login_bug, per tree", single, "tree"),
        ("login_bug, per episode", single, "episode"),
        ("login_group (4 episodes), per episode", group, "episode"),
        ("login_group (4 episodes), per group", group, "group"),
    ):
        batch = pack_episode_rows(episode_rows, TreeSettings(scope=scope))
        rows = [er.token_ids(row) for er in episode_rows for row in er.rows]
        ok &= report_floor(label, batch, rows, scope_keys(episode_rows, scope))
    return ok


def step_seconds(model: TinyDecoder, batches: list[ModelBatch]) -> float:
    start = time.perf_counter()
    for batch in batches:
        model.zero_grad()
        policy_loss(model, batch, LossSettings()).backward()
    return time.perf_counter() - start


def in_vocabulary(batch: ModelBatch) -> ModelBatch:
    """The workload's ids are spread over a large vocabulary; the tiny model embeds them modulo
    its own (the trie was built from the original ids)."""
    batch.token_ids = batch.token_ids % MODEL.vocab_size
    return batch


def fork_heavy_figures(repeats: int) -> bool:
    episode = fork_heavy_episode("fork-heavy")
    finalize_group(GRPO(), [episode])
    episode_rows = build_rows(episode)
    samples = build_samples(episode_rows)
    fill_unknown_sampling(samples, temperature=1.0, top_p=1.0)  # its calls record none
    print(
        f"fork-heavy episode: {len(episode.kept_calls())} calls, {len(samples)} rows, "
        f"longest {max(s.num_tokens for s in samples)} tokens"
    )
    tree = pack_samples(samples, TreeSettings(scope="episode"))
    rows = [s.token_ids for s in samples]
    at_floor = report_floor("fork-heavy, per episode", tree, rows, [0] * len(rows))
    print(
        f"  attention query-key pairs: row-wise {tree.num_row_attention_pairs / 1e6:.1f}M, tree "
        f"{tree.num_attention_pairs / 1e6:.1f}M (ratio "
        f"{tree.num_row_attention_pairs / tree.num_attention_pairs:.2f}; the leader's own causal "
        "attention is in both)"
    )

    seq_len = max(s.num_tokens for s in samples)
    micro_batches = pack(samples, PackSettings(seq_len=seq_len)).micro_batches
    row_batches = [in_vocabulary(micro_batch_model_batch(mb)) for mb in micro_batches]
    tree_batches = [in_vocabulary(tree_model_batch(tree))]
    torch.manual_seed(0)
    model = TinyDecoder(MODEL)
    for batches in (row_batches, tree_batches):  # warm up allocators and kernels
        step_seconds(model, batches)
    row_times, tree_times = [], []
    for _ in range(repeats):
        row_times.append(step_seconds(model, row_batches))
        tree_times.append(step_seconds(model, tree_batches))
    row_best, tree_best = min(row_times), min(tree_times)
    speedup = row_best / tree_best
    needed = TIME_TARGET * tree.forwarded_token_ratio
    print(
        f"  forward+backward, tiny model {MODEL.d_model}d x {MODEL.n_layers} layers, "
        f"{torch.get_num_threads()} thread(s), best of {repeats}: row-wise {row_best:.3f} s "
        f"({len(row_batches)} micro-batches), tree {tree_best:.3f} s"
    )
    meets = speedup >= needed
    print(
        f"  time ratio {speedup:.2f} = {speedup / tree.forwarded_token_ratio:.2f} x the "
        f"forwarded-token ratio ({'meets' if meets else 'BELOW'} the {TIME_TARGET} x target, "
        f"{needed:.2f})"
    )
    return at_floor and meets


def throughput_figures() -> None:
    episodes = [fork_heavy_episode(f"ep{i}", seed=i) for i in range(32)]
    figures = measure(episodes, PackSettings(32768, ranks=8), repeats=5)
    rate = figures.rate(figures.build_and_pack_seconds)
    print(
        f"sample building + packing (packing_bench.measure, 32 fork-heavy episodes, "
        f"{figures.tokens / 1e6:.2f}M row tokens): {rate / 1e6:.1f}M tokens/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ok = seed_figures()
    ok &= fork_heavy_figures(args.repeat)
    throughput_figures()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
