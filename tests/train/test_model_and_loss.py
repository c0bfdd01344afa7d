"""The model's layouts keep sequences and trie paths apart as they must, the fused CPU path kernel
equals the masked one, and the clipped loss is what PPO's formula says on hand-made cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from callgrove.batch.tree import pack_tree
from callgrove.train import (
    LossSettings,
    packed_model_batch,
    policy_loss,
    row_logprobs,
    token_logprobs,
    tree_model_batch,
)

from .helpers import tiny_model


def test_varlen_sequences_do_not_see_each_other():
    model = tiny_model(torch.float64)
    first, second = np.array([3, 4, 5, 6]), np.array([7, 8, 9])
    changed = np.array([7, 1, 9])
    cu_seqlens = np.array([0, 4, 7])
    with torch.no_grad():
        before = token_logprobs(
            model, packed_model_batch(np.r_[first, second], cu_seqlens, np.zeros(7))
        )
        after = token_logprobs(
            model, packed_model_batch(np.r_[first, changed], cu_seqlens, np.zeros(7))
        )
    assert torch.equal(before[:4], after[:4])
    assert before[0] == 0 and before[4] == 0  # first tokens: nothing predicts them
    assert not torch.equal(before[5:], after[5:])


def test_fused_and_masked_path_attention_agree_with_row_wise():
    rows = [np.array([1, 2, 3, 4, 5, 6]), np.array([1, 2, 3, 9, 9]), np.array([1, 2, 7])]
    masks = [np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1]), np.array([0, 1, 1])]
    tree = pack_tree(rows, masks)
    assert tree.num_paths == 3
    cu_seqlens = np.cumsum([0, *map(len, rows)])
    row_wise = packed_model_batch(np.concatenate(rows), cu_seqlens, np.concatenate(masks))
    model = tiny_model(torch.float64)
    want = row_logprobs(model, row_wise)
    for fused in (True, False):
        batch = tree_model_batch(tree)
        batch.layout.fused = fused
        for got, expected in zip(row_logprobs(model, batch), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_batch_moves_to_a_device_whole():
    tree = pack_tree([np.array([1, 2, 3]), np.array([1, 2, 4])], [np.array([0, 1, 1])] * 2)
    moved = tree_model_batch(tree).to("meta")
    tensors = [moved.token_ids, moved.predecessor, moved.target_index, moved.row_tokens]
    tensors += [context for _, _, context in moved.layout.paths]
    assert all(t.device.type == "meta" for t in tensors)
    assert [(s, e) for s, e, _ in moved.layout.paths] == [(0, 3), (3, 4)]


def single_row_batch(old_logprob_shift: float, advantages: list[float], mask: list[int]):
    """A row whose sampling logprobs are the model's own minus `old_logprob_shift`, so every
    importance ratio is exp(old_logprob_shift)."""
    model = tiny_model(torch.float64)
    tokens = np.array([5, 6, 7, 8, 9])
    cu_seqlens = np.array([0, len(tokens)])
    with torch.no_grad():
        own = token_logprobs(model, packed_model_batch(tokens, cu_seqlens, np.zeros(5))).numpy()
    values = {"logprobs": own - old_logprob_shift, "advantages": np.array(advantages, float)}
    return model, packed_model_batch(tokens, cu_seqlens, np.array(mask), None, values)


@pytest.mark.parametrize(
    ("advantage", "expected", "has_gradient"),
    [(1.0, -1.2, False), (-1.0, 1.5, True)],  # ratio 1.5: clipped to 1.2 only when it helps
)
def test_ratio_above_the_clip(advantage, expected, has_gradient):
    model, batch = single_row_batch(math.log(1.5), [0, 0, advantage, 0, 0], [0, 0, 1, 0, 0])
    loss = policy_loss(model, batch, LossSettings(clip_low=0.2, clip_high=0.2))
    loss.backward()
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    gradient = sum(p.grad.abs().sum().item() for p in model.parameters())
    assert (gradient > 0) == has_gradient


def test_token_and_sequence_normalisation():
    tokens = np.array([5, 6, 7, 5, 6, 7, 8])
    cu_seqlens = np.array([0, 3, 7])
    mask = np.array([0, 0, 1, 0, 1, 1, 1])
    advantages = np.array([0, 0, 2.0, 0, 1, 1, 1])
    model = tiny_model(torch.float64)
    with torch.no_grad():
        own = token_logprobs(model, packed_model_batch(tokens, cu_seqlens, mask)).numpy()
    values = {"logprobs": own, "advantages": advantages}  # ratio 1: each term is -advantage
    batch = packed_model_batch(tokens, cu_seqlens, mask, None, values)
    token = policy_loss(model, batch, LossSettings(normalisation="token"))
    sequence = policy_loss(model, batch, LossSettings(normalisation="sequence"))
    assert token.item() == pytest.approx(-(2 + 3) / 4, rel=1e-12)
    assert sequence.item() == pytest.approx((-2 + -1) / 2, rel=1e-12)


def test_entropy_bonus_is_the_mean_entropy_of_each_trained_token_s_distribution():
    tokens = np.array([5, 6, 7, 5, 6, 7, 8])
    cu_seqlens = np.array([0, 3, 7])
    mask = np.array([0, 0, 1, 0, 1, 1, 1])
    model = tiny_model(torch.float64)
    plain = packed_model_batch(tokens, cu_seqlens, mask)
    with torch.no_grad():
        own = token_logprobs(model, plain).numpy()
        logits = model(plain.token_ids, plain.position_ids, plain.layout)
    values = {"logprobs": own, "advantages": np.zeros(len(tokens))}  # no policy-gradient term
    batch = packed_model_batch(tokens, cu_seqlens, mask, None, values)
    # token t is predicted by position t - 1 of its own sequence
    predicting = [1, 3, 4, 5]
    by_hand = [
        -(torch.softmax(logits[p], -1) * torch.log_softmax(logits[p], -1)).sum().item()
        for p in predicting
    ]
    loss = policy_loss(model, batch, LossSettings(entropy_coef=0.5))
    assert loss.item() == pytest.approx(-0.5 * np.mean(by_hand), rel=1e-12)
    loss.backward()  # a step against the loss raises the entropy
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.05 * parameter.grad
    assert policy_loss(model, batch, LossSettings(entropy_coef=0.5)).item() < loss.item()
    assert policy_loss(model, batch, LossSettings()).item() == pytest.approx(0.0, abs=1e-12)


def test_missing_sampling_logprobs_and_bad_settings_are_refused():
    model = tiny_model(torch.float64)
    batch = packed_model_batch(np.array([5, 6]), np.array([0, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="logprobs"):
        policy_loss(model, batch)
    with pytest.raises(ValueError, match="normalisation"):
        LossSettings(normalisation="row")
    with pytest.raises(ValueError, match="entropy_coef"):
        LossSettings(entropy_coef=-0.1)
    with pytest.raises(ValueError, match="first token"):
        packed_model_batch(np.array([5, 6]), np.array([0, 2]), np.array([1, 0]))
