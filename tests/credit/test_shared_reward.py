"""Credit for subagents scored by the episode's reward (`shared_reward_credit`,
`shared_reward_scale`) against plain statements of each rule, and the coefficient's two ends
against the row schemes they stand between."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.credit import GRPO, HierarchicalGRPO, finalize_group, shares_episode_reward
from callgrove.episode import Agent
from callgrove.orchestrator.config import ConfigError, config_from_dict

from .helpers import advantages, agent, episode

SETTINGS = settings(max_examples=60, deadline=None)
EPSILON = 1e-6
rewards = st.floats(-5, 5, allow_nan=False)


def subagent(agent_id: str, name: str, *, calls: int = 1, rewards=None) -> Agent:
    made = agent(agent_id, name, calls=calls, rewards=rewards)
    made.start = "fresh"
    return made


def leader_and_helper_group(episode_rewards: list[float]):
    return [
        episode(f"e{i}", agent("L", "leader"), subagent("H", "helper"), reward=r)
        for i, r in enumerate(episode_rewards)
    ]


def test_only_a_subagent_without_rewards_of_its_own_shares_the_episodes():
    group = [
        episode(
            "e",
            agent("L", "leader"),
            subagent("H", "helper"),
            subagent("S", "scout", rewards={"found": 1.0}),
        )
    ]
    credits = GRPO().score_group(group)
    assert {c.trace.seat: shares_episode_reward(c.trace) for c in credits} == {
        "leader": False,
        "helper": True,
        "scout": False,
    }
    (whole,) = GRPO(scope="episode").score_group(group)
    assert not shares_episode_reward(whole.trace)


@SETTINGS
@given(st.lists(rewards, min_size=1, max_size=7), st.booleans())
def test_leave_one_out_is_each_episode_against_the_mean_of_the_others(episode_rewards, by_std):
    group = leader_and_helper_group(episode_rewards)
    finalize_group(
        GRPO(shared_reward_credit="leave_one_out", scale_by_std=by_std, std_epsilon=EPSILON),
        group,
    )
    divisor = float(np.std(episode_rewards)) + EPSILON if by_std else 1.0
    for i, ep in enumerate(group):
        others = episode_rewards[:i] + episode_rewards[i + 1 :]
        expected = (episode_rewards[i] - np.mean(others)) / divisor if others else 0.0
        leader = (episode_rewards[i] - np.mean(episode_rewards)) / divisor
        assert advantages(ep) == {
            "L.0": pytest.approx(leader, abs=1e-9),
            "H.0": pytest.approx(expected, abs=1e-9),
        }


@SETTINGS
@given(
    st.lists(
        st.tuples(rewards, st.integers(0, 3), st.lists(rewards, max_size=2)), min_size=1, max_size=5
    )
)
def test_seat_normalised_compares_a_seat_across_the_group_and_divides_by_its_std(members):
    """Helpers are a local seat here; those without rewards of their own leave their episode's
    pool for the seat's across the group, those with their own stay."""
    group = []
    for number, (reward, shared, own) in enumerate(members):
        helpers = [subagent(f"H{k}", "helper") for k in range(shared)]
        helpers += [subagent(f"R{k}", "helper", rewards={"own": r}) for k, r in enumerate(own)]
        group.append(episode(f"e{number}", agent("L", "leader"), *helpers, reward=reward))
    algorithm = HierarchicalGRPO(
        local_seats=frozenset({"helper"}),
        shared_reward_credit="seat_normalised",
        std_epsilon=EPSILON,
    )
    finalize_group(algorithm, group)
    shared_rewards = [reward for reward, shared, _ in members for _ in range(shared)]
    leader_rewards = [reward for reward, _, _ in members]
    for ep, (reward, shared, own) in zip(group, members, strict=True):
        expected = {"L.0": reward - np.mean(leader_rewards)}
        for k in range(shared):
            mean, std = np.mean(shared_rewards), np.std(shared_rewards)
            expected[f"H{k}.0"] = (reward - mean) / (std + EPSILON)
        expected |= {f"R{k}.0": r - np.mean(own) for k, r in enumerate(own)}
        assert advantages(ep) == {key: pytest.approx(v, abs=1e-9) for key, v in expected.items()}


@SETTINGS
@given(
    st.lists(rewards, min_size=1, max_size=6),
    st.just(0.0) | st.floats(0, 3),
    st.sampled_from(["pool", "leave_one_out", "seat_normalised"]),
)
def test_the_coefficient_scales_shared_advantages_only_and_none_stays_none(
    episode_rewards, scale, rule
):
    def group():
        made = []
        for i, r in enumerate(episode_rewards):
            helper = subagent("H", "helper", calls=2)
            helper.calls[1].kept = False  # a call no agent kept: no advantage, at any scale
            idle = Agent("U", "idle", start="fresh", trainable=False)
            idle.add(agent("U", "idle").calls[0])
            scout = subagent("S", "scout", rewards={"own": -r})
            made.append(episode(f"e{i}", agent("L", "leader"), helper, scout, idle, reward=r))
        return made

    plain, scaled = group(), group()
    finalize_group(GRPO(shared_reward_credit=rule), plain)
    finalize_group(GRPO(shared_reward_credit=rule, shared_reward_scale=scale), scaled)
    for before, after in zip(plain, scaled, strict=True):
        was, now = advantages(before), advantages(after)
        assert now["H.1"] is None and now["U.0"] is None
        assert now["H.0"] == pytest.approx(scale * was["H.0"], abs=1e-12)
        assert (now["L.0"], now["S.0"]) == (was["L.0"], was["S.0"])


def test_a_coefficient_of_zero_is_an_advantage_of_zero_not_none():
    group = leader_and_helper_group([1.0, 0.0])
    report = finalize_group(GRPO(shared_reward_scale=0.0), group)
    assert [advantages(ep) for ep in group] == [{"L.0": 0.5, "H.0": 0.0}, {"L.0": -0.5, "H.0": 0.0}]
    assert all(advantages(ep)["H.0"] is not None for ep in group)
    assert report.assigned_calls == 4 and not report.unassigned_calls


def test_the_settings_are_read_from_the_algorithm_section_and_checked():
    config = config_from_dict(
        {"algorithm": {"shared_reward_credit": "leave_one_out", "shared_reward_scale": 0.5}}
    )
    assert config.algorithm == GRPO(shared_reward_credit="leave_one_out", shared_reward_scale=0.5)
    assert config_from_dict({}).algorithm.shared_reward_scale == 1.0
    with pytest.raises(ConfigError, match=r"shared_reward_credit must be one of"):
        config_from_dict({"algorithm": {"shared_reward_credit": "median"}})
    with pytest.raises(ConfigError, match=r"shared_reward_scale"):
        config_from_dict({"algorithm": {"shared_reward_scale": -1.0}})
