"""Trainer batches: one sample per row, packed into varlen micro-batches across ranks."""

from callgrove.batch.packing import (
    MicroBatch,
    Overlong,
    PackedBatch,
    PackSettings,
    Truncation,
    pack,
)
from callgrove.batch.samples import (
    NO_TOP_K,
    NO_VERSION,
    SAMPLE_SCHEMA,
    TOKEN_FIELDS,
    Sample,
    arrays_to_torch,
    build_samples,
    fill_unknown_sampling,
    read_samples,
    sample_from_row,
    samples_from_table,
    samples_to_table,
    write_samples,
)

__all__ = [
    "NO_TOP_K",
    "NO_VERSION",
    "SAMPLE_SCHEMA",
    "TOKEN_FIELDS",
    "MicroBatch",
    "Overlong",
    "PackSettings",
    "PackedBatch",
    "Sample",
    "Truncation",
    "arrays_to_torch",
    "build_samples",
    "fill_unknown_sampling",
    "pack",
    "read_samples",
    "sample_from_row",
    "samples_from_table",
    "samples_to_table",
    "write_samples",
]
