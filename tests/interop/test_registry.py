"""One registry of episode formats: `load`, `save` and `convert` find verifiers, Gym and
callgrove's own forms by name, by file name, or by the first line."""

from __future__ import annotations

from pathlib import Path

import pytest

import callgrove as cg
from callgrove.episode.files import (
    FORMATS,
    NOT_EPISODES,
    EpisodeFormat,
    NotEpisodes,
    format_for,
    kind_of,
    register,
)

from .helpers import multi_agent_episode, write_with_verifiers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_verifiers_file_is_told_from_a_callgrove_file_by_its_first_line(tmp_path: Path):
    traces = write_with_verifiers(tmp_path, [multi_agent_episode(0), multi_agent_episode(1)])
    assert format_for(traces).name == "verifiers"
    assert format_for(EXAMPLES / "login_bug.jsonl").name == "callgrove"
    episodes = list(cg.load(traces))
    assert [e.id for e in episodes] == ["ep-0", "ep-1"]
    assert all(cg.check_rows(cg.build_rows(e)).ok for e in episodes)


def test_the_binary_forms_go_by_their_suffix(tmp_path: Path):
    assert format_for(tmp_path / "x.parquet").name == "parquet"
    assert format_for(tmp_path / "x.arrow").name == "arrow"
    assert format_for(tmp_path / "x.jsonl.zst").name == "callgrove"


def test_convert_streams_between_any_two_registered_forms(tmp_path: Path):
    traces = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    written = cg.convert(traces, tmp_path / "out.parquet")
    assert written == 1
    (back,) = cg.load(tmp_path / "out.parquet")
    (original,) = cg.load(traces)
    assert [back.full_ids(c).tolist() for c in back.calls()] == [
        original.full_ids(c).tolist() for c in original.calls()
    ]
    assert cg.convert(tmp_path / "out.parquet", tmp_path / "again.jsonl", target_format="verifiers")
    assert format_for(tmp_path / "again.jsonl").name == "verifiers"


def test_a_new_file_takes_callgrove_form_even_where_a_foreign_file_was(tmp_path: Path):
    path = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    cg.save(path, cg.load(EXAMPLES / "login_bug.jsonl"))
    assert format_for(path).name == "callgrove"


def test_unknown_names_and_read_only_forms_are_clear_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown episode format 'nope'; known: callgrove"):
        cg.load(tmp_path / "x.jsonl", format="nope")
    with pytest.raises(ValueError, match="cannot be written as gym"):
        cg.save(tmp_path / "x.tokens.jsonl", [])


def test_adding_a_form_is_one_entry(tmp_path: Path):
    def read(path, diagnostics=None):
        return cg.load_located(Path(str(path)[: -len(".mine")]), diagnostics)

    register(EpisodeFormat("mine", (".mine",), read))
    try:
        source = tmp_path / "login_bug.jsonl"
        cg.save(source, cg.load(EXAMPLES / "login_bug.jsonl"))
        assert [e.id for e in cg.load(tmp_path / "login_bug.jsonl.mine")] == ["login-bug-0001"]
    finally:
        del FORMATS["mine"]


def test_a_verifiers_results_folder_is_read_as_its_traces(tmp_path: Path):
    traces = write_with_verifiers(tmp_path, [multi_agent_episode(0), multi_agent_episode(1)])
    assert format_for(tmp_path).name == "verifiers" and kind_of(tmp_path) is FORMATS["verifiers"]
    assert [e.id for e in cg.load(tmp_path)] == [e.id for e in cg.load(traces)]


def test_a_folder_no_kind_holds_is_none_and_load_gives_it_to_gym(tmp_path: Path):
    assert kind_of(tmp_path) is None
    assert format_for(tmp_path).name == "gym"


def test_a_kind_that_holds_no_episodes_is_one_entry_too(tmp_path: Path):
    register(NotEpisodes("notes", (".notes.jsonl",), "a notes file, not an episode file"))
    try:
        named = tmp_path / "a.notes.jsonl"
        named.write_bytes((EXAMPLES / "login_bug.jsonl").read_bytes())
        assert kind_of(named) is NOT_EPISODES["notes"]
        assert format_for(named).name == "callgrove"  # `load` reads by the formats alone
        assert kind_of(EXAMPLES / "login_bug.jsonl") is FORMATS["callgrove"]
    finally:
        del NOT_EPISODES["notes"]


def test_saving_holds_prompts_compactly(tmp_path: Path):
    leader = cg.Agent("L", "leader")
    first = leader.add(cg.Call.make("C1", 1, [1, 2, 3], [4], [-0.1]))
    leader.add(cg.Call.make("C2", 2, [1, 2, 3, 4, 5], [6], [-0.2]))
    fork = cg.Agent("F", "fork", parent="L", start="fork")
    fork.add(cg.Call.make("C3", 3, [1, 2, 3, 4, 9], [7], [-0.3]))
    episode = cg.Episode("e", [leader, fork])
    cg.save(tmp_path / "e.jsonl", [episode])
    text = (tmp_path / "e.jsonl").read_text()
    assert text.count('"prompt_from":"C1"') == 2  # C2 and the fork's first call
    (back,) = cg.load(tmp_path / "e.jsonl")
    assert back.full_ids(back.call("C3")).tolist() == [1, 2, 3, 4, 9, 7]
    assert episode.full_ids(first).tolist() == [1, 2, 3, 4]
