"""Compactions their agent went on without: a summary sampled, then dropped.

A harness can sample a compaction and then discard it (the model called a tool where text was
asked, or its summary was refused) and go on with the history it meant to summarise. Asked
again with the same prompt, the gateway's retry rule already keeps only the last attempt; when
the agent instead continues the old history, the tokens say so: a later call of the same agent
extends the history the compaction continued (its parent), without passing through the
compaction. Nobody read that summary, so it is an abandoned attempt (`kept: false`).
"""

from __future__ import annotations

from callgrove.episode import Call, Episode
from callgrove.forest.build import build_forest


def abandoned_compactions(episode: Episode) -> list[Call]:
    """The kept compaction calls of `episode` whose agent later made a call continuing the
    history the compaction continued, not the compaction itself."""
    if not any(_followed_by_own_call(agent.calls) for agent in episode.agents):
        return []  # no forest to build: nothing came after any compaction of its own agent
    forest = build_forest(episode)
    found = []
    for index, call in enumerate(forest.calls):
        history = forest.parent[index]
        if call.purpose != "compaction" or history < 0:
            continue
        later_own = (
            other
            for other in range(index + 1, len(forest.calls))
            if forest.calls[other].agent_index == call.agent_index
        )
        if any(_below(forest.parent, other, history, index) for other in later_own):
            found.append(call)
    return found


def _followed_by_own_call(calls: list[Call]) -> bool:
    compactions = [c.seq for c in calls if c.kept and c.purpose == "compaction"]
    return bool(compactions) and any(c.kept and c.seq > min(compactions) for c in calls)


def _below(parent: list[int], call: int, history: int, compaction: int) -> bool:
    """Whether `call`'s walk to its root passes `history` without passing `compaction`."""
    while call >= 0:
        if call == compaction:
            return False
        if call == history:
            return True
        call = parent[call]
    return False
