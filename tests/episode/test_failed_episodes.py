"""An episode that produced nothing is an episode with ok false, no agents and its errors:
written, read back, counted under errors, and never a seat in the per-agent tallies."""

from __future__ import annotations

from pathlib import Path

import pytest

from callgrove.cli.stats import Stats
from callgrove.episode import load, save

from .helpers import cancelled, env_raised, healthy
from .strategies import as_plain

FORMS = [".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow"]


@pytest.mark.parametrize("suffix", FORMS)
def test_failed_episodes_round_trip_without_agents(tmp_path: Path, suffix: str) -> None:
    written = [healthy(), cancelled(), env_raised()]
    path = tmp_path / f"traces{suffix}"
    save(path, written)
    read = list(load(path))
    assert [e.id for e in read] == ["ok-1", "cancelled-1", "raised-1"]
    for episode in read[1:]:
        assert episode.ok is False
        assert episode.agents == []
        assert len(episode.errors) == 1
    float32 = suffix in (".parquet", ".arrow")
    assert [as_plain(e, float32) for e in read] == [as_plain(e, float32) for e in written]


@pytest.mark.parametrize("suffix", FORMS)
def test_failed_episodes_count_under_errors_and_under_no_agent(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy(), cancelled(), env_raised()])
    stats = Stats()
    for episode in load(path):
        stats.add(episode)
    assert stats.episodes == 3
    assert stats.ok == 1
    assert stats.without_agents == 2
    assert stats.with_errors == 2
    assert stats.errors == {"Cancelled": 1, "EnvSetupError": 1}
    assert set(stats.agents) == {"leader", "solver"}
    assert stats.agents["leader"].agents == 1 and stats.agents["solver"].agents == 1
    assert sum(t.errors for t in stats.agents.values()) == 0
    assert stats.agents["leader"].calls == 2 and stats.calls == 3
