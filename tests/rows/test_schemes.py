"""Row schemes and their two choices against brute-force statements of what each one trains,
on random forests (agents, forks, compactions, background agents, retries, twins)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.batch import build_samples
from callgrove.rows import RowSettings, build_rows
from callgrove.rows.schemes import SCHEMES
from forest.builder import EpisodeBuilder, ids
from forest.reference import agent_by_call, reference_leaves_and_paths, reference_parents
from forest.test_properties import episodes

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def trained_per_row(result) -> list[tuple[str, list[str]]]:
    return [(row.leaf.id, ids(row.trains)) for row in result.rows]


def leader_of(episode):
    return next(a for a in episode.agents if a.start == "root")


@SETTINGS
@given(episodes())
def test_exactly_once_trains_every_kept_call_once(episode):
    result = build_rows(episode, RowSettings(scheme="exactly_once"))
    trained = [c for row in result.rows for c in ids(row.trains)]
    assert sorted(trained) == sorted(c.id for c in episode.calls() if c.kept)


@SETTINGS
@given(episodes())
def test_first_branch_trains_each_call_in_the_lowest_leaf_that_holds_it(episode):
    leaves, paths = reference_leaves_and_paths(episode)
    expected = []
    for number, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
        first = {c: min(i for i, p in enumerate(paths) if c in p) for c in path}
        expected.append((leaf.id, [c for c in path if first[c] == number]))
    assert trained_per_row(build_rows(episode, RowSettings(scheme="first_branch"))) == expected


@SETTINGS
@given(episodes())
def test_per_agent_trains_a_shared_history_once_per_agent_that_sees_it(episode):
    leaves, paths = reference_leaves_and_paths(episode)
    agent_of = agent_by_call(episode)
    result = build_rows(episode, RowSettings(scheme="per_agent"))
    assert [row.leaf.id for row in result.rows] == [leaf.id for leaf in leaves]
    for call in (c for c in episode.calls() if c.kept):
        for agent in episode.agents:
            sees = any(
                call.id in path and agent_of[leaf.id] is agent
                for leaf, path in zip(leaves, paths, strict=True)
            )
            times = sum(
                call.id in ids(row.trains) for row in result.rows if agent_of[row.leaf.id] is agent
            )
            assert times == int(sees), (call.id, agent.id)


@SETTINGS
@given(episodes(), st.booleans())
def test_leader_schemes_train_only_the_root_agents_chain(episode, first_tree_only):
    leaves, paths = reference_leaves_and_paths(episode)
    agent_of = agent_by_call(episode)
    leader = leader_of(episode)
    parents = reference_parents(episode)

    def root(call_id):
        while parents[call_id] is not None:
            call_id = parents[call_id]
        return call_id

    leader_calls = sorted((c for c in leader.calls if c.kept), key=lambda c: c.seq)
    first_tree = root(leader_calls[0].id) if leader_calls else None
    chosen = [
        (leaf, path)
        for leaf, path in zip(leaves, paths, strict=True)
        if agent_of[leaf.id] is leader and (not first_tree_only or root(leaf.id) == first_tree)
    ]
    expected, seen = [], set()
    for leaf, path in chosen:
        mine = [c for c in path if agent_of[c] is leader and c not in seen]
        seen.update(mine)
        expected.append((leaf.id, mine))
    scheme = "drop_subagents" if first_tree_only else "leader_only"
    result = build_rows(episode, RowSettings(scheme=scheme))
    assert trained_per_row(result) == expected
    assert [row.index for row in result.rows] == list(range(len(expected)))


@SETTINGS
@given(episodes(), st.sampled_from(sorted(SCHEMES)))
def test_the_two_choices_only_take_calls_out_of_training(episode, scheme):
    agent_of = agent_by_call(episode)
    plain = build_rows(episode, RowSettings(scheme=scheme))
    no_summaries = build_rows(episode, RowSettings(scheme=scheme, train_compaction=False))
    no_background = build_rows(episode, RowSettings(scheme=scheme, background_reward="none"))
    purpose = {c.id: c.purpose for c in episode.calls()}
    assert trained_per_row(no_summaries) == [
        (leaf, [c for c in trains if purpose[c] != "compaction"])
        for leaf, trains in trained_per_row(plain)
    ]
    assert trained_per_row(no_background) == [
        (leaf, [c for c in trains if agent_of[c].start != "background"])
        for leaf, trains in trained_per_row(plain)
    ]
    for result in (plain, no_summaries, no_background):  # the mask follows what rows train
        for row in result.rows:
            expected = np.zeros(row.num_tokens, dtype=np.uint8)
            if row.duplicate_of is None:
                for call in row.trains:
                    if episode.agent_of(call).trainable:
                        expected[call.prompt_len : call.full_len] = 1
            assert np.array_equal(result.loss_mask(row), expected)


@SETTINGS
@given(episodes(), st.sampled_from(sorted(SCHEMES)))
def test_branch_schemes_credit_every_trained_call_with_the_rows_leaf(episode, scheme):
    for agent in episode.agents:
        agent.trainable = True  # every trained call needs an advantage here
    ledger = episode.ledger()
    episode.set_advantages([float(call.seq) for call in ledger])  # tells each call apart
    result = build_rows(episode, RowSettings(scheme=scheme))
    samples = build_samples([result])
    by_branch = scheme in ("per_agent", "first_branch")
    for row, sample in zip(result.rows, samples, strict=True):
        expected = np.zeros(row.num_tokens, dtype=np.float32)
        if row.duplicate_of is None:
            for call in row.trains:
                credit = row.leaf.seq if by_branch else call.seq
                expected[call.prompt_len : call.full_len] = credit
        assert np.array_equal(sample.advantages, expected)


def fork_episode(background_rewards=None):
    """A leader that starts a background agent, forks, compacts and answers again."""
    b = EpisodeBuilder()
    leader = b.agent("L")
    background = b.agent("B", parent="L", start="background", rewards=background_rewards)
    fork = b.agent("F", parent="L", start="fork")
    first = b.call(leader)
    b.call(background)
    b.call(fork, first)
    b.call(leader, first, purpose="compaction")
    b.call(leader)
    return b.episode(rewards={"r": 2.0})


def test_per_agent_trains_the_forks_copied_history_again():
    episode = fork_episode()
    once = build_rows(episode)
    per_agent = build_rows(episode, RowSettings(scheme="per_agent"))
    assert trained_per_row(once) == [
        ("C2", ["C2"]),
        ("C3", ["C3"]),
        ("C4", ["C1", "C4"]),
        ("C5", ["C5"]),
    ]
    assert trained_per_row(per_agent) == [
        ("C2", ["C2"]),
        ("C3", ["C1", "C3"]),
        ("C4", ["C1", "C4"]),
        ("C5", ["C5"]),
    ]
    first = episode.find("C1")
    assert int(once.columns.loss_mask.sum()) + len(first.completion_ids) == int(
        per_agent.columns.loss_mask.sum()
    )


def test_background_reward_episode_scores_it_by_the_episode_and_keeps_its_own_on_record():
    episode = fork_episode(background_rewards={"own": -1.0})
    settings = RowSettings(background_reward="episode")
    background = episode.agents[1]
    assert build_rows(episode).rows[0].reward == -1.0
    assert build_rows(episode, settings).rows[0].reward == 2.0
    view = settings.for_credit(episode)
    assert view.reward_of(view.agents[1]) == 2.0
    assert background.rewards == {"own": -1.0}  # the record is not changed
    assert all(a is b for a, b in zip(view.calls(), episode.calls(), strict=True))
    assert RowSettings().for_credit(episode) is episode


@pytest.mark.parametrize(
    ("field", "value"), [("scheme", "everything_twice"), ("background_reward", "half")]
)
def test_unknown_choices_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        RowSettings(**{field: value})
