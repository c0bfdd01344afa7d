"""Random forests (agents, forks, compactions, retries, twins, interleavings, colliding tokens):
the forest and rows equal the brute-force statement of docs/episode-format.md, and every invariant holds."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.episode import load, save
from callgrove.forest import build_forest, compact_prompts
from callgrove.rows import RowSettings, build_rows, check_rows

from .builder import EpisodeBuilder, ids
from .reference import reference_parents, reference_rows

ACTIONS = ("continue", "continue", "fresh_agent", "fork", "compact", "retry", "twin", "restart")


@st.composite
def episodes(draw):
    """A random episode. A tiny alphabet makes accidental shared prefixes and ties common."""
    b = EpisodeBuilder(episode_id="random")
    alphabet = draw(st.integers(1, 6))
    tokens = st.lists(st.integers(1, alphabet), min_size=0, max_size=3)
    completion = st.lists(st.integers(1, alphabet), min_size=1, max_size=3)
    leader = b.agent("L")
    agents = [leader]
    last = {"L": None}
    for _ in range(draw(st.integers(1, 24))):
        action = draw(st.sampled_from(ACTIONS))
        agent = draw(st.sampled_from(agents))
        calls = [c for a in agents for c in a.calls]
        if action == "fresh_agent" or (action == "fork" and calls):
            parent = draw(st.sampled_from(agents))
            start = "fork" if action == "fork" else draw(st.sampled_from(["fresh", "background"]))
            new = b.agent(
                f"A{len(agents)}",
                parent=draw(st.sampled_from([parent.id, None])),
                start=start,
                trainable=draw(st.booleans()),
            )
            agents.append(new)
            history = draw(st.sampled_from(calls)) if action == "fork" else None
            last[new.id] = b.call(new, history, draw(tokens), draw(completion))
        elif action == "retry" and last[agent.id] is not None:
            b.call(agent, last[agent.id], draw(tokens), draw(completion), kept=False)
        elif action == "twin" and calls:
            source = draw(st.sampled_from(calls))
            twin = b.call(agent, b.prompt_ids(source).tolist(), [], source.completion_ids.tolist())
            last[agent.id] = twin
        elif action == "compact" and last[agent.id] is not None:
            b.call(agent, last[agent.id], draw(tokens), draw(completion), purpose="compaction")
            last[agent.id] = None
        elif action == "restart":
            last[agent.id] = b.call(agent, None, draw(tokens), draw(completion))
        else:
            last[agent.id] = b.call(agent, last[agent.id], draw(tokens), draw(completion))
    for agent in agents:
        if draw(st.booleans()):
            agent.calls.reverse()  # an agent's list order is its own; seq is the ledger
    if draw(st.booleans()):
        agents[-1].rewards = {"own": draw(st.floats(-1, 1))}
    return b.episode(rewards={"r": draw(st.floats(-1, 1))})


def _as_table(rows):
    return [(r["leaf"], r["path"], r["trains"], r["context"], r["duplicate_of"]) for r in rows]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), st.integers(1, 3))
def test_rows_equal_the_reference_and_every_invariant_holds(episode, max_identical):
    result = build_rows(episode, RowSettings(max_identical_trained=max_identical))
    parents = {
        c.id: (p.id if (p := result.forest.parent_of(c)) else None) for c in result.forest.calls
    }
    assert parents == reference_parents(episode)
    expected = reference_rows(episode, max_identical)
    got = [
        (r.leaf.id, ids(r.path), ids(r.trains), ids(r.context), r.duplicate_of) for r in result.rows
    ]
    assert got == _as_table(expected)
    for row, ref in zip(result.rows, expected, strict=True):
        assert np.array_equal(result.token_ids(row), ref["tokens"])
        assert np.array_equal(result.loss_mask(row), ref["mask"])
    summary = check_rows(result)
    assert summary.ok, [str(v) for v in summary.violations]
    assert summary.kept_calls == sum(len(r.trains) for r in result.rows)


def _row_tokens(result):
    """(path ids, token ids, loss mask) of each row."""
    return [(ids(r.path), result.token_ids(r), result.loss_mask(r)) for r in result.rows]


@settings(max_examples=60, deadline=None)
@given(episodes())
def test_compact_writing_keeps_every_token_and_the_same_rows(episode):
    before = [(path, t.copy(), m.copy()) for path, t, m in _row_tokens(build_rows(episode))]
    full = {c.id: (episode.prompt_ids(c).copy(), c.completion_ids.copy()) for c in episode.calls()}
    compact_prompts(episode)
    forest = build_forest(episode)
    for index, call in enumerate(forest.calls):
        parent = forest.parent[index]
        if parent >= 0:
            assert call.prompt_from == forest.calls[parent].id  # references the forest parent
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "episode.jsonl"
        save(path, [episode])
        (again,) = list(load(path))
    for call in again.calls():
        prompt, completion = full[call.id]
        assert np.array_equal(again.prompt_ids(call), prompt)
        assert np.array_equal(call.completion_ids, completion)
    after = _row_tokens(build_rows(again))
    assert len(after) == len(before)
    for (path_a, tokens_a, mask_a), (path_b, tokens_b, mask_b) in zip(before, after, strict=True):
        assert path_a == path_b
        assert np.array_equal(tokens_a, tokens_b) and np.array_equal(mask_a, mask_b)


@settings(max_examples=60, deadline=None)
@given(episodes())
def test_forests_and_rows_built_before_compaction_stay_valid(episode):
    full = {c.id: episode.full_ids(c).copy() for c in episode.calls()}
    result = build_rows(episode)  # nothing materialized yet: rows read the forest lazily
    parents = [result.forest.parent_of(c) for c in result.forest.calls]
    compact_prompts(episode)
    assert [result.forest.parent_of(c) for c in result.forest.calls] == parents
    assert check_rows(result).ok
    for row in result.rows:
        assert np.array_equal(result.token_ids(row), full[row.leaf.id])
        for call in row.trains if row.duplicate_of is None else []:
            trains = episode.agent_of(call).trainable
            assert result.loss_mask(row)[call.prompt_len : call.full_len].all() == trains


def test_compact_file_grows_with_distinct_tokens_not_the_square():
    b = EpisodeBuilder()
    leader = b.agent("L")
    call = b.call(leader, None, b.fresh(50), b.fresh(50))
    for _ in range(199):
        call = b.call(leader, call, b.fresh(50), b.fresh(50))
    episode = b.episode()
    compact_prompts(episode)
    buffer = io.BytesIO()
    from callgrove.episode import encode_episode

    buffer.write(encode_episode(episode))
    distinct = 200 * 100
    total_prompt = sum(c.prompt_len for c in episode.calls())
    assert total_prompt > 50 * distinct  # the histories are long ...
    assert len(buffer.getvalue()) < 12 * distinct  # ... but the file holds each token once


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), st.booleans(), st.randoms(use_true_random=False))
def test_same_sequence_equals_comparing_the_tokens(episode, compact, random):
    """Pairs asked in any order with one shared memory of settled pairs (what the forest and
    rows do), prompts as written or rebased onto their parents (chains of whole resends)."""
    if compact:
        compact_prompts(episode)
    pool = build_forest(episode).pool
    full = [episode.full_ids(call) for call in pool.calls]
    pairs = [(a, b) for a in range(len(full)) for b in range(len(full))]
    random.shuffle(pairs)
    known: dict[tuple[int, int], bool] = {}
    for a, b in pairs:
        assert pool.same_sequence(a, b, known) == np.array_equal(full[a], full[b]), (a, b)
