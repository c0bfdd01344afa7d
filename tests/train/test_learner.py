"""The reference learner: one optimizer step per call, the same step tree-packed or packed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from callgrove.batch import build_samples
from callgrove.networks.sizes import TinyConfig
from callgrove.train.learner import TinyLearner
from callgrove.train.settings import LearnerSettings

from .helpers import give_advantages, seed_episode_rows

CONFIG = TinyConfig(vocab_size=80, d_model=16, n_heads=2, n_layers=2, d_ff=32)


def samples():
    episode_rows = seed_episode_rows()
    give_advantages(episode_rows)
    return build_samples(episode_rows)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
@pytest.mark.parametrize(("scope", "budget"), [("episode", 4096), ("step", 4096), ("step", 80)])
def test_tree_packed_and_packed_steps_agree_and_bump_the_version(entropy_coef, scope, budget):
    """Tree scope `step` with a budget of 80 trie nodes deals the rows into several tries."""
    batch = samples()
    settings = LearnerSettings(
        batching="tree", tree_scope=scope, seq_len=budget, entropy_coef=entropy_coef
    )
    tree = TinyLearner(CONFIG, settings, seed=3)
    assert (len(tree.model_batches(batch)) > 1) == (budget < 4096)
    packed = TinyLearner(
        CONFIG, LearnerSettings(batching="packed", seq_len=64, entropy_coef=entropy_coef), seed=3
    )
    a, b = tree.train_step(batch), packed.train_step(batch)
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert a.loss_tokens == b.loss_tokens and a.row_tokens == b.row_tokens
    assert a.forwarded_tokens < b.forwarded_tokens == b.row_tokens
    assert a.forwarded_token_ratio > 1.0
    for name, weight in tree.weights().items():
        torch.testing.assert_close(weight, packed.weights()[name], rtol=1e-4, atol=1e-6)
    assert tree.version == packed.version == 1


def test_state_round_trip_and_empty_steps():
    learner = TinyLearner(CONFIG, seed=0)
    learner.train_step(samples())
    again = TinyLearner(CONFIG, seed=1)
    again.load_state_dict(learner.state_dict())
    assert again.version == 1
    for name, weight in learner.weights().items():
        assert torch.equal(weight, again.weights()[name])
    report = again.train_step([])  # everything dropped: still a step
    assert again.version == 2 and report.samples == 0 and np.isfinite(report.loss)


@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_a_step_whose_loss_or_gradient_is_not_finite_changes_nothing(poison, monkeypatch):
    learner = TinyLearner(CONFIG, seed=0)
    before = learner.weights()
    if poison == "loss":
        monkeypatch.setattr(
            TinyLearner, "loss", lambda self, batch, d: self.model.embed.weight.sum() * np.nan
        )
    else:  # a loss of 0.0 whose gradient is infinite (the square root's at 0)
        monkeypatch.setattr(
            TinyLearner,
            "loss",
            lambda self, batch, d: (
                (self.model.embed.weight - self.model.embed.weight.detach()).sqrt().sum()
            ),
        )
    with pytest.raises(FloatingPointError, match="not both finite: no optimizer step taken"):
        learner.train_step(samples())
    assert learner.version == 0
    for name, weight in learner.weights().items():
        assert torch.equal(weight, before[name])
