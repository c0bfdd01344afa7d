"""Hand-made shapes, one test each: what the forest and the rows must be."""

from __future__ import annotations

import numpy as np

from callgrove.rows import RowSettings, build_rows, check_rows

from .builder import EpisodeBuilder, ids
from .reference import reference_parents


def rows_of(episode, **settings):
    result = build_rows(episode, RowSettings(**settings))
    summary = check_rows(result)
    assert summary.ok, [str(v) for v in summary.violations]
    parents = {
        c.id: (p.id if (p := result.forest.parent_of(c)) else None) for c in result.forest.calls
    }
    assert parents == reference_parents(episode)
    return result


def table(result):
    return [
        (r.leaf.id, ids(r.path), ids(r.trains), ids(r.context), r.duplicate_of) for r in result.rows
    ]


def test_single_agent_without_subagents_is_one_row():
    b = EpisodeBuilder()
    leader = b.agent("L")
    c1 = b.call(leader)
    c2 = b.call(leader, c1)
    b.call(leader, c2)
    result = rows_of(b.episode())
    assert table(result) == [("C3", ["C1", "C2", "C3"], ["C1", "C2", "C3"], [], None)]


def test_compaction_without_subagents_gives_one_row_per_tree():
    b = EpisodeBuilder()
    leader = b.agent("L")
    c1 = b.call(leader)
    c2 = b.call(leader, c1)
    b.call(leader, c2, purpose="compaction")
    c4 = b.call(leader, None)  # starts from the summary: a new root
    c5 = b.call(leader, c4)
    b.call(leader, c5, purpose="compaction")
    c7 = b.call(leader, None)
    b.call(leader, c7)
    result = rows_of(b.episode())
    assert [r.path[0].id for r in result.rows] == ["C1", "C4", "C7"]
    assert table(result) == [
        ("C3", ["C1", "C2", "C3"], ["C1", "C2", "C3"], [], None),
        ("C6", ["C4", "C5", "C6"], ["C4", "C5", "C6"], [], None),
        ("C8", ["C7", "C8"], ["C7", "C8"], [], None),
    ]


def test_fork_of_a_fork_trains_each_call_in_its_own_agents_row():
    b = EpisodeBuilder()
    leader = b.agent("L")
    fork = b.agent("F", parent="L", start="fork")
    fork2 = b.agent("G", parent="F", start="fork")
    c1 = b.call(leader)
    c2 = b.call(fork, c1)  # F resends L's history
    c3 = b.call(fork2, c2)  # G resends F's history
    b.call(fork2, c3)
    b.call(fork, c2)
    b.call(leader, c1)
    result = rows_of(b.episode())
    assert table(result) == [
        ("C4", ["C1", "C2", "C3", "C4"], ["C3", "C4"], ["C1", "C2"], None),
        ("C5", ["C1", "C2", "C5"], ["C2", "C5"], ["C1"], None),
        ("C6", ["C1", "C6"], ["C1", "C6"], [], None),
    ]


def test_compaction_inside_a_fork():
    b = EpisodeBuilder()
    leader = b.agent("L")
    fork = b.agent("F", parent="L", start="fork")
    c1 = b.call(leader)
    c2 = b.call(fork, c1)
    c3 = b.call(fork, c2, purpose="compaction")
    c4 = b.call(fork, None)  # the fork goes on from its summary
    b.call(fork, c4)
    b.call(leader, c1)
    result = rows_of(b.episode())
    assert c3.purpose == "compaction"
    assert table(result) == [
        ("C3", ["C1", "C2", "C3"], ["C2", "C3"], ["C1"], None),
        ("C5", ["C4", "C5"], ["C4", "C5"], [], None),
        ("C6", ["C1", "C6"], ["C1", "C6"], [], None),
    ]


def test_background_subagent_with_no_parent_link_still_trains():
    b = EpisodeBuilder()
    leader = b.agent("L")
    background = b.agent("B", parent=None, start="background")
    c1 = b.call(leader)
    c2 = b.call(background)
    b.call(leader, c1)
    b.call(background, c2)
    result = rows_of(b.episode())
    assert table(result) == [
        ("C3", ["C1", "C3"], ["C1", "C3"], [], None),
        ("C4", ["C2", "C4"], ["C2", "C4"], [], None),
    ]


def test_calls_listed_out_of_ledger_order_and_interleaved():
    b = EpisodeBuilder()
    leader = b.agent("L")
    helper = b.agent("A", parent="L", start="fresh")
    c1 = b.call(leader, seq=1)
    a1 = b.call(helper, seq=2)
    c2 = b.call(leader, c1, seq=3)
    b.call(helper, a1, seq=4)
    b.call(leader, c2, seq=5)
    leader.calls.reverse()  # the agents list their calls in any order; seq is the ledger
    helper.calls.reverse()
    b.agents.reverse()
    result = rows_of(b.episode())
    assert ids(result.forest.calls) == ["C1", "C2", "C3", "C4", "C5"]
    assert table(result) == [
        ("C4", ["C2", "C4"], ["C2", "C4"], [], None),
        ("C5", ["C1", "C3", "C5"], ["C1", "C3", "C5"], [], None),
    ]


def test_non_kept_retry_stays_out_of_the_forest():
    b = EpisodeBuilder()
    leader = b.agent("L")
    c1 = b.call(leader)
    b.call(leader, c1, kept=False)  # a retry nobody kept
    b.call(leader, c1)
    result = rows_of(b.episode())
    assert ids(result.forest.calls) == ["C1", "C3"]
    assert table(result) == [("C3", ["C1", "C3"], ["C1", "C3"], [], None)]


def test_fork_whose_first_call_is_not_an_exact_copy_becomes_a_root():
    b = EpisodeBuilder()
    leader = b.agent("L")
    fork = b.agent("F", parent="L", start="fork")
    c1 = b.call(leader)
    history = b.full_ids(c1).tolist()
    history[1] += 7  # the harness re-rendered one token of the leader's history
    c2 = b.call(fork, history)
    b.call(leader, c1)
    result = rows_of(b.episode())
    assert result.forest.parent_of(c2) is None
    assert table(result) == [
        ("C2", ["C2"], ["C2"], [], None),
        ("C3", ["C1", "C3"], ["C1", "C3"], [], None),
    ]


def test_twin_subagents_resolve_parents_within_each_agent_and_one_row_is_a_duplicate():
    b = EpisodeBuilder()
    leader = b.agent("L")
    twin_a = b.agent("A", parent="L", start="fresh")
    twin_b = b.agent("B", parent="L", start="fresh")
    task, first, second = b.fresh(), b.fresh(2), b.fresh(2)
    a1 = b.call(twin_a, None, task, first)
    b1 = b.call(twin_b, None, task, first)
    answer, follow = b.fresh(), b.fresh(2)
    b.call(twin_a, a1, answer, second)
    b.call(twin_b, b1, answer, second)
    b.call(leader, None, follow)
    result = rows_of(b.episode())
    # B's second call resends tokens that A's first call also has; its own agent's call wins.
    assert result.forest.parent_of(twin_b.calls[1]) is b1
    assert result.forest.parent_of(twin_a.calls[1]) is a1
    assert table(result) == [
        ("C3", ["C1", "C3"], ["C1", "C3"], [], None),
        ("C4", ["C2", "C4"], ["C2", "C4"], [], 0),
        ("C5", ["C5"], ["C5"], [], None),
    ]
    assert not result.loss_mask(result.rows[1]).any()
    assert np.array_equal(result.token_ids(result.rows[0]), result.token_ids(result.rows[1]))
    relaxed = rows_of(b.episode(), max_identical_trained=2)
    assert [r.duplicate_of for r in relaxed.rows] == [None, None, None]


def test_untrainable_agent_is_owned_but_carries_no_loss():
    b = EpisodeBuilder()
    leader = b.agent("L")
    judge = b.agent("J", parent="L", start="fresh", trainable=False)
    c1 = b.call(leader)
    j1 = b.call(judge)
    b.call(leader, c1)
    b.call(judge, j1)
    result = rows_of(b.episode())
    judge_row = result.rows[1]
    assert ids(judge_row.trains) == ["C2", "C4"]
    assert result.num_loss_tokens(judge_row) == 0 and not result.loss_mask(judge_row).any()
    assert (
        check_rows(result).line()
        == "4 kept calls, each trained exactly once (2 of untrainable agents, no loss)"
    )


def test_agent_rewards_replace_the_episode_reward_on_its_rows():
    b = EpisodeBuilder()
    leader = b.agent("L")
    solver = b.agent("S", parent="L", start="fresh", rewards={"solved": 0.25, "format": 0.5})
    b.call(leader)
    b.call(solver)
    result = rows_of(b.episode(rewards={"a": 1.0, "b": 2.0}))
    assert [r.reward for r in result.rows] == [3.0, 0.75]


def test_tie_between_agents_prefers_the_agent_named_as_parent_then_highest_seq():
    b = EpisodeBuilder()
    leader = b.agent("L")
    other = b.agent("O")
    fork = b.agent("F", parent="L", start="fork")
    shared_prompt, shared_completion = b.fresh(), b.fresh(2)
    b.call(other, None, shared_prompt, shared_completion)  # C1: same tokens as C2
    c2 = b.call(leader, None, shared_prompt, shared_completion)
    b.call(other, None, shared_prompt, shared_completion)  # C3: same tokens again, higher seq
    c4 = b.call(fork, c2)
    result = rows_of(b.episode())
    assert result.forest.parent_of(c4) is c2  # F's parent agent L wins over O's later twin


def test_full_prompts_read_from_a_file_share_their_history_in_memory(tmp_path):
    import orjson

    from callgrove.episode import load

    b = EpisodeBuilder()
    leader = b.agent("L")
    call = b.call(leader, None, b.fresh(100), b.fresh(10))
    for _ in range(20):
        call = b.call(leader, call, b.fresh(5), b.fresh(10))
    episode = b.episode()
    wire = {
        "format": "callgrove.episode/1",
        "id": "full",
        **{"group": None, "env": None, "task": None, "run": None},
        **{"ok": True, "errors": [], "rewards": {"solved": 1.0}},
        "agents": [
            {
                "id": "L",
                "name": "leader",
                **{"parent": None, "start": "root", "trainable": True},
                "calls": [
                    {
                        "id": c.id,
                        "seq": c.seq,
                        "prompt_ids": episode.prompt_ids(c).tolist(),
                        "completion_ids": c.completion_ids.tolist(),
                        "logprobs": None,
                        "policy_version": None,
                        "purpose": "turn",
                    }
                    for c in leader.calls
                ],
            }
        ],
    }
    path = tmp_path / "full.jsonl"
    path.write_bytes(orjson.dumps(wire) + b"\n")
    (again,) = list(load(path))
    held = sum(len(c.prompt_suffix) + len(c.completion_ids) for c in again.calls())
    assert held == 100 + 20 * 5 + 21 * 10  # each distinct token held once
    for before, after in zip(episode.calls(), again.calls(), strict=True):
        assert np.array_equal(episode.prompt_ids(before), again.prompt_ids(after))
    assert [r.leaf.id for r in rows_of(again).rows] == ["C21"]
