import pytest

from callgrove.episode import Agent, Call, Episode, Gap, Spawn, load, save
from callgrove.episode.provenance import gap_from_json, join_spawn, split_spawn
from callgrove.formats.problems import InputError


def test_gap_keeps_fields_it_does_not_type():
    written = {"kind": "lost", "agent": "A", "line": 3, "source": "gym", "extra": [1]}
    gap = gap_from_json(written)
    assert (gap.kind, gap.agent, gap.line) == ("lost", "A", 3)
    assert gap.detail == {"source": "gym", "extra": [1]}
    assert gap.to_json() == written


@pytest.mark.parametrize(
    "value", [{"reason": "no kind"}, {"kind": 3}, "text", {"kind": "k", "line": "x"}]
)
def test_a_malformed_gap_is_an_input_error(value):
    with pytest.raises(InputError):
        gap_from_json(value, "ep")


def test_spawn_lives_in_agent_meta_in_files(tmp_path):
    spawn = Spawn(call="L1", tool_call_id="tu-1", link="toolUseResult.agentId")
    meta = join_spawn(spawn, {"layout": "flat"})
    assert meta == {
        "layout": "flat",
        "spawned_by": "L1",
        "tool_use_id": "tu-1",
        "link": "toolUseResult.agentId",
    }
    assert split_spawn(meta) == (spawn, {"layout": "flat"})
    assert split_spawn({"spawned_by": 3}) == (None, {"spawned_by": 3})  # not ours: left alone


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_gaps_and_spawns_survive_a_file(tmp_path, suffix):
    leader = Agent("L", "leader", calls=[Call.make("L1", 1, [1, 2], [3])])
    worker = Agent(
        "W",
        "worker",
        parent="L",
        start="fresh",
        calls=[Call.make("W1", 2, [5], [6])],
        spawn=Spawn(call="L1", description="look"),
    )
    gap = Gap(kind="subagent_file_missing", agent="X", file="agent-x.jsonl", reason="gone")
    path = tmp_path / f"e{suffix}"
    save(path, [Episode("e", agents=[leader, worker], gaps=[gap])])
    (read,) = load(path)
    assert read.gaps == [gap]
    assert read.agent("W").spawn == Spawn(call="L1", description="look")
    assert read.agent("W").meta is None
