"""Episodes the picture tests draw: the login_bug example, and one with every unusual mark."""

from __future__ import annotations

from pathlib import Path

from callgrove.episode import Agent, Call, Episode, Gap, Spawn, load
from callgrove.rows import EpisodeRows, build_rows

EXAMPLES = Path(__file__).parents[2] / "examples"
LOGIN_BUG = EXAMPLES / "login_bug.jsonl"
LOGIN_GROUP = EXAMPLES / "login_group.jsonl"
# Text that would end a <script> element early if the page did not escape it.
HOSTILE_TEXT = "done </script><script>document.title='broken'</script> & <b>bold</b>"


def login_bug() -> EpisodeRows:
    [episode] = load(LOGIN_BUG)
    return build_rows(episode)


def unusual_episode() -> Episode:
    """A known spawning call, an unrecorded start (a gap), a retry, a frozen fork, and content.

    S1 (leader) starts W (fresh, its start recorded on S1); S3 continues S1; G's start was
    not recorded; R5 is a retry nobody kept; N, a fork that does not train, continues S3.
    """
    s1 = Call.make("S1", 1, [1, 2, 3], [4, 5], content=HOSTILE_TEXT)
    s2 = Call.make("S2", 2, [7, 8], [9])
    s3 = Call.make("S3", 3, [1, 2, 3, 4, 5, 6], [10, 11], content={"note": "a dict"})
    s4 = Call.make("S4", 4, [20, 21], [22])
    r5 = Call.make("R5", 5, [1, 2, 3, 4, 5, 6, 10, 11, 12], [13], kept=False)
    s6 = Call.make("S6", 6, [1, 2, 3, 4, 5, 6, 10, 11, 14], [15, 16])
    leader = Agent("L", "leader", calls=[s1, s3, r5])
    worker = Agent("W", "worker", parent="L", start="fresh", calls=[s2], spawn=Spawn(call="S1"))
    lost = Agent("G", "ghost", parent=None, start="background", calls=[s4])
    frozen = Agent("N", "frozen", parent="L", start="fork", trainable=False, calls=[s6])
    idle = Agent("Z", "idle", parent="L", start="fresh")
    return Episode(
        "unusual",
        agents=[leader, worker, lost, frozen, idle],
        rewards={"score": 0.5},
        gaps=[Gap(kind="subagent_parent_unavailable", agent="G")],
    )
