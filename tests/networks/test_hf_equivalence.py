"""Tree-packed, packed and each-call-alone training agree through a real architecture
(`LlamaForCausalLM`, randomly initialised, grouped-query attention), block by block.

Tolerances (norm-wise, as in test_equivalence): eager attention gives bit-identical
log-probabilities and losses tree-packed and packed; everything else agrees within 1e-5
relative, with eager and sdpa, in float32 and float64 alike (the HF Llama computes its norms,
rotary angles and eager softmax in float32 whatever the dtype, so float64 is no more exact).
The blockwise masks also match one dense N x N mask.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.episode import load
from callgrove.networks.hf import HFPolicyModel
from callgrove.networks.hf_attention import attention_blocks
from callgrove.rows import build_rows
from callgrove.train import policy_loss, row_logprobs
from train.helpers import (
    EXAMPLES,
    episode_rows_of,
    episodes,
    give_advantages,
    row_batch,
    sample_near_the_model,
    seed_episode_rows,
    tiny_llama,
    tree_batch,
)
from train.test_equivalence import assert_same_training

pytestmark = pytest.mark.hf

DTYPES = (torch.float64, torch.float32)
ATTENTION = ("eager", "sdpa")
TOLERANCE = 1e-5


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", DTYPES)
def test_seed_example_trains_the_same_through_llama(attention, dtype):
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    model = tiny_llama(dtype, attention)
    assert_same_training(episode_rows, dtype, "episode", model=model, tolerance=TOLERANCE)


@pytest.mark.parametrize("attention", ATTENTION)
def test_a_group_trie_trains_the_same_through_llama(attention):
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    give_advantages(episode_rows, seed=1)
    model = tiny_llama(torch.float32, attention)
    assert_same_training(episode_rows, torch.float32, "group", model=model, tolerance=TOLERANCE)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), st.integers(1, 2), st.integers(0, 2**16), st.sampled_from(ATTENTION))
def test_random_forests_train_the_same_through_llama(episode, max_identical, seed, attention):
    episode_rows = episode_rows_of(episode, max_identical)
    give_advantages(episode_rows, seed)
    # float32: where a loss cancels to far below its terms, errors are scaled by the terms.
    model = tiny_llama(torch.float32, attention)
    assert_same_training(episode_rows, torch.float32, "episode", seed, False, model, TOLERANCE)


def test_eager_tree_packed_logprobs_and_loss_are_bit_identical_to_packed():
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    model = tiny_llama(torch.float32, "eager")
    sample_near_the_model(model, episode_rows, seed=0)
    tree, rows = tree_batch(episode_rows), row_batch(episode_rows)
    with torch.no_grad():
        for got, want in zip(row_logprobs(model, tree), row_logprobs(model, rows), strict=True):
            assert torch.equal(got, want)
        assert torch.equal(policy_loss(model, tree), policy_loss(model, rows))


@pytest.mark.parametrize("attention", ATTENTION)
def test_blockwise_masks_match_one_dense_mask(attention):
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    model = tiny_llama(torch.float64, attention)
    dense = HFPolicyModel(model.model, dense=True)
    with torch.no_grad():
        for batch in (tree_batch(episode_rows), row_batch(episode_rows)):
            for got, want in zip(
                row_logprobs(model, batch), row_logprobs(dense, batch), strict=True
            ):
                # The model's eager softmax is float32 even in float64.
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_tree_packed_batch_costs_no_more_attention_than_its_rows():
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    give_advantages(episode_rows)
    tree, rows = tree_batch(episode_rows, "group"), row_batch(episode_rows)
    for attention in ATTENTION:
        tree_pairs = attention_blocks(tree.layout, attention, torch.float32).attention_pairs
        row_pairs = attention_blocks(rows.layout, attention, torch.float32).attention_pairs
        assert tree_pairs < row_pairs
        assert tree_pairs < tree.num_tokens**2  # what one dense mask would cost
