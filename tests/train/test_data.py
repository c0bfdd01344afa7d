"""Sample files through a DataLoader: every sample comes back once, grouped as asked, and the
collated tree-packed and packed batches train exactly like batches built in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from callgrove.batch import PackSettings, build_samples, fill_unknown_sampling, write_samples
from callgrove.batch.tree import SAMPLE_VALUES, TreeSettings, pack_samples
from callgrove.episode import load
from callgrove.rows import build_rows
from callgrove.train import (
    LossSettings,
    PackedCollate,
    SampleDataset,
    TreeCollate,
    policy_loss,
    tree_model_batch,
)

from .helpers import EXAMPLES, give_advantages, tiny_model


@pytest.fixture
def sample_files(tmp_path):
    """The four-episode group split over two files, two episodes each."""
    episode_rows = [build_rows(e) for e in load(EXAMPLES / "login_group.jsonl")]
    give_advantages(episode_rows)
    samples = build_samples(episode_rows)
    fill_unknown_sampling(samples, 1.0, 1.0)  # the example records no sampling: the run's
    paths = []
    for half in (0, 1):
        path = tmp_path / f"part{half}.parquet"
        write_samples(
            path,
            [
                s
                for s in samples
                if s.episode in {er.episode.id for er in episode_rows[2 * half : 2 * half + 2]}
            ],
        )
        paths.append(path)
    return paths, samples


def keys(samples):
    return [(s.episode, s.row) for s in samples]


def test_every_sample_comes_back_once_grouped_as_asked(sample_files):
    paths, samples = sample_files
    assert keys(SampleDataset(paths)) == keys(samples)
    episodes = list(SampleDataset(paths, unit="episode"))
    assert [len({s.episode for s in run}) for run in episodes] == [1, 1, 1, 1]
    groups = list(SampleDataset(paths, unit="group"))  # one group, split across two files
    assert [len(run) for run in groups] == [10, 10]
    with pytest.raises(ValueError, match="unit"):
        SampleDataset(paths, unit="row")


def test_tree_collate_trains_like_tree_packing_in_memory(sample_files):
    paths, samples = sample_files
    loader = DataLoader(
        SampleDataset(paths, unit="group"),
        batch_size=2,
        collate_fn=TreeCollate(TreeSettings("group")),
    )
    (batch,) = list(loader)
    expected = tree_model_batch(pack_samples(samples, TreeSettings("group")))
    assert torch.equal(batch.token_ids, expected.token_ids)
    assert batch.forwarded_token_ratio == expected.forwarded_token_ratio > 4
    model = tiny_model(torch.float64)
    got = policy_loss(model, batch, LossSettings(normalisation="sequence"))
    want = policy_loss(model, expected, LossSettings(normalisation="sequence"))
    assert got.item() == want.item()


def test_packed_collate_yields_micro_batches_of_every_token(sample_files):
    paths, samples = sample_files
    collate = PackedCollate(PackSettings(seq_len=128))
    loader = DataLoader(SampleDataset(paths), batch_size=len(samples), collate_fn=collate)
    (micro_batches,) = list(loader)
    assert all(mb.num_tokens <= 128 for mb in micro_batches)
    assert sum(mb.num_tokens for mb in micro_batches) == sum(s.num_tokens for s in samples)
    assert sum(len(mb.target_index) for mb in micro_batches) == sum(
        s.num_loss_tokens for s in samples
    )
    assert all(set(mb.target_values) == set(SAMPLE_VALUES) for mb in micro_batches)


def test_workers_split_the_files(sample_files):
    paths, samples = sample_files
    loader = DataLoader(SampleDataset(paths), batch_size=None, num_workers=2)
    assert sorted(keys(loader)) == sorted(keys(samples))
    assert np.array_equal(next(iter(loader)).token_ids, samples[0].token_ids)
