"""Write, read back, compare: every field of the record, in every file form."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

from callgrove.episode import (
    Agent,
    BinaryEpisodeWriter,
    Call,
    Episode,
    load,
    open_writer,
    save,
)

from .strategies import as_plain, episode_lists

ROUND_TRIPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
@ROUND_TRIPS
@given(written=episode_lists)
def test_json_lines_keep_every_field_exactly(suffix: str, written: list[Episode]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"episodes{suffix}"
        assert save(path, written) == len(written)
        read = list(load(path))
    assert [as_plain(e) for e in read] == [as_plain(e) for e in written]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
@ROUND_TRIPS
@given(written=episode_lists)
def test_binary_keeps_every_field_with_float32_per_token_values(
    suffix: str, written: list[Episode]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"episodes{suffix}"
        # two episodes a batch, so reading crosses batch (row group) boundaries
        with BinaryEpisodeWriter(path, batch_episodes=2) as writer:
            for episode in written:
                writer.write(episode)
        read = list(load(path))
        assert [as_plain(e, float32=True) for e in read] == [
            as_plain(e, float32=True) for e in written
        ]
        for episode in read:
            for call in episode.calls():
                assert call.completion_ids.dtype == np.int32
                assert call.logprobs is None or call.logprobs.dtype == np.float32


def _chain(calls: int, new_tokens: int, episode_id: str = "chain") -> Episode:
    """One agent whose history grows call after call, each prompt compact over the last."""
    rng = np.random.default_rng(0)
    agent = Agent("L", "leader")
    previous = None
    for seq in range(calls):
        call = Call.make(
            f"C{seq}",
            seq,
            rng.integers(0, 150_000, new_tokens),
            rng.integers(0, 150_000, 20),
            logprobs=-rng.random(20),
        )
        if previous is not None:
            call.prompt_from, call.prompt_from_len = previous.id, previous.full_len
        previous = agent.add(call)
    return Episode(episode_id, [agent])


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_binary_calls_are_views_into_shared_column_buffers(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"chain{suffix}"
    save(path, [_chain(calls=5, new_tokens=100)])
    (episode,) = load(path)
    calls = list(episode.calls())
    for call in calls:
        assert not call.completion_ids.flags.owndata
        assert not call.prompt_suffix.flags.owndata
        assert call.completion_ids.base is calls[0].completion_ids.base
    assert calls[-1].prompt_from == calls[-2].id
    assert episode.base_of(calls[-1]) is calls[-2]
    assert calls[-1].prompt_len == 4 * 120 + 100


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_compact_prompts_stay_compact(tmp_path: Path, suffix: str) -> None:
    """40 calls over a growing history: the file holds each distinct token once, not the
    quadratic sum of the prompts."""
    episode = _chain(calls=40, new_tokens=200)
    prompt_tokens = sum(c.prompt_len for c in episode.calls())
    distinct = sum(len(c.prompt_suffix) + len(c.completion_ids) for c in episode.calls())
    assert prompt_tokens > 15 * distinct
    path = tmp_path / f"chain{suffix}"
    save(path, [episode])
    bytes_per_token = 12 if suffix == ".jsonl" else 4.5
    assert path.stat().st_size < bytes_per_token * distinct + 20_000
    (read,) = load(path)
    assert [read.full_ids(c).tolist() for c in read.calls()] == [
        episode.full_ids(c).tolist() for c in episode.calls()
    ]


def test_binary_writer_leaves_no_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "episodes.parquet"
    with pytest.raises(RuntimeError), open_writer(path) as writer:
        writer.write(_chain(calls=2, new_tokens=3))
        raise RuntimeError("crash mid-run")
    assert list(tmp_path.iterdir()) == []


def test_binary_file_appears_whole_only_on_close(tmp_path: Path) -> None:
    path = tmp_path / "episodes.arrow"
    writer = BinaryEpisodeWriter(path, batch_episodes=1)
    writer.write(_chain(calls=2, new_tokens=3))
    assert not path.exists()
    writer.close()
    assert [e.id for e in load(path)] == ["chain"]


def test_binary_files_cannot_be_appended_to(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="appended"):
        open_writer(tmp_path / "x.parquet", append=True)


def test_binary_batches_are_bounded_by_tokens_and_episodes(tmp_path: Path) -> None:
    """The batch is what a reader holds at once: the writer closes one at either bound."""
    by_episodes, by_tokens = tmp_path / "episodes.parquet", tmp_path / "tokens.parquet"
    chains = [_chain(calls=3, new_tokens=100, episode_id=f"chain-{i}") for i in range(5)]
    # 360 tokens each
    with BinaryEpisodeWriter(by_episodes, batch_episodes=2) as writer:
        for episode in chains:
            writer.write(episode)
    with BinaryEpisodeWriter(by_tokens, batch_tokens=700) as writer:
        for episode in chains:
            writer.write(episode)
    for path in (by_episodes, by_tokens):
        groups = pq.ParquetFile(path).metadata
        assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [2, 2, 1]
        assert len(list(load(path))) == 5
