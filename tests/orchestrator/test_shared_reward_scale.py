"""With `[algorithm] shared_reward_scale = 0`, exactly-once's rows train the leader as
leader-only's do: the same advantages on the same tokens, and the same policy-gradient loss."""

from __future__ import annotations

import pytest
import torch

from callgrove.batch.tree import pack_samples
from callgrove.chat import CharFormat
from callgrove.credit import HierarchicalGRPO
from callgrove.networks.sizes import TinyConfig
from callgrove.networks.tiny import TinyDecoder
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.step import prepare_step
from callgrove.rows import RowSettings
from callgrove.train import tree_model_batch
from callgrove.train.loss import policy_loss

from .helpers import PARAMS, ScriptedPolicy, run


def handoff_groups():
    """Two `handoff` groups whose episodes answered differently, so their rewards differ."""
    groups = []
    for replies in (("30", "3", "0332"), ("3", "33", "2")):
        episodes = []
        for number, reply in enumerate(replies):
            played = run(make_env("handoff"), "302", ScriptedPolicy(reply))
            played.id, played.group = f"e{number}", f"g{len(groups)}"
            episodes.append(played)
        groups.append(episodes)
    return groups


def summed_loss(step, model: TinyDecoder) -> float:
    """The step's policy-gradient loss summed over its trained tokens (no entropy term)."""
    batch = tree_model_batch(pack_samples(step.samples))
    return float(policy_loss(model, batch, denominator=1.0).detach())


def test_a_coefficient_of_zero_trains_the_leader_as_leader_only_does():
    """Under `handoff` every leader call is continued by a leader leaf, so leader-only's rows
    train all of them; with the coefficient at 0 exactly-once's rows train them with the same
    advantages, and the subagents' tokens, trained at 0.0, add nothing to the loss."""
    keep_all = DegeneracySettings(drop=())
    algorithm = HierarchicalGRPO(shared_reward_scale=0.0)
    zero = prepare_step(handoff_groups(), algorithm, keep_all, PARAMS)
    leader_only = prepare_step(
        handoff_groups(), HierarchicalGRPO(), keep_all, PARAMS, RowSettings(scheme="leader_only")
    )

    def trained(step, seats) -> dict[tuple, list[float]]:
        """Each row's advantages on the tokens it trains, by its group, episode and leaf."""
        return {
            (sample.group, sample.episode, sample.leaf): sample.advantages[
                sample.loss_mask.astype(bool)
            ].tolist()
            for sample in step.samples
            if sample.seat in seats and sample.num_loss_tokens
        }

    assert trained(zero, {"leader"}) == trained(leader_only, {"leader"})
    subagent_values = trained(zero, {"helper", "fork"})
    assert subagent_values and all(v == 0.0 for values in subagent_values.values() for v in values)
    assert any(v for values in trained(leader_only, {"leader"}).values() for v in values)

    torch.manual_seed(0)
    model = TinyDecoder(TinyConfig(vocab_size=CharFormat().vocab_size, d_model=16, n_heads=2))
    assert summed_loss(zero, model) == pytest.approx(summed_loss(leader_only, model), rel=1e-5)


def test_where_every_subagent_has_its_own_reward_the_options_change_nothing():
    """`relay` scores every seat on its own answers: no trace shares the episode's reward."""

    def relay_advantages(**options) -> list:
        group = []
        for number, reply in enumerate(("3", "72", "302")):
            played = run(make_env("relay"), "372", ScriptedPolicy(reply))
            played.id = f"e{number}"
            group.append(played)
        algorithm = HierarchicalGRPO(local_seats=frozenset({"helper"}), **options)
        prepare_step([group], algorithm, DegeneracySettings(drop=()), PARAMS)
        return [call.advantages for episode in group for call in episode.calls()]

    plain = relay_advantages()
    assert any(plain)
    for options in (
        {"shared_reward_scale": 0.0},
        {"shared_reward_credit": "leave_one_out"},
        {"shared_reward_credit": "seat_normalised"},
    ):
        assert relay_advantages(**options) == plain
