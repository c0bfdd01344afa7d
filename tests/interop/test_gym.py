"""NeMo Gym 0.7.0 interop: captures written by Gym's own store, invocation records of exactly the
shapes in Gym's source."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nemo_gym
import pytest
from msgspec import UNSET
from nemo_gym.token_id_capture import TokenCaptureStore, prefix_merging

from callgrove.formats.problems import Diagnostics, InputError
from callgrove.interop.gym import read_captures, read_gym
from callgrove.rows import build_rows

from .gym_records import (
    ROLLOUT,
    Capture,
    compaction,
    gap,
    invocation,
    ref,
    seed_capture,
    seed_rollout_row,
    trajectory,
    write_rows,
)


@pytest.fixture
def store(tmp_path: Path) -> TokenCaptureStore:
    return TokenCaptureStore(tmp_path / "tokens")


def test_every_agent_and_compaction_kept_rows_as_the_spec_example(
    store: TokenCaptureStore, tmp_path: Path
) -> None:
    seed_capture(store)
    rows_file = write_rows(tmp_path / "rollouts.jsonl", [seed_rollout_row()])
    [episode] = read_gym(store.root, rows_file)
    assert (episode.id, episode.group, episode.rewards, episode.ok) == (
        ROLLOUT,
        "login-bug",
        {"reward": 1.0},
        True,
    )
    agents = {a.id: a for a in episode.agents}
    assert {k: (a.name, a.parent, a.start) for k, a in agents.items()} == {
        "L": ("leader", None, "root"),
        "B": ("subagent", None, "fresh"),  # Gym recorded no link: subagent_parent_unavailable
        "A": ("subagent", "L", "fresh"),
        "F": ("subagent", "L", "fork"),  # its first call continues C7, a call of L
    }
    assert [c.id for c in agents["L"].calls] == ["C1", "C3", "C7", "C10", "C11", "C12", "R12"]
    assert [c.id for c in agents["A"].calls] == ["C5", "C6"]  # C6 joined by its response id
    assert episode.call("C10").purpose == "compaction"
    assert not episode.call("R12").kept  # captured, named by no invocation
    assert episode.prompt_ids(episode.call("C8")).tolist() == [1, 10, 11, 12, 13, 14, 15, 16, 50]
    kinds = sorted(g.kind for g in episode.gaps)
    assert kinds == [
        "empty_generation",
        "model_call_ownership_unavailable",
        "subagent_parent_unavailable",
    ]
    # the login_bug example of docs/episode-format.md, row for row
    table = [
        (r.leaf.id, [c.id for c in r.path], [c.id for c in r.trains], [c.id for c in r.context])
        for r in build_rows(episode).rows
    ]
    assert table == [
        ("C4", ["C2", "C4"], ["C2", "C4"], []),
        ("C6", ["C5", "C6"], ["C5", "C6"], []),
        ("C9", ["C1", "C3", "C7", "C8", "C9"], ["C8", "C9"], ["C1", "C3", "C7"]),
        ("C10", ["C1", "C3", "C7", "C10"], ["C1", "C3", "C7", "C10"], []),
        ("C12", ["C11", "C12"], ["C11", "C12"], []),
    ]


def test_gym_builder_delivers_one_chain_where_callgrove_trains_every_call(
    store: TokenCaptureStore, tmp_path: Path
) -> None:
    seed_capture(store)
    entries = list(store.freeze_now(ROLLOUT).entries)
    built = prefix_merging(entries)
    [main] = [chain for chain in built.chains if chain.chain_id == "main"]
    delivered = {link.entry.model_call_id for link in main.links}
    assert built.notes.delivered_fraction < 1
    rows_file = write_rows(tmp_path / "rollouts.jsonl", [seed_rollout_row()])
    [episode] = read_gym(store.root, rows_file)
    trained = {c.id for row in build_rows(episode).rows for c in row.trains}
    assert trained == {f"C{n}" for n in range(1, 13)}
    assert delivered < trained


def _source_fields(class_name: str) -> set[str]:
    """The annotated fields of a model in Gym's rollout_observability.py, read from the source."""
    source = Path(nemo_gym.__file__).parent / "rollout_observability.py"
    tree = ast.parse(source.read_text())
    [node] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}


def test_invocation_records_have_exactly_the_shapes_of_gym_source() -> None:
    row = seed_rollout_row()
    assert set(row["ng_trajectory"]) == _source_fields("TrajectoryRecord")
    assert set(invocation("L", [])) == _source_fields("AgentInvocation")
    assert set(ref("C1")) == _source_fields("ModelCallRef")
    assert set(compaction("L", "C10", "C7", "C11")) == _source_fields(
        "ContextCompactionObservation"
    )
    assert set(gap("x")) == _source_fields("ObservationGap")
    assert set(row["ng_agent_observations"]) == _source_fields("AgentObservationBundle")


def test_bare_trajectory_records_and_bundles_are_read_too(
    store: TokenCaptureStore, tmp_path: Path
) -> None:
    seed_capture(store)
    row = seed_rollout_row()
    bare = trajectory(row["ng_trajectory"]["invocations"], [])
    [from_trajectory] = read_gym(store.root, write_rows(tmp_path / "t.jsonl", [bare]))
    assert from_trajectory.call("C10").purpose == "turn"  # a TrajectoryRecord keeps no compactions
    bundle = {"rollout_id": ROLLOUT, **row["ng_agent_observations"]}
    [from_bundle] = read_gym(store.root, write_rows(tmp_path / "b.jsonl", [bundle]))
    assert from_bundle.call("C10").purpose == "compaction"
    assert [a.id for a in from_bundle.agents] == ["L", "B", "A", "F"]


def test_without_invocation_records_every_call_is_one_agents(store: TokenCaptureStore) -> None:
    seed_capture(store)
    [episode] = read_gym(store.root)
    [agent] = episode.agents
    assert len(agent.calls) == 13 and all(c.kept for c in agent.calls)
    assert [g.kind for g in episode.gaps] == [
        "empty_generation",
        "agent_invocations_unavailable",
    ]
    assert [c.id for c in episode.calls()] == [f"C{n}" for n in range(1, 13)] + ["R12"]


def test_lost_calls_and_failed_agents_are_errors(store: TokenCaptureStore, tmp_path: Path) -> None:
    capture = Capture(store)
    capture.call("C1", [1, 2], [3])
    capture.call("C2", capture.after("C1", 4), [5], parent="C1", delta=True)
    store._mark_incomplete(ROLLOUT, "C3")  # Gym's record of a call it lost
    store._begin_call(ROLLOUT, "C4")  # dispatched, never recorded
    record = trajectory(
        [
            invocation("L", [ref("C1")]),
            invocation(
                "S",
                [ref("C2"), ref("C9")],
                parent="L",
                spawned_by="t",
                status="failed",
                error_type="timeout",
            ),
        ],
        [],
    )
    [episode] = read_gym(store.root, write_rows(tmp_path / "r.jsonl", [record]))
    assert not episode.ok
    assert [(e.type, e.agent, e.message) for e in episode.errors] == [
        ("timeout", "S", "agent invocation failed"),
        ("capture_incomplete", UNSET, "calls lost: C3, C4"),
    ]
    unmatched = [g.to_json() for g in episode.gaps if g.kind == "model_call_reference_unmatched"]
    assert unmatched == [
        {
            "kind": "model_call_reference_unmatched",
            "agent": "S",
            "call": "C9",
            "reason": "no captured call with tokens matches this reference",
        }
    ]


def test_delta_prompts_through_a_call_that_generated_nothing(store: TokenCaptureStore) -> None:
    capture = Capture(store)
    capture.call("C1", [1, 2], [3])
    capture.call("C2", capture.after("C1", 4), [], parent="C1", delta=True)  # nothing generated
    capture.call("C3", capture.after("C2", 5), [6], parent="C2", delta=True)
    [episode] = read_gym(store.root)
    assert episode.prompt_ids(episode.call("C3")).tolist() == [1, 2, 3, 4, 5]
    assert [g.kind for g in episode.gaps][:1] == ["empty_generation"]


def test_delta_over_a_parent_never_captured_is_a_gap(tmp_path: Path) -> None:
    line = {
        "rollout_id": "r1",
        "model_call_id": "C2",
        "prompt_token_ids": [4],
        "generation_token_ids": [5],
        "generation_log_probs": [-1.0],
        "parent_call_id": "C1",
        "parent_resolution": "resolved",
        "prompt_is_delta": True,
    }
    path = tmp_path / "r1.tokens.jsonl"
    path.write_text(json.dumps(line) + "\n")
    [episode] = read_gym(path)
    assert list(episode.calls()) == []
    assert episode.gaps[0].kind == "delta_chain_unreconstructable"


def test_bad_lines_are_reported_with_file_and_line(
    store: TokenCaptureStore, tmp_path: Path
) -> None:
    seed_capture(store)
    tokens = store.path_for(ROLLOUT)
    lines = tokens.read_text().splitlines()
    newer = json.loads(lines[2])
    newer["schema_version"] = 2
    tokens.write_text("\n".join([lines[0], "{oops", json.dumps(newer), *lines[3:]]) + "\n")
    with pytest.raises(InputError) as raised:
        read_captures(tokens)
    assert (raised.value.problem.file, raised.value.problem.line) == (str(tokens), 2)
    diagnostics = Diagnostics()
    [capture] = read_captures(tokens, diagnostics)
    assert [(p.line, p.kind) for p in diagnostics.problems] == [(2, "malformed"), (3, "invalid")]
    assert (
        diagnostics.problems[1].call == "C3"
        and "schema_version 2" in diagnostics.problems[1].message
    )
    assert len(capture.entries) == len(lines) - 2
    rows = write_rows(tmp_path / "rows.jsonl", [seed_rollout_row(), {"reward": 0.0}])
    diagnostics = Diagnostics()
    episodes = list(read_gym(store.root, rows, diagnostics))
    assert [e.id for e in episodes] == [ROLLOUT]
    located = [p for p in diagnostics.problems if p.file == str(rows)]
    assert [(p.line, "rollout_id" in p.message) for p in located] == [(2, True)]
