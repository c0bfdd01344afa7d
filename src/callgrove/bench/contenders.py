"""What callgrove is measured against, on the same episodes in the same run.

- verifiers 0.4.0: its `read_episodes` over a `traces.jsonl` (written by callgrove's verifiers
  exporter: a trace per agent, a fork's trace holding its inherited history as a root node),
  a group-relative advantage on every sampled node, then its `Branch` views (token ids, sampled
  mask, logprobs, advantages) of every trainable branch;
- NeMo Gym 0.7.0: its capture records (`TokenEntry`, full prompts, one file per rollout)
  parsed by its own model, chained by its `prefix_merging` builder and every chain projected
  by `project_chain_to_output_items` (Gym itself delivers only the main chain; every chain is
  projected here so the same calls are linearised);
- the numpy floor: the rows' arrays built by four `numpy.concatenate` calls, with the forest
  given and every piece already in memory: what no implementation can beat.

Both packages are optional (the `interop` install); a contender whose package is missing is
reported as such, never silently skipped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from callgrove.episode import Episode
from callgrove.interop.formats import TRACES_FILE
from callgrove.interop.verifiers import write_verifiers
from callgrove.rows import EpisodeRows


def verifiers_available() -> str | None:
    """None when verifiers 0.4.0 imports, else why not."""
    try:
        import verifiers  # noqa: F401
        from verifiers.v1.utils.trace_store import read_episodes  # noqa: F401
    except ImportError as error:  # an optional extra
        return f"verifiers is not installed ({error})"
    return None


def gym_available() -> str | None:
    """None when NeMo Gym's capture builder imports, else why not."""
    try:
        from nemo_gym.token_id_capture.builder import prefix_merging  # noqa: F401
    except ImportError as error:  # an optional extra
        return f"nemo-gym is not installed ({error})"
    return None


def write_verifiers_run(folder: Path, episodes: Sequence[Episode]) -> Path:
    """A verifiers results folder holding the episodes as its `traces.jsonl`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_verifiers(folder / TRACES_FILE, episodes)
    return folder


def verifiers_samples(folder: Path) -> Callable[[], int]:
    """verifiers' own path from its file to trainer samples; the action returns the samples."""
    from verifiers.v1.configs.agent import WireAgentConfig
    from verifiers.v1.state import State
    from verifiers.v1.task import WireTaskData
    from verifiers.v1.trace import Trace
    from verifiers.v1.utils.trace_store import read_episodes

    trace_type = Trace[WireTaskData, State, WireAgentConfig]

    def run() -> int:
        episodes = read_episodes(folder, trace_type)
        _credit_verifiers_nodes(episodes)
        samples = 0
        for episode in episodes:
            for trace in episode.traces:
                for branch in trace.branches:
                    if branch.trainable:
                        _ = branch.token_ids, branch.sampled_mask
                        _ = branch.logprobs, branch.advantages
                        samples += 1
        return samples

    return run


def _credit_verifiers_nodes(episodes: Sequence[Any]) -> None:
    """Group-relative advantages (reward minus the group's mean) on every sampled node."""
    groups: dict[str, list[tuple[Any, float]]] = defaultdict(list)
    for episode in episodes:
        for trace in episode.traces:
            reward = sum(r.score for r in trace.rewards.values() if r.score is not None)
            groups[episode.group.id if episode.group else episode.id].append((trace, reward))
    for members in groups.values():
        mean = sum(reward for _, reward in members) / len(members)
        for trace, reward in members:
            for node in trace.nodes:
                if node.sampled:
                    node.advantages = [reward - mean] * sum(node.mask)


def write_gym_captures(folder: Path, episodes: Sequence[Episode]) -> Path:
    """Each episode's kept calls as a Gym capture file of `TokenEntry` records (full prompts)."""
    folder.mkdir(parents=True, exist_ok=True)
    for episode in episodes:
        with (folder / f"{episode.id}.tokens.jsonl").open("wb") as out:
            for call in sorted(episode.calls(), key=lambda c: c.seq):
                if not call.kept:
                    continue
                entry = {
                    "schema_version": 1,
                    "rollout_id": episode.id,
                    "model_call_id": call.id,
                    "prompt_token_ids": episode.prompt_ids(call),
                    "generation_token_ids": call.completion_ids,
                    "generation_log_probs": call.logprobs,
                    "created_at": float(call.seq),
                }
                out.write(orjson.dumps(entry, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return folder


def gym_samples(folder: Path) -> Callable[[], int]:
    """NeMo Gym's own path from its capture files to linearised token sequences."""
    from nemo_gym.token_id_capture.builder import prefix_merging, project_chain_to_output_items
    from nemo_gym.token_id_capture.records import TokenEntry

    files = sorted(folder.glob("*.tokens.jsonl"))

    def run() -> int:
        chains = 0
        for path in files:
            with path.open("rb") as lines:
                entries = [TokenEntry.model_validate_json(line) for line in lines]
            for chain in prefix_merging(entries).chains:
                project_chain_to_output_items(chain)
                chains += 1
        return chains

    return run


@dataclass
class FloorPieces:
    """Every row's arrays in pieces, laid out ahead: the work left is concatenation alone."""

    tokens: list[np.ndarray]
    masks: list[np.ndarray]
    logprobs: list[np.ndarray]
    advantages: list[np.ndarray]


def floor_pieces(episode_rows: Sequence[EpisodeRows]) -> FloorPieces:
    """The pieces of every row of every episode (the forest given, credit on the calls)."""
    pieces = FloorPieces([], [], [], [])
    longest = max(c.full_len for er in episode_rows for c in er.forest.calls)
    zeros, ones = np.zeros(longest, np.uint8), np.ones(longest, np.uint8)
    zero_values = np.zeros(longest, np.float32)
    for er in episode_rows:
        for row in er.rows:
            # a duplicate row trains nothing (its twin does)
            trains = {c.index for c in row.trains} if row.duplicate_of is None else set()
            start = 0
            for call in row.path:
                prompt = er.episode.segments(call, call.prompt_len, start)
                prompt_len = call.prompt_len - start
                completion = len(call.completion_ids)
                trained = call.index in trains
                pieces.tokens += [*prompt, call.completion_ids]
                pieces.masks += [zeros[:prompt_len], (ones if trained else zeros)[:completion]]
                pieces.logprobs += [
                    zero_values[:prompt_len],
                    np.asarray(call.logprobs, np.float32),
                ]
                credit = 0.0 if call.advantages is None else call.advantages
                advantage = np.broadcast_to(np.asarray(credit, np.float32), (completion,))
                pieces.advantages += [zero_values[:prompt_len], advantage]
                start = call.full_len
    return pieces


def floor_samples(pieces: FloorPieces) -> Callable[[], int]:
    def run() -> int:
        tokens = np.concatenate(pieces.tokens)
        np.concatenate(pieces.masks)
        np.concatenate(pieces.logprobs)
        np.concatenate(pieces.advantages)
        return len(tokens)

    return run
