"""Readers and writers: the wire form of the episode contract and the bytes around it."""

from callgrove.formats.jsonl import (
    JsonlWriter,
    decode_episode_line,
    encode_wire_episode,
    iter_lines,
    open_binary,
    read_rows,
    read_wire_episodes,
    report,
)
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireAgent, WireCall, WireEpisode

__all__ = [
    "FORMAT",
    "Diagnostics",
    "InputError",
    "JsonlWriter",
    "Problem",
    "WireAgent",
    "WireCall",
    "WireEpisode",
    "decode_episode_line",
    "encode_wire_episode",
    "iter_lines",
    "open_binary",
    "read_rows",
    "read_wire_episodes",
    "report",
]
