"""Row schemes: which leaves make rows and which calls each row trains.

callgrove trains every kept call of every agent exactly once (`exactly_once`, the default).
The other schemes are what other systems ship, kept as baselines to measure against:

- `leader_only`: rows for the leader's leaves only; only the leader's calls train (a
  reassembler that reads one list of the leader's calls). A leader call that only a
  subagent's leaf continues (a fork's, with no later leader call on it) has no row here.
- `drop_subagents`: the leader's first tree only: no subagent's calls and nothing after the
  leader's first compaction train, and those rows are not made.
- `per_agent`: every agent's conversation as its own sequences: a call trains once in the
  rows of each agent whose leaves continue it, so a history a fork shares with its parent
  trains once for each.
- `first_branch`: exactly once, but a call shared by several rows is trained by the row of the
  lowest-`seq` leaf, whoever's it is (not the row of the call's own agent).

Under `per_agent` and `first_branch` a row credits its branch: every call it trains takes the
advantage of the row's leaf (`BRANCH_CREDIT`); the other schemes credit each call with its
own agent's advantage, wherever it trains.

A scheme maps the forest and the walk of every leaf (root first, leaves in `seq` order) to
what each leaf's row trains: forest indices of calls on its walk, or None for no row.
`RowSettings` then takes out the calls that its two choices keep from training (background
agents' calls, compaction calls).
"""

from __future__ import annotations

from collections.abc import Callable

from callgrove.episode import Episode
from callgrove.forest import Forest

Walks = list[list[int]]
Scheme = Callable[[Forest, Walks], list[list[int] | None]]


def leader_index(episode: Episode) -> int:
    """The root agent's place in `episode.agents` (the first agent started as `root`)."""
    return next((a.index for a in episode.agents if a.start == "root"), 0)


def exactly_once(forest: Forest, walks: Walks) -> list[list[int] | None]:
    """Each call trained once: by the lowest-`seq` leaf of its own agent, else the lowest-`seq`
    leaf (docs/episode-format.md, section 3)."""
    return _first_holder(forest, walks, prefer_own_agent=True)


def first_branch(forest: Forest, walks: Walks) -> list[list[int] | None]:
    """Each call trained once, by the lowest-`seq` leaf whose walk holds it."""
    return _first_holder(forest, walks, prefer_own_agent=False)


def leader_only(forest: Forest, walks: Walks) -> list[list[int] | None]:
    """The leader's leaves' rows, each leader call trained once, by the first of them."""
    return _leader_rows(forest, walks, first_tree_only=False)


def drop_subagents(forest: Forest, walks: Walks) -> list[list[int] | None]:
    """As `leader_only`, within the leader's first tree (before its first compaction)."""
    return _leader_rows(forest, walks, first_tree_only=True)


def per_agent(forest: Forest, walks: Walks) -> list[list[int] | None]:
    """Per agent, each call on its leaves' walks trained once, by the first of them."""
    trained: set[tuple[int, int]] = set()  # (agent of the row, call)
    result: list[list[int] | None] = []
    for walk in walks:
        agent = forest.calls[walk[-1]].agent_index
        mine = [i for i in walk if (agent, i) not in trained]
        trained.update((agent, i) for i in mine)
        result.append(mine)
    return result


def _first_holder(forest: Forest, walks: Walks, prefer_own_agent: bool) -> list[list[int] | None]:
    # Leaves come in ascending `seq`, so the first walk seen holding a call is the lowest.
    any_leaf = [-1] * len(forest.calls)
    own_leaf = [-1] * len(forest.calls)
    for number, walk in enumerate(walks):
        leaf_agent = forest.calls[walk[-1]].agent_index
        for i in walk:
            if any_leaf[i] < 0:
                any_leaf[i] = number
            if own_leaf[i] < 0 and forest.calls[i].agent_index == leaf_agent:
                own_leaf[i] = number
    owner = [
        own if prefer_own_agent and own >= 0 else first
        for own, first in zip(own_leaf, any_leaf, strict=True)
    ]
    return [[i for i in walk if owner[i] == number] for number, walk in enumerate(walks)]


def _leader_rows(forest: Forest, walks: Walks, first_tree_only: bool) -> list[list[int] | None]:
    leader = leader_index(forest.episode)
    leader_calls = [i for i, call in enumerate(forest.calls) if call.agent_index == leader]
    first_tree = forest.tree_of[leader_calls[0]] if leader_calls else -1
    trained: set[int] = set()
    result: list[list[int] | None] = []
    for walk in walks:
        leaf = walk[-1]
        if forest.calls[leaf].agent_index != leader or (
            first_tree_only and forest.tree_of[leaf] != first_tree
        ):
            result.append(None)
            continue
        mine = [i for i in walk if forest.calls[i].agent_index == leader and i not in trained]
        trained.update(mine)
        result.append(mine)
    return result


SCHEMES: dict[str, Scheme] = {
    "exactly_once": exactly_once,
    "leader_only": leader_only,
    "drop_subagents": drop_subagents,
    "per_agent": per_agent,
    "first_branch": first_branch,
}
BACKGROUND_REWARDS = ("own", "episode", "none")
# Schemes whose rows credit a branch: every call a row trains takes the advantage of the row's
# leaf (its agent's), as systems that stamp a branch's advantage on the sample built from it do.
# The others credit each call with its own agent's advantage.
BRANCH_CREDIT = frozenset({"per_agent", "first_branch"})
