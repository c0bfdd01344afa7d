"""The learner on one GPU: the Hugging Face learner's tree-packed step against its row-wise step
on real harness episodes, and the same step through FSDP2 (the learner's ranks), in one table.

    python benchmarks/gpu_check.py [--device cuda] [--groups 8] [--repeat 1] [--lora-rank 0]
        [--no-checkpointing] [--tree-budget 131072] [--tiny] [--threads N]

Made to run in a few minutes on one H200 with what that machine has (torch, transformers, peft;
nothing downloaded, nothing large carried):

1. Samples: the 16 Claude Code and 16 Codex episodes of `tests/data/harness_groups/` (8 groups
   each; one row an episode, rows of 38k to 87k byte tokens sharing their harness's system
   prompt), credited by GRPO as `tree_scope_bench.py` credits them; `--groups` per file.
2. Model: a SmolLM2-135M-shaped Llama (its config, random weights), in bfloat16, full
   fine-tuning (`--lora-rank R`: LoRA adapters of rank R).
3. The learner in this process, gradient checkpointing on (`--no-checkpointing`: off; both
   ways alike): one step tree-packed (tree scope `step`: tries of at most `--tree-budget` nodes
   over the rows of every group, so each harness's system prompt is forwarded once) and one
   row-wise (packed micro-batches of the longest row's tokens: each holds one long row or a
   few shorter), the fastest of `--repeat`: row tokens per second, peak GPU memory, and the
   ratio. The tree-packed path runs first, with one step of warm-up before it.
4. FSDP2: the tree-packed step through `RankedLearner` at world size 1 (its rank a process of
   its own, NCCL on the GPU), after one step of warm-up: the same figures, and the seconds to
   gather its weights for a sampler (what `time/weight_push_s` holds in a run, with the
   sampler's loading).

Every path's first step starts from the same weights: their losses (`first loss`) agree up to
the precision's round-off.

`--tiny` runs the same code on a CPU in seconds (a small model in float32 and small synthetic
groups instead of the harness episodes): what the tests run.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import torch

from callgrove.batch import Sample, build_samples, fill_unknown_sampling
from callgrove.credit import GRPO, finalize_group
from callgrove.networks.sizes import LoraSettings
from callgrove.rows import build_rows
from callgrove.synth import Shape, synth_episode
from callgrove.train.hf_trainer import HFLearner, HFOptions
from callgrove.train.learner import StepReport
from callgrove.train.ranks import RankedLearner
from callgrove.train.settings import LearnerSettings

sys.path.insert(0, str(Path(__file__).parent))
from tree_scope_bench import DATA, read_groups

# SmolLM2-135M's shape (its config.json), and a tiny one for a CPU.
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=131072,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
TINY_SHAPE = Shape(
    leader_calls=3,
    fresh=1,
    forks=1,
    fork_depth=2,
    background=1,
    twins=1,
    subagent_calls=1,
    compactions=1,
    context=64,
    group_size=2,
    vocab=256,
)
SEED = 0


def harness_samples(groups: int) -> list[Sample]:
    """The first `groups` groups of each harness file, credited, as one step's samples."""
    episodes = [
        episode
        for path in sorted(DATA.glob("*.jsonl*"))
        for group in read_groups(path, groups)
        for episode in group
    ]
    return build_samples([build_rows(e) for e in episodes])


def synthetic_samples(groups: int) -> list[Sample]:
    episodes = [synth_episode(TINY_SHAPE, seed) for seed in range(groups * TINY_SHAPE.group_size)]
    for start in range(0, len(episodes), TINY_SHAPE.group_size):
        finalize_group(GRPO(), episodes[start : start + TINY_SHAPE.group_size])
    return build_samples([build_rows(e) for e in episodes])


def learner(
    shape: dict,
    dtype: str,
    lora_rank: int,
    checkpointing: bool,
    settings: LearnerSettings,
    device: str = "cpu",
) -> HFLearner:
    """The model from its config with seeded random weights (every rank builds the same)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**shape, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(getattr(torch, dtype)).to(device)
    lora = LoraSettings(rank=lora_rank) if lora_rank else None
    return HFLearner(model, settings, HFOptions(lora, checkpointing))


@dataclass
class Timed:
    path: str
    first: StepReport
    """The path's first step (from the same initial weights as every path's)."""
    best: StepReport
    seconds: float
    micro_batches: int | str


def timed_steps(
    path: str, step, samples: list[Sample], repeat: int, warm_up: bool, micro_batches: int | str
) -> Timed:
    """`repeat` steps (after one of warm-up), each a real optimizer step; the fastest."""
    first = step(samples) if warm_up else None
    best: tuple[StepReport, float] | None = None
    for _ in range(repeat):
        started = time.perf_counter()
        report = step(samples)
        seconds = time.perf_counter() - started
        first = first or report
        if best is None or seconds < best[1]:
            best = (report, seconds)
    assert best is not None and first is not None
    print(f"  {path}: {best[1]:.2f} s", flush=True)
    return Timed(path, first, best[0], best[1], micro_batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--groups", type=int, default=8, help="groups of each harness file")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every activation")
    parser.add_argument("--tree-budget", type=int, default=1 << 17, help="trie nodes a batch")
    parser.add_argument("--tiny", action="store_true", help="a small model and small groups")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: its own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        shape, dtype, samples = TINY, "float32", synthetic_samples(args.groups)
    else:
        shape, dtype, samples = SMOLLM2, "bfloat16", harness_samples(args.groups)
    filled = fill_unknown_sampling(samples, 1.0, 1.0)
    longest = max(s.num_tokens for s in samples)
    row_tokens = sum(s.num_tokens for s in samples)
    checkpointing = not args.no_checkpointing
    print(
        f"{len(samples)} rows, {row_tokens} row tokens (longest {longest}), "
        f"{sum(s.num_loss_tokens for s in samples)} trained, {filled} sampling filled; "
        f"{'LoRA rank ' + str(args.lora_rank) if args.lora_rank else 'full fine-tuning'}, "
        f"{dtype} on {args.device}, gradient checkpointing {'on' if checkpointing else 'off'}, "
        f"torch {torch.__version__}",
        flush=True,
    )
    build = partial(learner, shape, dtype, args.lora_rank, checkpointing)
    row_wise = LearnerSettings(learning_rate=1e-5, batching="packed", seq_len=longest)
    tree = LearnerSettings(
        learning_rate=1e-5, tree_scope="step", seq_len=max(args.tree_budget, longest)
    )
    timed = {}
    # Tree-packed first: its warm-up step (the cheaper one) loads the GPU's kernels for both.
    for name, settings, warm_up in (("tree-packed", tree, True), ("row-wise", row_wise, False)):
        one = build(settings, args.device)
        batches = len(one.model_batches(samples))
        path = f"one process, {name}"
        timed[name] = timed_steps(path, one.train_step, samples, args.repeat, warm_up, batches)
        del one
        gc.collect()  # the model and its optimizer, before the next one is built
        if args.device == "cuda":
            torch.cuda.empty_cache()
    ranked = RankedLearner(
        build,
        msgspec.structs.replace(tree, world_size=1),
        device=args.device,
        preload=["transformers.modeling_utils", "peft"],
    )
    try:
        path = "FSDP2, 1 rank, tree-packed"
        timed["fsdp2"] = timed_steps(path, ranked.train_step, samples, args.repeat, True, "-")
        started = time.perf_counter()
        weights = ranked.weights()
        gathered = time.perf_counter() - started
    finally:
        ranked.close()
    print_table([timed["row-wise"], timed["tree-packed"], timed["fsdp2"]])
    speedup = timed["row-wise"].seconds / timed["tree-packed"].seconds
    print(
        f"tree-packed vs row-wise: {speedup:.2f}x the row tokens per second, "
        f"{timed['tree-packed'].best.forwarded_token_ratio:.2f}x fewer tokens forwarded"
    )
    size = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    print(
        f"FSDP2 weights gathered for a sampler: {len(weights)} tensors, {size:.0f} MiB, "
        f"{gathered:.2f} s"
    )


def print_table(rows: list[Timed]) -> None:
    header = (
        "path",
        "forwarded",
        "micro-batches",
        "step s",
        "row tok/s",
        "peak GiB",
        "first loss",
    )
    lines = [header]
    for row in rows:
        peak = row.best.extra.get("peak_memory_gib")
        lines.append(
            (
                row.path,
                str(row.best.forwarded_tokens),
                str(row.micro_batches),
                f"{row.seconds:.2f}",
                f"{row.best.row_tokens / row.seconds:,.0f}",
                "-" if peak is None else f"{peak:.1f}",
                f"{row.first.loss:.9g}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
