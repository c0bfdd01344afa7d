"""The binary episode form: the same records as Parquet or Arrow IPC, one row per episode.

`schema` is the layout, `writer` and `reader` move episodes in and out a record batch at a
time; the rules every episode must keep are `episode.checks`, shared with the JSON form.
"""

from callgrove.episode.binary.reader import read_binary_episodes
from callgrove.episode.binary.schema import BINARY_SUFFIXES, SCHEMA, is_binary
from callgrove.episode.binary.writer import BinaryEpisodeWriter, write_binary_episodes

__all__ = [
    "BINARY_SUFFIXES",
    "SCHEMA",
    "BinaryEpisodeWriter",
    "is_binary",
    "read_binary_episodes",
    "write_binary_episodes",
]
