import pytest

from callgrove.credit import GRPO, HierarchicalGRPO, finalize_group

from .helpers import advantages, agent, episode


def proposer_solver_group():
    """Two episodes: a proposer each, with two and three solvers scored by their own rewards."""
    return [
        episode(
            "e1",
            agent("P", "proposer", rewards={"learnability": 0.5}),
            agent("S1", "solver", rewards={"correct": 1.0}),
            agent("S2", "solver", rewards={"correct": 0.0}, calls=2),
        ),
        episode(
            "e2",
            agent("P", "proposer", rewards={"learnability": 1.5}),
            agent("S1", "solver", rewards={"correct": 1.0}),
            agent("S2", "solver", rewards={"correct": 0.0}),
            agent("S3", "solver", rewards={"correct": 0.0}),
        ),
    ]


def test_solvers_are_baselined_within_their_episode_and_proposers_across_the_group():
    group = proposer_solver_group()
    report = finalize_group(HierarchicalGRPO(local_seats=frozenset({"solver"})), group)
    # proposers 0.5, 1.5 (mean 1.0); e1 solvers 1, 0 (mean 0.5); e2 solvers 1, 0, 0 (mean 1/3)
    assert advantages(group[0]) == pytest.approx(
        {"P.0": -0.5, "S1.0": 0.5, "S2.0": -0.5, "S2.1": -0.5}
    )
    assert advantages(group[1]) == pytest.approx(
        {"P.0": 0.5, "S1.0": 2 / 3, "S2.0": -1 / 3, "S3.0": -1 / 3}
    )
    baselines = {(c.trace.episode.id, c.trace.agents[0].id): c.baseline for c in report.credits}
    assert baselines[("e1", "S1")] == pytest.approx(0.5)
    assert baselines[("e2", "S1")] == pytest.approx(1 / 3)
    assert baselines[("e1", "P")] == baselines[("e2", "P")] == pytest.approx(1.0)


def test_plain_grpo_pools_the_same_solvers_across_the_group_instead():
    group = proposer_solver_group()
    finalize_group(GRPO(), group)
    # solvers 1, 0, 1, 0, 0 share one pool (mean 0.4)
    assert advantages(group[0]) == pytest.approx(
        {"P.0": -0.5, "S1.0": 0.6, "S2.0": -0.4, "S2.1": -0.4}
    )
    assert advantages(group[1])["S1.0"] == pytest.approx(0.6)


def test_a_proposer_without_own_rewards_takes_the_episode_reward():
    group = [
        episode("e1", agent("P", "proposer"), agent("S", "solver", rewards={"c": 1.0}), reward=3),
        episode("e2", agent("P", "proposer"), agent("S", "solver", rewards={"c": 0.0}), reward=1),
    ]
    finalize_group(HierarchicalGRPO(local_seats=frozenset({"solver"})), group)
    assert advantages(group[0]) == {"P.0": 1.0, "S.0": 0.0}  # a lone solver: its own baseline
    assert advantages(group[1]) == {"P.0": -1.0, "S.0": 0.0}


def test_local_baselines_with_std_scaling():
    group = proposer_solver_group()
    finalize_group(HierarchicalGRPO(local_seats={"solver"}, scale_by_std=True), group)
    # e2 solvers: mean 1/3, population std sqrt(2)/3
    std = 2**0.5 / 3
    assert advantages(group[1])["S1.0"] == pytest.approx((2 / 3) / std, rel=1e-5)
    assert advantages(group[0])["P.0"] == pytest.approx(-1.0, rel=1e-5)
