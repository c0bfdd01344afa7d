"""Samples from Parquet files into a torch `DataLoader`, collated into packed or tree-packed batches.

    loader = DataLoader(SampleDataset(paths, unit="group"), batch_size=2,
                        collate_fn=TreeCollate(TreeSettings()))
    for batch in loader:            # a ModelBatch: tokens, positions, layout, targets
        loss = policy_loss(model, batch)

Files are read record batch by record batch, never whole. With `unit="episode"` or `"group"`
the dataset yields the consecutive samples of one episode or group as one item (files written
from `build_samples` keep them together), so a batch never splits what a trie may share.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset, get_worker_info

from callgrove.batch import PackSettings, Sample, pack, samples_from_table
from callgrove.batch.samples import SAMPLE_SCHEMA
from callgrove.batch.tree import TreeSettings, pack_samples
from callgrove.errors import InvalidValue
from callgrove.train.batches import ModelBatch, micro_batch_model_batch, tree_model_batch

UNITS = ("sample", "episode", "group")


class SampleDataset(IterableDataset):
    """Samples of Parquet files (`callgrove.batch.write_samples`), one by one or grouped per
    episode or group; DataLoader workers split the files between them."""

    def __init__(self, paths: Sequence[str | Path], unit: str = "sample"):
        if unit not in UNITS:
            raise InvalidValue(f"unit must be one of {UNITS}, not {unit!r}")
        self.paths = [Path(p) for p in paths]
        self.unit = unit

    def __iter__(self) -> Iterator[Sample | list[Sample]]:
        worker = get_worker_info()
        paths = self.paths if worker is None else self.paths[worker.id :: worker.num_workers]
        for path in paths:
            samples = _read_samples(path)
            if self.unit == "sample":
                yield from samples
            else:
                yield from _runs(samples, self.unit)


def _read_samples(path: Path) -> Iterator[Sample]:
    parquet = pq.ParquetFile(path)
    for record_batch in parquet.iter_batches():
        table = pa.Table.from_batches([record_batch]).cast(SAMPLE_SCHEMA)
        yield from samples_from_table(table)


def _runs(samples: Iterator[Sample], unit: str) -> Iterator[list[Sample]]:
    """Consecutive samples with the same episode (or group; no group: its episode)."""
    run: list[Sample] = []
    run_key = None
    for sample in samples:
        key = sample.episode if unit == "episode" else (sample.group or sample.episode)
        if run and key != run_key:
            yield run
            run = []
        run.append(sample)
        run_key = key
    if run:
        yield run


def _flatten(items: Sequence[Sample | list[Sample]]) -> list[Sample]:
    return [s for item in items for s in (item if isinstance(item, list) else [item])]


class TreeCollate:
    """Collates dataset items into one tree-packed `ModelBatch` (default: a trie per group)."""

    def __init__(self, settings: TreeSettings | None = None):
        self.settings = settings or TreeSettings()

    def __call__(self, items: Sequence[Sample | list[Sample]]) -> ModelBatch:
        return tree_model_batch(pack_samples(_flatten(items), self.settings))


class PackedCollate:
    """Collates dataset items into varlen micro-batches (`callgrove.batch.pack`), one
    `ModelBatch` each, for this process's rank."""

    def __init__(self, settings: PackSettings, rank: int = 0):
        self.settings = settings
        self.rank = rank

    def __call__(self, items: Sequence[Sample | list[Sample]]) -> list[ModelBatch]:
        packed = pack(_flatten(items), self.settings)
        return [micro_batch_model_batch(mb) for mb in packed.ranks[self.rank] if mb.num_tokens]
