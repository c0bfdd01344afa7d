"""The synthetic workload: the shape asked for, the same episodes from the same seed, and
rows that keep every forest invariant."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load
from callgrove.forest import build_forest
from callgrove.rows import build_rows, check_rows
from callgrove.synth import PRESETS, Shape, call_tokens, synth_episode, synth_episodes


def tokens_of(episode) -> list[tuple[str, int, list[int], str]]:
    return [
        (call.id, call.seq, episode.full_ids(call).tolist(), call.purpose)
        for call in sorted(episode.calls(), key=lambda c: c.seq)
    ]


def test_the_same_seed_gives_the_same_episode_and_another_seed_another():
    shape = PRESETS["4k"]
    assert tokens_of(synth_episode(shape, 3)) == tokens_of(synth_episode(shape, 3))
    assert tokens_of(synth_episode(shape, 3)) != tokens_of(synth_episode(shape, 4))


def test_the_episode_has_the_agents_calls_and_compactions_asked_for():
    shape = Shape(
        leader_calls=12, fresh=3, forks=2, fork_depth=2, background=2, twins=1, compactions=2
    )
    episode = synth_episode(shape, 0)
    starts = Counter(agent.start for agent in episode.agents)
    assert starts == {"root": 1, "fresh": 4, "fork": 4, "background": 2}
    assert len(episode.agents) == shape.agents
    assert sum(1 for _ in episode.calls()) == shape.calls
    for agent in episode.agents:
        purposes = [call.purpose for call in agent.calls]
        assert purposes.count("compaction") == shape.compactions, agent.id
        assert purposes[-1] == "turn"
    seqs = sorted(call.seq for call in episode.calls())
    assert seqs == list(range(1, shape.calls + 1))


def test_the_forest_sees_forks_compactions_and_twins_as_built():
    shape = Shape(forks=2, fork_depth=2, twins=1, compactions=1)
    episode = synth_episode(shape, 1)
    forest = build_forest(episode)
    by_id = {agent.id: agent for agent in episode.agents}
    for agent in episode.agents:
        first_parent = forest.parent_of(agent.calls[0])
        if agent.start == "fork":
            # a fork's first call resends its parent agent's history: a child of its call
            assert (
                first_parent is not None and episode.agent_of(first_parent) is by_id[agent.parent]
            )
        else:
            assert first_parent is None
        for before, after in zip(agent.calls, agent.calls[1:], strict=False):
            parent = forest.parent_of(after)
            if before.purpose == "compaction":
                assert parent is None  # the call after a summary is a new root
            else:
                assert parent is before
    result = build_rows(episode)
    assert check_rows(result).ok
    duplicates = [row for row in result.rows if row.duplicate_of is not None]
    assert duplicates and all(row.agent.id.startswith("T") for row in duplicates)


def test_histories_reach_about_the_context():
    for context in (4096, 16_384):
        episode = synth_episode(replace(PRESETS["4k"], context=context), 2)
        longest = max(call.full_len for call in episode.agents[0].calls)
        assert 0.75 * context <= longest <= 1.3 * context
        assert call_tokens(episode) == sum(c.full_len for c in episode.calls())


@pytest.mark.parametrize(
    "wrong",
    [
        {"twins": 3, "fresh": 2},
        {"leader_calls": 0},
        {"forks": 1, "fork_depth": 0},
        {"context": 10},
        {"background": -1},
    ],
)
def test_impossible_shapes_are_refused(wrong):
    with pytest.raises(ValueError):
        Shape(**wrong)


@settings(max_examples=20, deadline=None)
@given(
    leader_calls=st.integers(1, 12),
    subagent_calls=st.integers(1, 6),
    fresh=st.integers(0, 3),
    forks=st.integers(0, 3),
    fork_depth=st.integers(1, 3),
    background=st.integers(0, 2),
    compactions=st.integers(0, 3),
    context=st.sampled_from([64, 300, 2048]),
    seed=st.integers(0, 1000),
)
def test_every_shape_makes_rows_that_keep_the_invariants(seed, **counts):
    shape = Shape(twins=min(1, counts["fresh"]), **counts)
    episode = synth_episode(shape, seed)
    assert sum(1 for _ in episode.calls()) == shape.calls
    summary = check_rows(build_rows(episode))
    assert summary.ok, summary.violations[:3]


def test_synth_command_writes_the_same_file_for_the_same_seed(tmp_path: Path):
    runner = CliRunner()
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.parquet"]
    for path in paths:
        args = ["synth", str(path), "-n", "3", "--seed", "9", "--context", "1024", "--forks", "1"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert paths[0].read_bytes() == paths[1].read_bytes()
    expected = list(synth_episodes(replace(PRESETS["4k"], context=1024, forks=1), 3, seed=9))
    for path in (paths[0], paths[2]):
        read = list(load(path))
        assert [e.id for e in read] == [e.id for e in expected]
        for ours, theirs in zip(read, expected, strict=True):
            assert tokens_of(ours) == tokens_of(theirs)
            for a, b in zip(
                sorted(ours.calls(), key=lambda c: c.seq),
                sorted(theirs.calls(), key=lambda c: c.seq),
                strict=True,
            ):
                assert np.allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_synth_command_refuses_an_impossible_shape(tmp_path: Path):
    result = CliRunner().invoke(app, ["synth", str(tmp_path / "x.jsonl"), "--twins", "5"])
    assert result.exit_code == 2
    assert "twins" in result.output
