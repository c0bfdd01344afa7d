"""Brute-force statements of docs/episode-format.md sections 2 and 3, quadratic on purpose, for comparison."""

from __future__ import annotations

import numpy as np

from callgrove.episode import Agent, Call, Episode


def agent_by_call(episode: Episode) -> dict[str, Agent]:
    return {call.id: agent for agent in episode.agents for call in agent.calls}


def reference_parents(episode: Episode) -> dict[str, str | None]:
    kept = [c for c in episode.calls() if c.kept]
    agent_of = agent_by_call(episode)
    parents: dict[str, str | None] = {}
    for call in kept:
        prompt = episode.prompt_ids(call)
        prefixes = [
            p
            for p in kept
            if p.seq < call.seq
            and p.full_len <= len(prompt)
            and np.array_equal(episode.full_ids(p), prompt[: p.full_len])
        ]
        if not prefixes:
            parents[call.id] = None
            continue
        longest = max(p.full_len for p in prefixes)
        tied = [p for p in prefixes if p.full_len == longest]
        own = [p for p in tied if agent_of[p.id] is agent_of[call.id]]
        named = [p for p in tied if agent_of[p.id].id == agent_of[call.id].parent]
        parents[call.id] = max(own or named or tied, key=lambda p: p.seq).id
    return parents


def reference_leaves_and_paths(episode: Episode) -> tuple[list[Call], list[list[str]]]:
    """Kept leaves in `seq` order and each one's walk, root first (call ids), brute force."""
    parents = reference_parents(episode)
    kept = [c for c in episode.calls() if c.kept]
    has_child = {p for p in parents.values() if p is not None}
    leaves = sorted((c for c in kept if c.id not in has_child), key=lambda c: c.seq)
    paths = []
    for leaf in leaves:
        path = [leaf.id]
        while parents[path[-1]] is not None:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return leaves, paths


def reference_rows(episode: Episode, max_identical: int = 1) -> list[dict]:
    """Rows as dicts: leaf, path, trains, context, duplicate_of, tokens, mask."""
    agent_of = agent_by_call(episode)
    kept = {c.id: c for c in episode.calls() if c.kept}
    leaves, paths = reference_leaves_and_paths(episode)
    owner: dict[str, int] = {}
    for call in kept.values():
        holders = [i for i, path in enumerate(paths) if call.id in path]
        own = [i for i in holders if agent_of[leaves[i].id] is agent_of[call.id]]
        owner[call.id] = min(own or holders, key=lambda i: leaves[i].seq)
    rows = []
    for i, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
        tokens = episode.full_ids(leaf)
        earlier = [
            r for r in rows if r["duplicate_of"] is None and np.array_equal(r["tokens"], tokens)
        ]
        duplicate_of = earlier[0]["row"] if len(earlier) >= max_identical else None
        trains = [c for c in path if owner[c] == i]
        mask = np.zeros(len(tokens), dtype=np.uint8)
        if duplicate_of is None:
            for call_id in trains:
                call: Call = kept[call_id]
                if agent_of[call_id].trainable:
                    mask[call.prompt_len : call.full_len] = 1
        rows.append(
            {
                "row": i,
                "leaf": leaf.id,
                "path": path,
                "trains": trains,
                "context": [c for c in path if owner[c] != i],
                "duplicate_of": duplicate_of,
                "tokens": tokens,
                "mask": mask,
            }
        )
    return rows
