"""Episodes are plain values: deep copies, pickles (what Ray sends between processes) and
filtered episodes hold the same tokens and read and write like the original; reprs stay short."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import msgspec
import numpy as np
import pytest

import callgrove as cg
from callgrove.episode.record import share_histories

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def login_bug() -> cg.Episode:
    (episode,) = cg.load(EXAMPLES / "login_bug.jsonl")
    return episode


def long_chain(calls: int = 3000) -> cg.Episode:
    leader = cg.Agent("L", "leader")
    prompt = [1, 2, 3]
    for seq in range(calls):
        leader.add(cg.Call.make(f"C{seq}", seq, prompt, [5], [-0.1]))
        prompt = [*prompt, 5, 6]
    episode = cg.Episode("chain", [leader])
    share_histories(episode.agents)  # each prompt held as a reference to the call before
    assert episode.call("C2999").prompt_from == "C2998"
    return episode


def dense_ledger(episode: cg.Episode) -> None:
    """Every call holds its place in seq order, every agent its place in the episode."""
    ordered = sorted(episode.calls(), key=lambda c: c.seq)
    assert [c.index for c in ordered] == list(range(len(ordered)))
    assert [a.index for a in episode.agents] == list(range(len(episode.agents)))
    for agent in episode.agents:
        assert all(episode.agent_of(call) is agent for call in agent.calls)


def same_record(a: cg.Episode, b: cg.Episode) -> None:
    dense_ledger(b)
    assert cg.episode.encode_episode(a) == cg.episode.encode_episode(b)
    assert [a.full_ids(c).tolist() for c in a.calls()] == [
        b.full_ids(c).tolist() for c in b.calls()
    ]
    for call in b.calls():
        base = b.base_of(call)
        assert base is None or any(base is c for c in b.calls())
        # a call holds no other record: its prompt base is a call id, its agent an index
        assert not any(
            isinstance(value, (cg.Call, cg.Agent, cg.Episode))
            for value in msgspec.structs.astuple(call)
        )


def rows_of(episode: cg.Episode) -> list[tuple[list[str], list[str]]]:
    return [([c.id for c in r.path], [c.id for c in r.trains]) for r in cg.build_rows(episode).rows]


def test_a_deep_copy_is_independent_and_equal():
    original = login_bug()
    copied = copy.deepcopy(original)
    same_record(original, copied)
    assert rows_of(copied) == rows_of(original)
    copied.call("C2").completion_ids[0] = 999
    assert original.call("C2").completion_ids[0] != 999


def test_a_pickle_round_trip_keeps_the_record_and_its_rows():
    original = login_bug()
    cg.finalize_group(cg.GRPO(scope="episode"), [original])
    back = pickle.loads(pickle.dumps(original))
    same_record(original, back)
    assert rows_of(back) == rows_of(original)


@pytest.mark.slow
def test_long_prompt_chains_copy_and_pickle_without_recursion():
    chain = long_chain()
    for copied in (copy.deepcopy(chain), pickle.loads(pickle.dumps(chain))):
        last = copied.call("C2999")
        assert copied.full_ids(last).tolist() == chain.full_ids(chain.call("C2999")).tolist()
    assert len(repr(chain)) < 200
    assert len(repr(chain.call("C2999"))) < 200


def test_filtering_keeps_tokens_and_leaves_the_original_alone(tmp_path: Path):
    original = login_bug()
    before = cg.episode.encode_episode(original)
    # drop C1: the calls that referenced it hold their prompts by their own tokens
    without = original.filter(lambda call: call.id != "C1")
    assert cg.episode.encode_episode(original) == before
    assert [c.id for c in without.calls()] == [c.id for c in original.calls() if c.id != "C1"]
    for call in without.calls():
        assert np.array_equal(without.full_ids(call), original.full_ids(original.call(call.id)))
    cg.save(tmp_path / "filtered.jsonl", [without])
    (back,) = cg.load(tmp_path / "filtered.jsonl")
    same_record(without, back)
    assert cg.check_rows(cg.build_rows(back)).ok


def test_calls_are_numbered_in_ledger_order_and_renumbered_on_demand():
    episode = login_bug()
    dense_ledger(episode)
    assert [c.id for c in episode.ledger()] == [f"C{n}" for n in range(1, 13)]
    late = episode.agents[1].add(cg.Call.make("C0", 0, [1], [2]))  # the earliest seq of all
    assert late.index == -1  # not numbered until the ledger is rebuilt
    assert episode.agent_of(late) is episode.agents[1]  # its agent's place is known at once
    stray = cg.Call.make("X", 99, [1], [2])
    try:
        episode.agent_of(stray)
    except ValueError as error:
        assert "call X has no agent here" in str(error)
    else:
        raise AssertionError("a call of no agent was given one")
    assert episode.ledger()[0] is late
    dense_ledger(episode)
    forest = cg.build_forest(episode)
    other = login_bug()
    try:
        forest.index_of(other.call("C3"))  # the same place in another episode is not this call
    except ValueError as error:
        assert "C3 is not in this pool's ledger" in str(error)
    else:
        raise AssertionError("a call of another episode was found in this forest")


def test_filtering_by_agent_keeps_every_agent_in_place():
    original = login_bug()
    leader_only = original.filter(lambda call: original.agent_of(call).id == "L")
    assert [a.id for a in leader_only.agents] == [a.id for a in original.agents]
    assert [len(a.calls) for a in leader_only.agents] == [6, 0, 0, 0]
    dense_ledger(leader_only)
    dense_ledger(original)  # the original keeps its own numbering


def test_reprs_are_short_and_say_what_matters():
    episode = login_bug()
    assert repr(episode) == (
        "Episode('login-bug-0001', group='grp-login', ok=True, agents=4, calls=12, reward=1)"
    )
    assert repr(episode.call("C9")) == (
        "Call('C9', seq=9, prompt=61 (C8[:57] + 4), completion=1, policy_version=3)"
    )
    assert repr(episode.agents[0]) == "Agent('L', 'leader', start='root', calls=6)"
    assert len(episode.summary().splitlines()) == 1 + len(episode.agents)
    row = cg.build_rows(episode).rows[2]
    assert repr(row).startswith("Row(episode='login-bug-0001', index=2, path=['C1', 'C3'")


def test_a_prompt_reference_is_a_call_id_that_the_episode_resolves():
    episode = login_bug()
    c9 = episode.call("C9")
    assert (c9.prompt_from, c9.prompt_from_len) == ("C8", 57)
    assert episode.base_of(c9) is episode.call("C8")
    assert episode.full_ids(c9)[:57].tolist() == episode.full_ids(episode.call("C8")).tolist()
    c9.prompt_from = "C99"  # no call of the episode
    where = "episode login-bug-0001, call C9: prompt_from names 'C99', which is not an earlier call"
    with pytest.raises(cg.InputError, match=where):
        episode.full_ids(c9)
    with pytest.raises(ValueError, match="call C9: prompt_from names 'C99'"):
        cg.build_forest(episode)
    with pytest.raises(cg.InputError, match=where):
        cg.save(Path("/nonexistent-never-written.jsonl"), [episode])
    c9.prompt_from = "C12"  # a later call: not a base either
    with pytest.raises(cg.InputError, match="prompt_from names 'C12', which is not an earlier"):
        episode.prompt_ids(c9)
