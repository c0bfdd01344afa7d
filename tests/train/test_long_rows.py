"""Long rows: logits (and their log-softmax) are computed only where a token is trained or its
log-probability is asked for, never over the whole row x vocabulary, and a single-row batch
attends causally without a mask.

The same losses, log-probabilities and gradients as reading every position's logits (the
reference below), on short rows through the tiny decoder and a random Llama; and a 16k-token
row with a 49,152-token vocabulary (SmolLM2's) trains one step in bounded memory, where the
logits of every position alone would take 3 GiB (and as much again for their gradient).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from callgrove.sampling.distribution import sampling_distribution
from callgrove.train import policy_loss, supervised_loss, token_logprobs

from .helpers import (
    give_advantages,
    row_batch,
    sample_near_the_model,
    seed_episode_rows,
    tiny_llama,
    tiny_model,
    tree_batch,
)


def every_position_logprobs(model, batch, index):
    """The reference: logits at every forwarded position, then read at the predecessors."""
    logits = model(batch.token_ids, batch.position_ids, batch.layout)
    predecessor = batch.predecessor[index]
    distribution = torch.log_softmax(logits[predecessor.clamp(min=0)], dim=-1)
    picked = distribution.gather(1, batch.token_ids[index][:, None])[:, 0]
    return torch.where(predecessor >= 0, picked, torch.zeros_like(picked))


def every_position_scored_logprobs(model, batch):
    """The reference under each target's own sampling distribution, one target at a time."""
    logits = model(batch.token_ids, batch.position_ids, batch.layout)
    values = batch.target_values
    picked = []
    for target, token in enumerate(batch.target_index.tolist()):
        row = logits[batch.predecessor[token]][None]
        keep = torch.zeros_like(row, dtype=torch.bool)
        keep[0, batch.token_ids[token]] = True
        distribution = sampling_distribution(
            row,
            values["temperatures"][target : target + 1].double(),
            values["top_p"][target : target + 1].double(),
            values["top_k"][target : target + 1].long(),
            keep,
        )
        picked.append(distribution[0, batch.token_ids[token]])
    return torch.stack(picked)


def every_position_rl_loss(model, batch):
    """The token-normalised clipped policy loss from every position's logits."""
    logprobs = every_position_scored_logprobs(model, batch)
    ratio = torch.exp(logprobs - batch.target_values["logprobs"].to(logprobs.dtype))
    advantages = batch.target_values["advantages"].to(logprobs.dtype)
    clipped = ratio.clamp(0.8, 1.2)
    return -torch.minimum(ratio * advantages, clipped * advantages).mean()


def every_position_sft_loss(model, batch):
    return -every_position_logprobs(model, batch, batch.target_index).mean()


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", ["tiny", "llama-eager", "llama-sdpa"])
def test_logits_at_the_needed_positions_give_the_every_position_results(make):
    model = (
        tiny_model(torch.float64)
        if make == "tiny"
        else tiny_llama(torch.float64, make.removeprefix("llama-"))
    )
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    sample_near_the_model(model, episode_rows, seed=0)
    for batch in (tree_batch(episode_rows), row_batch(episode_rows)):
        with torch.no_grad():
            everything = torch.arange(batch.num_tokens)
            torch.testing.assert_close(
                token_logprobs(model, batch),
                every_position_logprobs(model, batch, everything),
                rtol=0,
                atol=1e-12,
            )
        for loss, reference in (
            (policy_loss, every_position_rl_loss),
            (supervised_loss, every_position_sft_loss),
        ):
            got, want = loss(model, batch), reference(model, batch)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
            got_grads, want_grads = gradients(model, got), gradients(model, want)
            assert got_grads.keys() == want_grads.keys()
            for name, grad in want_grads.items():
                torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-14)


# One training step on a long single row, in a fresh interpreter so its peak resident memory is
# its own; prints the peak growth (bytes) over the model and batch being ready.
LONG_ROW = """
import resource, sys
import numpy as np, torch
from transformers import LlamaConfig, LlamaForCausalLM
from callgrove.batch import Sample
from callgrove.train.hf_trainer import HFLearner
from callgrove.train.settings import LearnerSettings

tokens, trained, vocab = int(sys.argv[1]), int(sys.argv[2]), 49152
torch.manual_seed(0)
config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=tokens)
learner = HFLearner(LlamaForCausalLM(config), LearnerSettings(objective=sys.argv[3]))
rng = np.random.default_rng(0)
mask = np.zeros(tokens, np.int8); mask[-trained:] = 1
rl = sys.argv[3] == "rl"
sample = Sample(
    token_ids=rng.integers(0, vocab, tokens).astype(np.int32), loss_mask=mask,
    logprobs=np.where(mask, -10.8, 0.0).astype(np.float32) if rl else None,
    advantages=np.where(mask, 1.0, 0.0).astype(np.float32) if rl else None,
    position_ids=np.arange(tokens, dtype=np.int32),
    policy_versions=np.zeros(tokens, np.int32), temperatures=np.ones(tokens, np.float32),
    top_p=np.ones(tokens, np.float32), top_k=np.zeros(tokens, np.int32), episode="e", group=None, agent="a",
    seat="a", row=0, leaf="c1", root="c1", reward=1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
report = learner.train_step([sample])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
assert report.loss_tokens == trained and np.isfinite(report.loss)
print(peak - before)
"""


def test_a_long_row_trains_in_bounded_memory():
    tokens, trained, vocab = 16384, 256, 49152
    done = subprocess.run(
        [sys.executable, "-c", LONG_ROW, str(tokens), str(trained), "rl"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    growth = int(done.stdout.strip().splitlines()[-1])
    every_position_logits = tokens * vocab * 4  # float32: 3 GiB, before any gradient
    assert growth < 512 * 2**20, f"peak grew by {growth / 2**20:.0f} MiB"
    assert growth < every_position_logits / 6
