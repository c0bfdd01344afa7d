"""The referee counts every sampled token's trainings as a plain brute-force reference does,
callgrove's own samples pass it on every hard case, and each kind of defect is named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.audit import TrainedRow, audit
from callgrove.audit.batches import sample_rows
from callgrove.batch import build_samples
from callgrove.rows import build_rows
from callgrove.synth.cases import HARD_CASES, SYSTEM_TOKENS
from callgrove.synth.workload import Shape, synth_episode


def credited(episode):
    for call in episode.calls():
        call.advantages = 0.5
    return episode


def callgrove_rows(episode) -> list[TrainedRow]:
    return sample_rows(build_samples(build_rows(episode)))


def full_rows(episode, calls=None) -> list[TrainedRow]:
    """A row per call, the loss on its whole sequence: what trains everything it sees."""
    calls = calls if calls is not None else episode.kept_calls()
    rows = []
    for number, call in enumerate(calls):
        tokens = episode.full_ids(call)
        rows.append(TrainedRow(tokens, np.ones(len(tokens), bool), None, f"row {number}"))
    return rows


@pytest.mark.parametrize("case", list(HARD_CASES))
def test_callgrove_rows_train_every_sampled_token_once_in_its_context(case):
    episode = credited(HARD_CASES[case](0))
    report = audit([episode], callgrove_rows(episode))
    assert report.exact
    assert report.unsampled_tokens == 0 and report.trained_not_to_train == 0
    # every sampled token trains once, but a twin's, whose identical copy trained
    assert report.untrained == report.twin_untrained
    assert report.once + report.untrained == report.sampled_tokens
    assert all(t.in_context and t.advantage == 0.5 for c in report.calls for t in c.trainings)
    assert (case == "twins") == (report.twin_untrained > 0)


def test_a_fork_row_training_the_leaders_history_trains_it_twice():
    episode = HARD_CASES["fork"](0)
    report = audit([episode], full_rows(episode))
    leader_first = next(c for c in report.calls if c.call == "L.0")
    assert leader_first.twice_or_more == leader_first.tokens  # in the leader's rows and the fork's
    assert report.wrong_context == 0  # the fork resends the history exactly: its context is right
    # every prompt and message token of the rows is loss-on and was never sampled
    assert report.unsampled_tokens == report.loss_tokens - sum(
        int(c.trained.sum()) for c in report.calls
    )


def test_a_summary_trained_after_its_compaction_is_in_a_wrong_context():
    episode = HARD_CASES["two compactions"](0)
    report = audit([episode], full_rows(episode))
    summaries = [c for c in report.calls if c.call in ("L.2", "L.5")]
    assert all(c.wrong_context_tokens == c.tokens for c in summaries)
    # wrong in every row after its compaction: the turns from it, and the next compaction's
    first, second = ({t.row for t in c.trainings if not t.in_context} for c in summaries)
    assert first == {"row 3", "row 4", "row 5"} and second == {"row 6", "row 7"}


def test_an_inexact_forks_copy_of_the_history_is_a_wrong_context():
    episode = HARD_CASES["inexact fork"](0)
    report = audit([episode], full_rows(episode))
    leader = [c for c in report.calls if c.call in ("L.0", "L.1")]
    assert all(c.wrong_context_tokens == c.tokens for c in leader)
    assert not report.exact


def test_a_rejected_compaction_trained_counts_as_a_call_not_to_train():
    episode = HARD_CASES["rejected compaction"](0)
    rejected = next(c for c in episode.calls() if not c.kept)
    report = audit([episode], full_rows(episode, [rejected]))
    assert report.trained_not_to_train == len(rejected.completion_ids)
    assert report.exact  # nothing to train was trained twice


def test_identical_episodes_each_train_once_and_the_rows_episode_is_preferred():
    first, second = HARD_CASES["fork"](0), HARD_CASES["fork"](0)
    second.id = "fork-again"
    rows = []
    for episode in (first, second):
        for row in callgrove_rows(credited(episode)):
            rows.append(row)
    report = audit([first, second], rows)
    assert report.exact and report.untrained == 0
    for call in report.calls:
        assert {t.row_agent for t in call.trainings} <= {a.id for a in first.agents}


def test_unnamed_rows_are_owned_by_their_leaf_agent():
    episode = credited(HARD_CASES["fork"](0))
    rows = [
        TrainedRow(r.token_ids, r.loss_mask, r.advantages, r.where) for r in callgrove_rows(episode)
    ]
    report = audit([episode], rows)
    fork_call = next(c for c in report.calls if c.call == "F.1")
    assert [(t.row_agent, t.row_seat) for t in fork_call.trainings] == [("F", "fork")]


def test_a_short_run_of_equal_tokens_is_not_a_wrong_context():
    episode = HARD_CASES["background"](0)
    call = episode.kept_calls()[0]
    # a tool result that happens to repeat three of the call's tokens, loss on
    row = np.concatenate([np.arange(1, SYSTEM_TOKENS + 1), call.completion_ids[:3]])
    mask = np.zeros(len(row), bool)
    mask[-3:] = True
    report = audit([episode], [TrainedRow(row, mask, None, "row 0")])
    assert report.wrong_context == 0 and report.unsampled_tokens == 3


def reference_in_context(episodes, rows) -> int:
    """Loss-on tokens whose whole prefix is some kept or unkept call's prefix up to one of its
    completion tokens: by comparing every pair."""
    sequences = []
    for episode in episodes:
        for call in episode.calls():
            full = episode.full_ids(call)
            sequences.append((full, call.prompt_len))
    count = 0
    for row in rows:
        for p in np.flatnonzero(row.loss_mask):
            if any(
                start <= p < len(full) and np.array_equal(full[: p + 1], row.token_ids[: p + 1])
                for full, start in sequences
            ):
                count += 1
    return count


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    forks=st.integers(0, 2),
    twins=st.integers(0, 1),
    compactions=st.integers(0, 1),
    mask_seed=st.integers(0, 10_000),
)
def test_every_loss_token_is_counted_once_as_a_plain_reference_counts_it(
    seed, forks, twins, compactions, mask_seed
):
    shape = Shape(
        leader_calls=4,
        fresh=1,
        forks=forks,
        twins=twins,
        background=1,
        subagent_calls=2,
        compactions=compactions,
        context=96,
        vocab=50,
    )
    episode = synth_episode(shape, seed)
    rng = np.random.default_rng(mask_seed)
    rows = [
        TrainedRow(r.token_ids, rng.random(len(r.token_ids)) < 0.6, None, r.where)
        for r in full_rows(episode, episode.calls())
    ]
    report = audit([episode], rows)
    trained = sum(int(c.trained.sum()) for c in report.calls)
    wrong = sum(int(c.wrong_context.sum()) for c in report.calls)
    assert trained + report.unsampled_tokens == report.loss_tokens
    assert trained - wrong == reference_in_context([episode], rows)
