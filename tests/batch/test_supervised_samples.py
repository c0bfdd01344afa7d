"""Rows of supervised episodes (imported transcripts) become samples with their loss mask and no
advantages, through Parquet and both packers; other episodes still need their advantages."""

from __future__ import annotations

from pathlib import Path

import pytest

from callgrove.batch import PackSettings, build_samples, pack, read_samples, write_samples
from callgrove.batch.tree import pack_samples
from callgrove.episode import load
from callgrove.formats.problems import InputError
from callgrove.rows import build_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def supervised_rows():
    episodes = list(load(EXAMPLES / "login_group.jsonl"))
    for episode in episodes:
        episode.objective = "supervised"
    return [build_rows(e) for e in episodes]


def test_supervised_rows_become_samples_without_advantages(tmp_path):
    samples = build_samples(supervised_rows())
    assert samples and all(s.advantages is None for s in samples)
    assert sum(s.num_loss_tokens for s in samples) > 0
    write_samples(tmp_path / "s.parquet", samples)
    back = read_samples(tmp_path / "s.parquet")
    assert [s.advantages for s in back] == [None] * len(samples)
    assert [s.loss_mask.tolist() for s in back] == [s.loss_mask.tolist() for s in samples]
    (micro_batch,) = pack(samples, PackSettings(seq_len=10_000)).micro_batches
    assert micro_batch.arrays["advantages"] is None
    assert "advantages" not in pack_samples(samples).target_values


def test_rl_rows_without_advantages_are_still_an_error():
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    with pytest.raises(InputError, match="no advantage"):
        build_samples(episode_rows)
