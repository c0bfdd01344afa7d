"""The learner in one process against the learner as ranks (FSDP2 over gloo on the CPU): step
seconds, row tokens per second, the seconds to gather the weights for a sampler, and how far
the ranks' parameters are from the one process's after the same steps.

    python benchmarks/ranks_bench.py [--world-sizes 1 2] [--groups 8] [--steps 3]
        [--batching tree|packed] [--scope step] [--seq-len 2048] [--d-model 64] [--layers 2]
        [--threads 2] [--float64]

The samples are synthetic groups with forks, background agents, twins and compactions
(`callgrove.synth`), credited by GRPO; the model is the reference decoder. Every learner takes
the same `--steps` steps from the same initial weights; a step's time is the fastest of them.
The ranks share the machine's cores with each other (`--threads` torch threads in all, split
among the ranks), so on a 2-core machine two ranks do not make a step faster: what the run
shows is the cost of the ranks' collectives and transfers beside the one process.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import msgspec
import torch

from callgrove.batch import Sample, build_samples
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import sampling_record
from callgrove.networks.sizes import TinyConfig
from callgrove.rows import build_rows
from callgrove.synth import Shape, synth_episode
from callgrove.train.learner import ModelLearner, TinyLearner
from callgrove.train.ranks import RankedLearner
from callgrove.train.settings import LearnerSettings

VOCAB = 256
SHAPE = Shape(
    leader_calls=6,
    fresh=2,
    forks=1,
    fork_depth=2,
    background=1,
    twins=1,
    subagent_calls=3,
    compactions=1,
    context=256,
    group_size=4,
    vocab=VOCAB,
)


def step_samples(groups: int, first_seed: int) -> list[Sample]:
    episodes = [synth_episode(SHAPE, first_seed + i) for i in range(groups * SHAPE.group_size)]
    for start in range(0, len(episodes), SHAPE.group_size):
        finalize_group(GRPO(), episodes[start : start + SHAPE.group_size])
    for episode in episodes:
        for call in episode.calls():
            call.sampling = sampling_record(1.0, 1.0)
    return build_samples([build_rows(e) for e in episodes])


def tiny(config: TinyConfig, dtype: str, settings: LearnerSettings) -> ModelLearner:
    learner = TinyLearner(config, settings, seed=0)
    learner.model.to(getattr(torch, dtype))
    learner.build_optimizer()
    return learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batching", choices=["tree", "packed"], default="tree")
    parser.add_argument("--scope", default="step", help="tree scope (step: tries of --seq-len)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--float64", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = [step_samples(args.groups, 1000 * step) for step in range(args.steps)]
    row_tokens = sum(s.num_tokens for s in steps[0])
    print(
        f"{len(steps[0])} rows, {row_tokens} row tokens a step; reference decoder d_model "
        f"{args.d_model}, {args.layers} layers; {args.batching} (scope {args.scope}, seq_len "
        f"{args.seq_len}); {args.threads} threads in all",
        flush=True,
    )
    config = TinyConfig(VOCAB, args.d_model, 4, args.layers, 2 * args.d_model)
    build = partial(tiny, config, "float64" if args.float64 else "float32")
    base = LearnerSettings(
        batching=args.batching, tree_scope=args.scope, seq_len=args.seq_len, learning_rate=1e-3
    )
    reference = None
    print(
        f"{'learner':<22}{'start s':>9}{'step s':>9}{'row tok/s':>11}{'weights s':>11}"
        f"{'max |Δ| vs 1 process':>22}"
    )
    for world_size in [0, *args.world_sizes]:  # 0: the learner in this process
        settings = msgspec.structs.replace(base, world_size=max(world_size, 1))
        started = time.perf_counter()
        learner = build(settings) if world_size == 0 else RankedLearner(build, settings)
        start = time.perf_counter() - started
        fastest = float("inf")
        for samples in steps:
            began = time.perf_counter()
            learner.train_step(samples)
            fastest = min(fastest, time.perf_counter() - began)
        began = time.perf_counter()
        weights = learner.weights()
        gathered = time.perf_counter() - began
        if reference is None:
            reference = weights
        difference = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
        if world_size:
            learner.close()
        name = "one process" if world_size == 0 else f"{world_size} rank(s), FSDP2"
        print(
            f"{name:<22}{start:>9.2f}{fastest:>9.2f}{row_tokens / fastest:>11,.0f}"
            f"{gathered:>11.3f}{difference:>22.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
