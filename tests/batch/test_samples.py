from pathlib import Path

import numpy as np
import pytest

from callgrove.batch import (
    NO_VERSION,
    TOKEN_FIELDS,
    build_samples,
    read_samples,
    sample_from_row,
    samples_to_table,
    write_samples,
)
from callgrove.batch import samples as samples_module
from callgrove.credit import GRPO, Credit, finalize_group
from callgrove.episode import Agent, Call, Episode, load, save
from callgrove.formats.problems import InputError
from callgrove.rows import RowSettings, build_rows

EXAMPLES = Path(__file__).parents[2] / "examples"


def seed_episode() -> Episode:
    (episode,) = load(EXAMPLES / "login_bug.jsonl")
    return episode


def credited(episode: Episode, reward: float = 1.0, baseline_reward: float = 0.0) -> Episode:
    """Credit `episode` by GRPO against one other episode with one leader call."""
    other = Agent("L", "leader")
    other.add(Call.make("X", 1, [1], [2], [-1.0]))
    rival = Episode("rival", [other], group=episode.group, rewards={"r": baseline_reward})
    episode.rewards = {"r": reward}
    finalize_group(GRPO(), [episode, rival])
    return episode


def test_login_bug_samples_carry_each_field_per_token():
    episode = credited(seed_episode())
    rows = build_rows(episode)
    samples = build_samples(rows)
    assert [s.leaf for s in samples] == ["C4", "C6", "C9", "C10", "C12"]
    assert [s.root for s in samples] == ["C2", "C5", "C1", "C1", "C11"]
    for sample, row in zip(samples, rows.rows, strict=True):
        np.testing.assert_array_equal(sample.token_ids, rows.token_ids(row))
        np.testing.assert_array_equal(sample.loss_mask, rows.loss_mask(row))
        np.testing.assert_array_equal(sample.logprobs, rows.logprobs(row).astype(np.float32))
        np.testing.assert_array_equal(sample.position_ids, np.arange(row.num_tokens))
        off_mask = sample.loss_mask == 0
        assert not sample.advantages[off_mask].any()
        assert not sample.logprobs[off_mask].any()
        for call, start, prompt_end, end in row.spans():
            versions = sample.policy_versions
            assert (versions[start:prompt_end] == NO_VERSION).all()
            assert (versions[prompt_end:end] == call.policy_version).all()
            if sample.loss_mask[prompt_end:end].any():
                assert (sample.advantages[prompt_end:end] == call.advantages).all()
        assert (sample.episode, sample.group, sample.row) == (episode.id, "grp-login", row.index)
        assert (sample.agent, sample.seat) == (row.agent.id, row.agent.name)
        assert sample.reward == row.reward
    # row 3 (leaf C9) trains only C8 and C9: C1 C3 C7 are context with no loss; the fixer
    # seat has no rival trace, so its advantage is an assigned 0.0
    row3 = samples[2]
    assert (row3.num_loss_tokens, row3.seat) == (5, "fixer")
    assert set(row3.advantages.tolist()) == {0.0}
    # row 4 (leaf C10) trains the leader's calls: reward 1 against the rival's 0
    assert set(samples[3].advantages[samples[3].loss_mask == 1].tolist()) == {0.5}


def test_assigned_zero_reaches_the_sample_through_a_file(tmp_path):
    episode = credited(seed_episode(), reward=0.5, baseline_reward=0.5)
    assert {c.advantages for c in episode.calls()} == {0.0}
    save(tmp_path / "credited.jsonl", [episode])
    (reloaded,) = load(tmp_path / "credited.jsonl")
    assert {c.advantages for c in reloaded.calls()} == {0.0}
    samples = build_samples(build_rows(reloaded))
    assert all(not s.advantages.any() for s in samples)
    assert sum(s.num_loss_tokens for s in samples) > 0


def test_unassigned_advantage_is_an_error_naming_episode_row_and_call(tmp_path):
    save(tmp_path / "raw.jsonl", [seed_episode()])
    (uncredited,) = load(tmp_path / "raw.jsonl")
    with pytest.raises(InputError, match=r"episode login-bug-0001, call C2: row 0: .*no advantage"):
        build_samples(build_rows(uncredited))
    episode = credited(seed_episode())
    episode.call("C8").advantages = None
    with pytest.raises(InputError, match=r"call C8: row 2: "):
        build_samples(build_rows(episode))


def test_errored_episodes_say_why_they_have_no_advantage():
    episode = seed_episode()
    episode.ok = False
    finalize_group(GRPO(), [episode])
    with pytest.raises(InputError, match=r"did not complete \(ok false\)"):
        build_samples(build_rows(episode))


def test_calls_without_loss_tokens_need_no_advantage():
    episode = credited(seed_episode())
    # C1, C3, C7 are context in row 2 and trained in row 3; untrainable B trains nowhere
    episode.agent("B").trainable = False
    finalize_group(GRPO(), [episode])
    assert episode.call("C2").advantages is None
    samples = build_samples(build_rows(episode))
    assert samples[0].num_loss_tokens == 0
    assert not samples[0].advantages.any()


def test_duplicate_rows_build_with_an_all_zero_mask():
    leader = Agent("L", "leader")
    root = leader.add(Call.make("R", 1, [1, 2], [3], [-0.1]))
    twins = [Agent(f"T{seq}", "twin", parent="L", start="fresh") for seq in (2, 3)]
    for seq, twin in enumerate(twins, start=2):  # same task, same answer
        twin.add(Call.make(f"T{seq}", seq, [7, 8], [9], [-0.2]))
    episode = Episode("dup", [leader, *twins], group="g", rewards={"r": 1.0})
    finalize_group(GRPO(), [episode])
    samples = build_samples(build_rows(episode, RowSettings(max_identical_trained=1)))
    assert [s.duplicate_of for s in samples] == [None, None, 1]
    assert [s.num_loss_tokens for s in samples] == [1, 1, 0]
    assert root.advantages == 0.0


class LaterTokensCountMore(GRPO):
    def call_advantages(self, credit: Credit):
        for call in credit.trace.calls():
            yield call, np.arange(len(call.completion_ids), dtype=np.float64) + credit.advantage


def test_per_token_advantages_land_on_their_completion_tokens():
    episode = seed_episode()
    finalize_group(LaterTokensCountMore(), [episode])
    sample = build_samples(build_rows(episode))[2]  # leaf C9: trains C8 (4 tokens), C9 (1)
    assert sample.advantages[sample.loss_mask == 1].tolist() == [0, 1, 2, 3, 0]


def test_parquet_round_trip_keeps_every_field_and_missing_logprobs(tmp_path):
    episode = credited(seed_episode())
    episode.call("C12").logprobs = None
    samples = build_samples(build_rows(episode))
    assert samples[4].logprobs is None
    write_samples(tmp_path / "samples.parquet", samples)
    back = read_samples(tmp_path / "samples.parquet")
    assert_same_samples(back, samples)
    assert back[4].logprobs is None


def test_tables_split_into_record_batches_that_keep_list_offsets_small(monkeypatch):
    samples = build_samples(build_rows(credited(seed_episode())))
    monkeypatch.setattr(samples_module, "_MAX_BATCH_TOKENS", 40)
    table = samples_to_table(samples)
    assert len(table.to_batches()) > 1
    assert_same_samples(samples_module.samples_from_table(table), samples)


def test_torch_tensors_share_the_sample_memory():
    torch = pytest.importorskip("torch")
    sample = build_samples(build_rows(credited(seed_episode())))[2]
    tensors = sample.to_torch()
    assert set(tensors) == set(TOKEN_FIELDS)
    assert tensors["token_ids"].dtype == torch.int32
    assert tensors["advantages"].dtype == torch.float32
    tensors["advantages"][0] = 7.0
    assert sample.advantages[0] == 7.0


def assert_same_samples(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        for name in samples_module.METADATA_FIELDS:
            assert getattr(a, name) == getattr(e, name), name
        for name in TOKEN_FIELDS:
            left, right = getattr(a, name), getattr(e, name)
            if right is None:
                assert left is None, name
            else:
                assert left.dtype == right.dtype, name
                np.testing.assert_array_equal(left, right, err_msg=name)


def test_a_whole_group_builds_at_once_as_it_does_episode_by_episode():
    group = list(load(EXAMPLES / "login_group.jsonl"))
    finalize_group(GRPO(), group)
    rows = [build_rows(episode) for episode in group]
    together = build_samples(rows)
    apart = [sample for episode_rows in rows for sample in build_samples(episode_rows)]
    one_by_one = [
        sample_from_row(episode_rows, row) for episode_rows in rows for row in episode_rows.rows
    ]
    assert_same_samples(together, apart)
    assert_same_samples(together, one_by_one)
    assert [s.episode for s in together] == [r.episode.id for er in rows for r in er.rows]


def test_numpy_scalar_advantages_count_and_wrong_lengths_are_named():
    episode = credited(seed_episode())
    episode.call("C9").advantages = np.float32(0.25)
    sample = build_samples(build_rows(episode))[2]
    assert sample.advantages[-1] == 0.25
    episode.call("C9").advantages = np.array([1.0, 2.0])
    with pytest.raises(InputError, match=r"call C9: advantages has 2 values for 1 completion"):
        build_samples(build_rows(episode))


def leader_and_fork(episode_id: str, leader_reward: float, fork_reward: float) -> Episode:
    """The leader's only call is continued by nothing but its fork's call."""
    leader = Agent("L", "leader", rewards={"r": leader_reward})
    leader.add(Call.make("A", 1, [1, 2], [3], [-0.1]))
    fork = Agent("F", "fork", parent="L", start="fork", rewards={"r": fork_reward})
    fork.add(Call.make("B", 2, [1, 2, 3, 4], [5], [-0.2]))
    return Episode(episode_id, [leader, fork], group="g")


def test_a_call_trained_in_another_agents_row_keeps_its_own_agents_advantage():
    group = [leader_and_fork("e1", 2.0, 0.0), leader_and_fork("e2", 0.0, 1.0)]
    finalize_group(GRPO(), group)
    (sample,) = build_samples(build_rows(group[0]))
    assert (sample.leaf, sample.seat, sample.reward) == ("B", "fork", 0.0)
    # A (the leader's, mean 1.0) at token 2, B (the fork's, mean 0.5) at token 4
    assert sample.loss_mask.tolist() == [0, 0, 1, 0, 1]
    assert sample.advantages.tolist() == [0.0, 0.0, 1.0, 0.0, -0.5]
