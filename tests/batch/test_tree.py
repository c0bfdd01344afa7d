"""Tree packing: the trie holds every distinct prefix once, every row reads back exactly, targets
keep the rows' loss masks, and attention never costs more than row-wise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.batch import build_samples, tree
from callgrove.batch.tree import (
    SAMPLE_VALUES,
    TreeSettings,
    pack_episode_rows,
    pack_samples,
    pack_tree,
)
from callgrove.episode import Agent, Call, Episode, load
from callgrove.rows import build_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def distinct_prefixes(rows, keys=None) -> int:
    keys = keys or [None] * len(rows)
    return len(
        {(k, tuple(r[: d + 1])) for r, k in zip(rows, keys, strict=True) for d in range(len(r))}
    )


def assert_trie_reads_back(batch, rows, masks, keys=None) -> None:
    """Every row is its nodes, in order: tokens, depths, parents; nodes are distinct prefixes."""
    assert batch.num_tokens == distinct_prefixes(rows, keys)
    assert batch.num_row_tokens == sum(len(r) for r in rows)
    for r, (tokens, mask) in enumerate(zip(rows, masks, strict=True)):
        nodes = batch.row_slice(r)
        assert np.array_equal(batch.token_ids[nodes], tokens)
        assert np.array_equal(batch.position_ids[nodes], np.arange(len(tokens)))
        assert np.array_equal(batch.parent[nodes], np.concatenate([[-1], nodes[:-1]])[: len(nodes)])
        assert np.array_equal(batch.target_nodes[batch.target_rows == r], nodes[mask.astype(bool)])
    assert np.array_equal(np.flatnonzero(batch.loss_mask), np.unique(batch.target_nodes))
    assert (batch.parent < np.arange(batch.num_tokens)).all()  # parents are laid out first


def assert_paths_are_ancestor_chains(batch) -> None:
    """A path is a chain below its head's ancestors; its attention costs no more than its row's."""
    tree_pairs = 0
    for p in range(batch.num_paths):
        start, end = batch.path_nodes(p)
        context = batch.path_context(p)
        chain = np.concatenate([context, np.arange(start, end)])
        assert np.array_equal(batch.parent[chain], np.concatenate([[-1], chain[:-1]]))
        tree_pairs += sum(len(context) + i + 1 for i in range(end - start))
    row_pairs = sum(n * (n + 1) // 2 for n in np.diff(batch.row_bounds).tolist())
    assert (batch.num_attention_pairs, batch.num_row_attention_pairs) == (tree_pairs, row_pairs)
    assert tree_pairs <= row_pairs


@st.composite
def shared_rows(draw):
    """Rows that branch off each other at random depths, with twins and prefixes of others."""
    alphabet = draw(st.integers(1, 4))
    tokens = st.lists(st.integers(0, alphabet), min_size=1, max_size=6)
    rows = [draw(tokens)]
    for _ in range(draw(st.integers(0, 7))):
        source = draw(st.sampled_from(rows))
        cut = draw(st.integers(0, len(source)))
        rows.append(source[:cut] + draw(tokens) if draw(st.booleans()) else list(source))
    rows = [np.array(r, dtype=np.int32) for r in rows]
    masks = [
        np.array(
            [0, *draw(st.lists(st.integers(0, 1), min_size=len(r) - 1, max_size=len(r) - 1))],
            np.uint8,
        )
        for r in rows
    ]
    keys = draw(st.none() | st.lists(st.sampled_from("ab"), min_size=len(rows), max_size=len(rows)))
    return rows, masks, keys


@settings(max_examples=200, deadline=None)
@given(shared_rows())
def test_trie_holds_every_distinct_prefix_once_and_rows_read_back(case):
    rows, masks, keys = case
    values = [np.arange(len(r), dtype=np.float64) + 10 * i for i, r in enumerate(rows)]
    batch = pack_tree(rows, masks, {"advantages": values}, keys)
    assert_trie_reads_back(batch, rows, masks, keys)
    assert_paths_are_ancestor_chains(batch)
    expected = np.concatenate([v[m.astype(bool)] for v, m in zip(values, masks, strict=True)])
    assert np.array_equal(batch.target_values["advantages"], expected)


@settings(max_examples=100, deadline=None)
@given(shared_rows(), st.integers(1, 8))
def test_rows_gathered_a_few_at_a_time_pack_as_all_at_once(case, chunk_tokens):
    rows, masks, keys = case
    values = {"advantages": [np.arange(len(r), dtype=np.float32) for r in rows]}
    whole = pack_tree(rows, masks, values, keys)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tree, "CHUNK_TOKENS", chunk_tokens)
        chunked = pack_tree(rows, masks, values, keys)
    for name in ("token_ids", "parent", "row_nodes", "context_nodes", "target_nodes"):
        assert np.array_equal(getattr(whole, name), getattr(chunked, name))
    assert np.array_equal(whole.target_rows, chunked.target_rows)
    assert np.array_equal(whole.target_values["advantages"], chunked.target_values["advantages"])


@st.composite
def claims_in_sorted_order(draw):
    """Places of the sorted rows: when each claims, the share with the next, the key's number."""
    n = draw(st.integers(1, 12))
    times = list(draw(st.permutations(range(n))))
    shared = draw(st.lists(st.integers(0, 4), min_size=n - 1, max_size=n - 1))
    group = np.cumsum(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))).tolist()
    return times, shared, group


@settings(max_examples=300, deadline=None)
@given(claims_in_sorted_order())
def test_nearest_earlier_claim_is_the_closest_place_claimed_before(case):
    """Against a plain scan: the nearest place before each one (same group) whose row claims
    earlier, and the least neighbouring share between the two."""
    times, shared, group = case
    nearest, depth = tree._nearest_earlier_claim(times, shared, group)
    for i in range(len(times)):
        earlier = [j for j in range(i) if times[j] < times[i] and group[j] == group[i]]
        j = earlier[-1] if earlier else -1
        assert nearest[i] == j
        assert depth[i] == (min(shared[j:i]) if j >= 0 else 0)


def test_an_empty_row_does_not_hide_a_loss_on_the_next_rows_first_token():
    rows = [np.array([1, 2]), np.zeros(0, dtype=np.int32), np.array([3, 4])]
    masks = [np.array([0, 1]), np.zeros(0, dtype=np.uint8), np.array([1, 0])]
    with pytest.raises(ValueError, match=r"row 2: .*first token"):
        pack_tree(rows, masks)
    masks[2] = np.array([0, 1])
    batch = pack_tree(rows, masks)
    assert batch.target_rows.tolist() == [0, 2] and batch.row_slice(1).size == 0


def test_rows_of_different_keys_never_share_a_node():
    rows = [np.array([1, 2, 3]), np.array([1, 2, 4])]
    masks = [np.array([0, 0, 1]), np.array([0, 1, 1])]
    merged = pack_tree(rows, masks)
    apart = pack_tree(rows, masks, trie_keys=["a", "b"])
    assert (merged.num_tokens, apart.num_tokens) == (4, 6)
    assert merged.forwarded_token_ratio == 1.5 and apart.forwarded_token_ratio == 1.0


def test_a_twin_row_trains_its_shared_nodes_again_when_its_mask_says_so():
    row = np.array([5, 6, 7])
    batch = pack_tree([row, row.copy()], [np.array([0, 1, 1]), np.array([0, 1, 1])])
    assert batch.num_tokens == 3
    assert batch.target_nodes.tolist() == [1, 2, 1, 2]
    assert batch.target_rows.tolist() == [0, 0, 1, 1]


def test_loss_on_a_first_token_is_refused_naming_the_row():
    with pytest.raises(ValueError, match=r"row 1: .*first token"):
        pack_tree([np.array([1, 2]), np.array([3, 4])], [np.array([0, 1]), np.array([1, 0])])


def test_a_trained_call_without_a_prompt_is_refused_naming_episode_row_and_call():
    episode = Episode(
        "ep-7", [Agent("L", "leader", calls=[Call.make("C1", 1, [], [4, 5], [-1, -1])])]
    )
    with pytest.raises(ValueError, match=r"episode ep-7 row 0 \(root call C1\): .*first token"):
        pack_episode_rows([build_rows(episode)])


def test_mismatched_arrays_are_refused_naming_the_row():
    with pytest.raises(ValueError, match="row 0"):
        pack_tree([np.array([1, 2])], [np.array([0, 1, 1])])
    with pytest.raises(ValueError, match="row 0: 'logprobs'"):
        pack_tree([np.array([1, 2])], [np.array([0, 1])], {"logprobs": [np.zeros(3)]})


def test_login_bug_forwards_each_distinct_token_once():
    (episode,) = load(EXAMPLES / "login_bug.jsonl")
    er = build_rows(episode)
    batch = pack_episode_rows([er], TreeSettings(scope="tree"))
    rows = [er.token_ids(r) for r in er.rows]
    masks = [er.loss_mask(r) for r in er.rows]
    keys = [r.path[0].id for r in er.rows]
    assert_trie_reads_back(batch, rows, masks, keys)
    assert_paths_are_ancestor_chains(batch)
    # The row of leaf C9 repeats C1, C3 and C7, which the row of leaf C10 holds too.
    assert [c.id for c in er.rows[2].path] == ["C1", "C3", "C7", "C8", "C9"]
    shared = er.rows[2].spans()[2].end
    assert batch.num_row_tokens - batch.num_tokens >= shared
    assert batch.num_tokens == distinct_prefixes(rows, keys)
    assert np.array_equal(
        batch.target_values["logprobs"],
        np.concatenate([er.logprobs(r)[er.loss_mask(r).astype(bool)] for r in er.rows]),
    )
    # Episode scope may merge prefixes across its trees too, never fewer than the floor.
    episode_wide = pack_episode_rows([er], TreeSettings(scope="episode"))
    assert episode_wide.num_tokens == distinct_prefixes(rows)


def test_group_scope_forwards_the_shared_task_prompt_once():
    episodes = load(EXAMPLES / "login_group.jsonl")
    episode_rows = [build_rows(e) for e in episodes]
    for er in episode_rows:
        for call in er.forest.calls:
            call.advantages = 0.5
    per_episode = pack_episode_rows(episode_rows, TreeSettings(scope="episode"))
    per_group = pack_episode_rows(episode_rows, TreeSettings(scope="group"))
    rows = [er.token_ids(r) for er in episode_rows for r in er.rows]
    assert per_group.num_tokens == distinct_prefixes(rows)
    assert per_group.num_tokens < per_episode.num_tokens
    samples = [s for er in episode_rows for s in build_samples(er)]
    from_samples = pack_samples(samples, TreeSettings(scope="group"))
    assert from_samples.num_tokens == per_group.num_tokens
    assert np.array_equal(from_samples.target_nodes, per_group.target_nodes)
    assert set(from_samples.target_values) == set(SAMPLE_VALUES)
    assert pack_samples(samples).num_tokens == per_group.num_tokens  # group is the default
    per_tree = pack_episode_rows(episode_rows, TreeSettings(scope="tree"))
    from_samples_per_tree = pack_samples(samples, TreeSettings(scope="tree"))
    assert from_samples_per_tree.num_tokens == per_tree.num_tokens > per_episode.num_tokens
    assert np.array_equal(from_samples_per_tree.target_nodes, per_tree.target_nodes)


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="scope"):
        TreeSettings(scope="batch")


@settings(max_examples=200, deadline=None)
@given(shared_rows(), st.integers(1, 16))
def test_rows_are_dealt_once_each_into_tries_within_the_budget(case, budget):
    rows, _, _ = case
    dealt = tree.deal_rows(rows, budget)
    assert np.array_equal(np.sort(np.concatenate(dealt)), np.arange(len(rows)))
    for batch in dealt:
        assert np.array_equal(batch, np.sort(batch))
        nodes = distinct_prefixes([rows[r] for r in batch])
        assert nodes <= budget or len(batch) == 1  # a row longer than the budget goes alone
    # Dealt in trie order, the micro-batches forward no more than the rows do row-wise, and a
    # budget that holds everything gives one trie: every distinct prefix once.
    forwarded = sum(distinct_prefixes([rows[r] for r in batch]) for batch in dealt)
    assert forwarded <= sum(len(r) for r in rows)
    (whole,) = tree.deal_rows(rows, sum(len(r) for r in rows) or 1)
    assert len(whole) == len(rows)


def test_rows_sharing_a_long_prefix_are_dealt_together():
    system = list(range(1, 9))
    rows = [
        np.array(r, dtype=np.int32)
        for r in ([*system, 20, 21], [30, 31, 32], [*system, 22, 23], [30, 31, 33])
    ]
    dealt = [batch.tolist() for batch in tree.deal_rows(rows, 12)]
    assert sorted(dealt) == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="budget"):
        tree.deal_rows(rows, 0)


def test_step_scope_shares_a_prompt_across_groups_within_the_budget():
    """Two groups whose rows open with the same long system prompt: group scope forwards it once
    per group, step scope once per micro-batch; within a small budget it deals the rows into
    several tries, each within the budget, and every row's targets come along."""
    episodes = []
    for group in range(3):
        for number in range(2):
            agent = Agent(id="leader", name="leader")
            system = list(range(1, 41))
            prompt = [*system, 50 + group, 60 + number]
            agent.add(Call.make("c1", 1, prompt, [70 + number, 71], [-0.5, -0.5]))
            episodes.append(Episode(id=f"g{group}e{number}", group=f"g{group}", agents=[agent]))
    episode_rows = [build_rows(e) for e in episodes]
    for er in episode_rows:
        for call in er.forest.calls:
            call.advantages = 1.0
    samples = [s for er in episode_rows for s in build_samples(er)]
    group = pack_samples(samples, TreeSettings(scope="group"))
    ((step, rows),) = tree.pack_micro_batches(samples, TreeSettings(scope="step"), 10_000)
    assert np.array_equal(rows, np.arange(len(samples)))
    assert step.num_tokens == distinct_prefixes([s.token_ids for s in samples])
    assert group.num_tokens - step.num_tokens == 2 * 40  # the prompt once, not three times
    dealt = tree.pack_micro_batches(samples, TreeSettings(scope="step"), 48)
    assert len(dealt) > 1
    assert all(batch.num_tokens <= 48 for batch, _ in dealt)
    assert sum(len(batch.target_nodes) for batch, _ in dealt) == len(step.target_nodes)
    assert sorted(np.concatenate([rows for _, rows in dealt]).tolist()) == list(range(6))
    # Other scopes keep one trie for the step.
    ((whole, _),) = tree.pack_micro_batches(samples, TreeSettings(scope="group"), 100)
    assert whole.num_tokens == group.num_tokens
