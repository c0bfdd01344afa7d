import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgrove.credit import GRPO, agent_reward, finalize_group

from .helpers import advantages, agent, episode


def test_seat_scope_baselines_each_seat_across_the_group():
    group = [
        episode("e1", agent("L", "leader"), agent("X", "explore"), reward=1.0),
        episode("e2", agent("L", "leader"), agent("X", "explore", rewards={"found": 3.0})),
        episode("e3", agent("L", "leader", calls=2), agent("X", "explore"), reward=0.5),
    ]
    report = finalize_group(GRPO(), group)
    # leader rewards 1, 0, 0.5 (mean 0.5); explore 1, 3 (own), 0.5 (mean 1.5)
    assert advantages(group[0]) == {"L.0": 0.5, "X.0": -0.5}
    assert advantages(group[1]) == {"L.0": -0.5, "X.0": 1.5}
    assert advantages(group[2]) == {"L.0": 0.0, "L.1": 0.0, "X.0": -1.0}
    assert report.assigned_calls == 7
    assert {c.trace.seat: c.baseline for c in report.credits} == {"leader": 0.5, "explore": 1.5}


def test_scale_by_std_divides_by_the_population_std():
    group = [episode(f"e{i}", agent("L", "leader"), reward=r) for i, r in enumerate([1, 0, 0, 1])]
    finalize_group(GRPO(scale_by_std=True), group)
    # mean 0.5, population std 0.5
    values = [ep.agents[0].calls[0].advantages for ep in group]
    assert values == pytest.approx([1.0, -1.0, -1.0, 1.0], rel=1e-5)


def test_equal_rewards_give_assigned_zero_even_with_std_scaling():
    group = [episode(f"e{i}", agent("L", "leader"), reward=2.0) for i in range(3)]
    finalize_group(GRPO(scale_by_std=True), group)
    values = [ep.agents[0].calls[0].advantages for ep in group]
    assert values == [0.0, 0.0, 0.0]
    assert all(v is not None for v in values)


def test_episode_scope_scores_the_episode_reward_and_ignores_agent_rewards():
    group = [
        episode("e1", agent("L", "leader"), agent("F", "fork", rewards={"x": 9.0}), reward=1.0),
        episode("e2", agent("L", "leader"), agent("B", "bg", trainable=False), reward=0.0),
    ]
    report = finalize_group(GRPO(scope="episode"), group)
    assert advantages(group[0]) == {"L.0": 0.5, "F.0": 0.5}
    assert advantages(group[1]) == {"L.0": -0.5, "B.0": None}
    assert [c.trace.seat for c in report.credits] == [None, None]
    assert report.unassigned_calls == {"untrainable agent": 1}


def test_errored_episodes_and_untrainable_agents_take_no_part():
    group = [
        episode("e1", agent("L", "leader"), agent("U", "leader", trainable=False), reward=1.0),
        episode("e2", agent("L", "leader"), reward=0.0),
        episode("e3", agent("L", "leader", calls=2), reward=100.0, ok=False),
    ]
    group[2].agents[0].calls[0].advantages = 7.0  # stale credit from an earlier pass
    report = finalize_group(GRPO(), group)
    # only e1/L and e2/L form the leader pool: mean 0.5
    assert advantages(group[0]) == {"L.0": 0.5, "U.0": None}
    assert advantages(group[1]) == {"L.0": -0.5}
    assert advantages(group[2]) == {"L.0": None, "L.1": None}
    assert report.unassigned_calls == {"untrainable agent": 1, "errored episode": 2}


def test_calls_not_kept_get_no_advantage():
    leader = agent("L", "leader", calls=2)
    leader.calls[0].kept = False
    group = [episode("e1", leader, reward=1.0), episode("e2", agent("L", "leader"))]
    report = finalize_group(GRPO(), group)
    assert advantages(group[0]) == {"L.0": None, "L.1": 0.5}
    assert report.unassigned_calls == {"not kept": 1}


def test_agent_reward_prefers_the_agents_own_rewards_even_when_empty():
    ep = episode("e", agent("A", "a"), agent("B", "b", rewards={}), reward=2.0)
    assert agent_reward(ep, ep.agents[0]) == 2.0
    assert agent_reward(ep, ep.agents[1]) == 0.0


def test_a_group_must_be_one_group_with_distinct_episode_ids():
    with pytest.raises(ValueError, match="several groups"):
        finalize_group(GRPO(), [episode("a", group="g1"), episode("b", group="g2")])
    with pytest.raises(ValueError, match="'a' appears twice"):
        finalize_group(GRPO(), [episode("a"), episode("a")])


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="scope"):
        GRPO(scope="agent")  # type: ignore[arg-type]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(-10, 10)), min_size=1, max_size=12))
def test_advantages_of_each_seat_sum_to_zero(traces):
    agents = [agent(f"A{i}", seat, rewards={"r": r}) for i, (seat, r) in enumerate(traces)]
    group = [episode("e", *agents)]
    finalize_group(GRPO(), group)
    for seat in "abc":
        values = [a.calls[0].advantages for a in agents if a.name == seat]
        assert sum(values) == pytest.approx(0.0, abs=1e-9)
        rewards = np.array([r for s, r in traces if s == seat])
        assert values == pytest.approx(list(rewards - rewards.mean()) if len(rewards) else [])
