"""verifiers 0.4.0 interop, against the real package: its classes build, its writer writes, its
reader and `Branch` views are the reference."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import verifiers.v1 as vf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.episode import Agent, Call, Episode
from callgrove.formats.problems import Diagnostics, InputError
from callgrove.formats.wire import WireEnv, WireError, WirePolicy, WireRun
from callgrove.interop.verifiers import (
    call_id,
    call_nodes,
    read_verifiers,
    set_advantages,
    verifiers_row,
    write_advantages,
    write_verifiers,
)
from callgrove.rows import build_rows

from .helpers import (
    TraceBuilder,
    leader_trace,
    multi_agent_episode,
    read_with_verifiers,
    row_tokens,
    write_with_verifiers,
)


def _completion_mask(row) -> np.ndarray:
    """1 on the completion tokens of every call on the row's path, trained or context."""
    mask = np.zeros(row.num_tokens, dtype=bool)
    for span in row.spans():
        mask[span.prompt_end : span.end] = True
    return mask


def _trained_mask(row) -> np.ndarray:
    mask = np.zeros(row.num_tokens, dtype=bool)
    trains = {id(call) for call in row.trains}
    for span in row.spans():
        if id(span.call) in trains:
            mask[span.prompt_end : span.end] = True
    return mask


def _compare_rows_with_branches(episode: Episode, reference: vf.WireEpisode) -> None:
    """callgrove's rows against verifiers' own branches of the same traces.

    One row per trainable branch, on the same calls, with the same token sequence and the same
    sampled positions: every completion token on a row's path is a sampled token of the branch
    and the other way round. Where the rules differ:
    - verifiers marks a shared node sampled in every branch that holds it, while callgrove trains
      each call in exactly one row (a leaf of its own agent, the lowest seq first) and keeps it
      as context, loss off, in the others;
    - a trace of an untrainable agent keeps its sampled mask in verifiers (its trainer drops it
      by `agent.trainable`), while callgrove's loss mask is 0 on it;
    - a compaction attempt nobody resumed from is an untrainable branch in verifiers and a call
      that is not kept, so no row, in callgrove.
    (Parents decided by tokens across traces are the fourth difference; see the fork test.)
    """
    rows = build_rows(episode)
    by_leaf = {row.leaf.id: row for row in rows.rows}
    trainable_branches = 0
    for t, trace in enumerate(reference.traces):
        agent = episode.agents[t]
        assert (agent.id, agent.name, agent.trainable) == (
            trace.id,
            trace.agent.name,
            trace.agent.trainable,
        )
        call_of = {node: call for call, node in call_nodes(trace, t).items()}
        for leaf, branch in zip(vf.graph.leaves(trace), trace.branches, strict=True):
            row = by_leaf.get(call_of[leaf])
            if not branch.trainable:
                assert row is None
                continue
            trainable_branches += 1
            assert row is not None
            on_path = [call_of[n] for n in _path(trace, leaf) if trace.nodes[n].sampled]
            assert [c.id for c in row.path] == on_path
            assert rows.token_ids(row).tolist() == branch.token_ids
            sampled = np.asarray(branch.sampled_mask, dtype=bool)
            assert np.array_equal(_completion_mask(row), sampled)
            loss = rows.loss_mask(row).astype(bool)
            assert not np.any(loss & ~sampled)
            if agent.trainable and row.duplicate_of is None:
                assert np.array_equal(loss, _trained_mask(row))
            else:
                assert not loss.any()
            logprobs = rows.logprobs(row)
            if logprobs is not None:  # 0 off the loss mask, as docs/episode-format.md section 4
                assert np.allclose(logprobs, np.where(loss, branch.logprobs, 0), atol=1e-4)
    assert len(rows.rows) == trainable_branches
    # exactly once: each kept call's completion is trained in one row, context elsewhere
    owners = [id(call) for row in rows.rows for call in row.trains]
    assert sorted(owners) == sorted(id(c) for c in episode.kept_calls())


def _path(trace: vf.Trace, leaf: int) -> list[int]:
    path: list[int] = []
    node: int | None = leaf
    while node is not None:
        path.append(node)
        node = trace.nodes[node].parent
    return path[::-1]


def test_multi_agent_episode_matches_verifiers_branches(tmp_path: Path) -> None:
    path = write_with_verifiers(tmp_path, [multi_agent_episode(0), multi_agent_episode(1)])
    reference = read_with_verifiers(tmp_path)
    episodes = list(read_verifiers(path))
    assert [e.id for e in episodes] == ["ep-0", "ep-1"]
    for episode, theirs in zip(episodes, reference, strict=True):
        _compare_rows_with_branches(episode, theirs)
        assert episode.run == WireRun(
            id="run-a", type="train", step=6, policy=WirePolicy(start=2, end=4)
        )
        assert episode.group == "grp-17"
        assert episode.env == WireEnv(id="login-bug", name="login")
        assert episode.task["type"] == "LoginBug"
        assert [a.rewards for a in episode.agents] == [
            {"tests_pass": 1.0},
            {"tests_pass": 1.0, "style": 0.5},
            None,
        ]


def test_shared_history_is_trained_once_where_verifiers_marks_it_in_every_branch(
    tmp_path: Path,
) -> None:
    trace, at = leader_trace()
    episode_in = vf.WireEpisode(id="e", task=trace.task, ok=True, traces=[trace])
    [episode] = read_verifiers(write_with_verifiers(tmp_path, [episode_in]))
    rows = build_rows(episode).rows
    fork_row = next(r for r in rows if r.leaf.id == call_id(0, at["F2"]))
    summary_row = next(r for r in rows if r.leaf.id == call_id(0, at["K2"]))
    shared = [call_id(0, at[name]) for name in ("C1", "C2", "C3")]
    # verifiers: C1..C3 are sampled in both branches; callgrove: trained in the fork's row (its
    # leaf has the lower seq, same agent), context only in the summary's row
    assert [c.id for c in fork_row.trains][:3] == shared
    assert [c.id for c in summary_row.context] == shared
    summary = episode.call(call_id(0, at["K2"]))
    discarded = episode.call(call_id(0, at["K1"]))
    assert (summary.purpose, summary.kept) == ("compaction", True)
    assert (discarded.purpose, discarded.kept) == ("compaction", False)
    after = episode.call(call_id(0, at["C5"]))
    assert after.prompt_from is None  # the summary starts a new tree


def test_a_fork_in_another_trace_becomes_a_child_where_verifiers_keeps_two_branches(
    tmp_path: Path,
) -> None:
    leader = TraceBuilder("leader")
    first = leader.sample(leader.prompt(None, [1, 2, 3]), [4, 5])
    fork = TraceBuilder("fork")  # resends the leader's exact tokens, in a trace of its own
    fork.sample(fork.prompt(None, [1, 2, 3, 50, 51, 4, 5, 9]), [10])
    task = leader.trace().task
    episode_in = vf.WireEpisode(id="e", task=task, ok=True, traces=[leader.trace(), fork.trace()])
    [episode] = read_verifiers(write_with_verifiers(tmp_path, [episode_in]))
    rows = build_rows(episode).rows
    # verifiers: two branches (one per trace); callgrove: the fork's call continues the
    # leader's, so one row holds both, the leader's call trained in it
    assert len(rows) == 1
    assert [c.id for c in rows[0].path] == [call_id(0, first), call_id(1, 1)]
    assert [c.id for c in rows[0].trains] == [call_id(0, first), call_id(1, 1)]


@st.composite
def trace_graphs(draw: st.DrawFn) -> list[tuple]:
    """Random message graphs: each step adds a prompt node or a sampled node under any node.

    Every node adds one token no other node has, so a call's whole sequence is a prefix of
    another call's prompt only along the graph: the forest by tokens is verifiers' graph."""
    steps = []
    for index in range(draw(st.integers(1, 12))):
        parent = draw(st.none() | st.integers(0, index - 1)) if index else None
        sampled = draw(st.booleans())
        tokens = [100 + index, *draw(st.lists(st.integers(0, 40), max_size=3))]
        scaffold = draw(st.lists(st.integers(41, 45), max_size=2)) if sampled else []
        steps.append((parent, sampled, scaffold, tokens))
    # a harness commits input messages only with the turn that answers them: every leaf is a
    # sampled node, so every verifiers branch ends on a call
    parents = {parent for parent, *_ in steps}
    for index, (_parent, sampled, _scaffold, _tokens) in enumerate(list(steps)):
        if not sampled and index not in parents:
            steps.append((index, True, [], [100 + len(steps)]))
    return steps


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(graphs=st.lists(trace_graphs(), min_size=1, max_size=3))
def test_random_graphs_match_verifiers_branches(tmp_path: Path, graphs: list[list[tuple]]) -> None:
    traces = []
    for number, steps in enumerate(graphs):
        builder = TraceBuilder(f"agent{number}")
        for parent, sampled, scaffold, tokens in steps:
            # a node's own token is unique within its trace; shift it to be unique across them
            tokens = [tokens[0] + 1000 * number, *tokens[1:]]
            if sampled:
                builder.sample(parent, tokens, scaffold=scaffold)
            else:
                builder.prompt(parent, tokens)
        traces.append(builder.trace())
    episode_in = vf.WireEpisode(id="e", task=traces[0].task, ok=True, traces=traces)
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    [episode] = read_verifiers(write_with_verifiers(folder, [episode_in]))
    [reference] = read_with_verifiers(folder)
    _compare_rows_with_branches(episode, reference)
    kept = sum(node.sampled for trace in reference.traces for node in trace.nodes)
    assert len(list(episode.calls())) == kept


def test_bare_trace_rows_that_verifiers_no_longer_reads(tmp_path: Path) -> None:
    """A 0.2 `traces.jsonl` row: one bare trace, rewards as plain numbers, the run on the trace."""
    row = {
        "id": "old-1",
        "task": {"type": "LoginBug", "data": {"prompt": "fix it"}},
        "version": 2,
        "run": {"type": "train", "id": "run-0", "step": 3},
        "agent": {"model": "m"},
        "nodes": [
            {
                "message": {"role": "user", "content": "u"},
                "token_ids": [1, 2],
                "mask": [False, False],
            },
            {
                "parent": 0,
                "message": {"role": "assistant", "content": "a"},
                "sampled": True,
                "token_ids": [50, 7, 8],
                "mask": [False, True, True],
                "logprobs": [-0.5, -0.25],
            },
        ],
        "rewards": {"correct": 1.0},
        "is_completed": True,
        "errors": [],
    }
    (tmp_path / "traces.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises((KeyError, ValueError)):  # verifiers 0.4.0's own reader refuses it
        read_with_verifiers(tmp_path)
    [episode] = read_verifiers(tmp_path / "traces.jsonl")
    assert (episode.id, episode.ok, episode.rewards) == ("old-1", True, {"correct": 1.0})
    assert episode.run == WireRun(id="run-0", type="train", step=3)
    [agent] = episode.agents
    assert (agent.id, agent.name, agent.trainable) == ("old-1", "agent", True)
    [call] = agent.calls
    assert episode.prompt_ids(call).tolist() == [1, 2, 50]
    assert call.completion_ids.tolist() == [7, 8]
    assert call.logprobs.tolist() == [-0.5, -0.25]


def test_cancelled_episode_without_traces(tmp_path: Path) -> None:
    task = multi_agent_episode().task
    cancelled = vf.WireEpisode(
        id="gone", task=task, ok=False, errors=[vf.Error(type="Cancelled", message="shutdown")]
    )
    [episode] = read_verifiers(write_with_verifiers(tmp_path, [cancelled]))
    assert (episode.ok, episode.agents) == (False, [])
    assert episode.errors == [WireError(type="Cancelled", message="shutdown")]


def test_advantages_back_onto_nodes_keep_unassigned_apart_from_zero(tmp_path: Path) -> None:
    source = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    [episode] = read_verifiers(source)
    leader, solver, _judge = episode.agents
    leader.calls[0].advantages = 0.5  # a scalar spreads over the completion
    leader.calls[1].advantages = np.array([0.0, 0.0])  # assigned zeros
    solver.calls[0].advantages = np.array([0.25, -0.5, 1.0])
    # everything else stays unassigned (None)
    out = tmp_path / "credited"
    out.mkdir()
    assert write_advantages(source, [episode], out / "traces.jsonl") == 1
    [credited] = read_with_verifiers(out)
    nodes = credited.traces[0].nodes
    assert nodes[1].advantages == [0.5, 0.5, 0.5]
    assert nodes[3].advantages == [0.0, 0.0]
    assert nodes[5].advantages is None
    assert credited.traces[1].nodes[1].advantages == [0.25, -0.5, 1.0]
    assert all(n.advantages is None for n in credited.traces[2].nodes)
    assert credited.traces[2].branches[0].advantages is None  # verifiers' own "never scored"
    # and back again: callgrove reads the credit it wrote, None and zeros still apart
    [again] = read_verifiers(out / "traces.jsonl")
    assert again.agents[0].calls[1].advantages.tolist() == [0.0, 0.0]
    assert again.agents[0].calls[2].advantages is None
    # everything else of the rows is untouched
    before = json.loads(source.read_text())
    after = json.loads((out / "traces.jsonl").read_text())
    for trace in (*before["traces"], *after["traces"]):
        for node in trace["nodes"]:
            node.pop("advantages", None)
    assert before == after


def test_set_advantages_on_verifiers_objects_in_memory(tmp_path: Path) -> None:
    source = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    [episode] = read_verifiers(source)
    [theirs] = read_with_verifiers(tmp_path)
    episode.agents[1].calls[1].advantages = 2.0
    assert set_advantages(theirs, episode) == len(list(episode.calls()))
    assert theirs.traces[1].nodes[3].advantages == [2.0]
    assert theirs.traces[1].branches[0].advantages == [0.0] * 11 + [2.0]
    episode.agents.reverse()
    with pytest.raises(InputError, match="trace 0 is"):
        set_advantages(theirs, episode)


def test_callgrove_episodes_written_as_verifiers_read_by_verifiers(tmp_path: Path) -> None:
    """Native episodes out as verifiers rows: verifiers' reader takes them, its branches are
    callgrove's rows, and reading them back gives the same calls."""
    leader = Agent("L", "leader")
    c1 = leader.add(Call.make("C1", 1, [1, 2, 3], [4, 5], [-0.1, -0.2]))
    leader.add(Call.make("C3", 3, [1, 2, 3, 4, 5, 6], [7], [-0.3]))
    leader.add(Call.make("C4", 4, [1, 2, 3, 4, 5, 6, 7, 8], [9], [-0.4], purpose="compaction"))
    leader.add(Call.make("C5", 5, [20, 9], [21], [-0.5]))
    leader.add(Call.make("R", 6, [20, 9], [22], [-0.6], kept=False))  # a dropped retry
    worker = Agent("W", "explore", parent="L", start="fresh")
    worker.add(Call.make("C2", 2, [30, 31], [32, 33], [-0.7, -0.8], advantages=0.0))
    episode = Episode(
        id="native",
        agents=[leader, worker],
        group="g",
        env=WireEnv(id="env", name="e"),
        task={"prompt": "x"},
        run=WireRun(id="r", type="eval", step=4, policy=WirePolicy(start=1, end=2)),
        rewards={"pass": 1.0},
        errors=[WireError(type="Timeout", message="slow", agent="W")],
    )
    out = tmp_path / "traces.jsonl"
    assert write_verifiers(out, [episode]) == 1
    notes: list[dict] = []
    verifiers_row(episode, notes)
    assert notes == []  # the dropped retry travels in the trace's info
    [theirs] = read_with_verifiers(tmp_path)
    assert theirs.run.work.type == "eval" and theirs.run.work.step == 4
    [back] = read_verifiers(out)
    _compare_rows_with_branches(back, theirs)
    assert row_tokens(back) == row_tokens(episode)
    assert back.run == episode.run and back.group == "g"
    assert back.errors == [WireError(type="Timeout", message="slow", agent="W")]
    calls = {
        back.prompt_ids(c).tolist().__repr__() + c.completion_ids.tolist().__repr__(): c
        for c in back.calls()
    }
    assert len(calls) == 6 and not back.call("R").kept  # the retry comes back, not kept
    summary = next(c for c in back.calls() if c.purpose == "compaction")
    assert summary.kept and back.full_ids(summary).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert back.agents[1].calls[0].advantages == 0.0  # the scalar it was spread from
    assert back.agents[0].calls[0].advantages is None
    assert episode.full_ids(c1).tolist() == back.full_ids(back.agents[0].calls[0]).tolist()


def test_bad_rows_are_reported_with_file_and_line(tmp_path: Path) -> None:
    path = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    good = path.read_text()
    bad_mask = json.loads(good)
    bad_mask["id"] = "broken"
    bad_mask["traces"][1]["nodes"][1]["mask"] = [True, False, True, True, True]
    path.write_text(good + "{not json\n" + json.dumps(bad_mask) + "\n" + good + good[:40])
    with pytest.raises(InputError) as raised:
        list(read_verifiers(path))
    assert raised.value.problem.line == 2 and raised.value.problem.file == str(path)
    diagnostics = Diagnostics()
    episodes = list(read_verifiers(path, diagnostics))
    assert [e.id for e in episodes] == ["ep-0", "ep-0"]
    first, second, truncated = diagnostics.problems
    assert (first.line, first.kind) == (2, "malformed")
    assert (second.line, second.episode, second.call) == (3, "broken", "t1.n1")
    assert "one run at the end" in second.message
    assert (truncated.line, truncated.severity, truncated.kind) == (5, "error", "truncated")
