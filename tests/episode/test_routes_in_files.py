"""A call's routes (mixtures of experts) in every file form: JSON Lines, Parquet, Arrow and
ATIF give back each call's whole routes exactly (`Episode.routes`, int16), the native forms
`routes_from` as it was; an episode without routes reads with none; a binary file written
before the columns existed still reads; routes a file cannot hold are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import callgrove.interop  # noqa: F401  (registers the ATIF form)
from callgrove.episode import Agent, BinaryEpisodeWriter, Call, Episode, load, save
from callgrove.episode.binary.reader import _routes_column
from callgrove.episode.binary.schema import AGENT_TYPE, CALL_TYPE, PARQUET_ROUTES_COLUMN, SCHEMA
from callgrove.episode.binary.writer import _routes_array, episodes_to_batch
from callgrove.episode.record import NO_ROUTE, ROUTE_DTYPE
from callgrove.forest import compact_prompts
from callgrove.formats import InputError

from .helpers import healthy
from .strategies import as_plain, episodes

NATIVE = [".jsonl", ".parquet", ".arrow"]
FORMS = [*NATIVE, "atif"]
LAYERS, K = 2, 2


def router(tokens: np.ndarray, layers: int = LAYERS, k: int = K) -> np.ndarray:
    """Routes a deterministic router would give a full sequence (but its last token): each
    position's experts from its token and place, so sequences with a common prefix share its
    routes; some positions have none (`NO_ROUTE`)."""
    positions = np.arange(len(tokens) - 1)
    base = tokens[:-1, None, None] * 7 + positions[:, None, None] * 3
    routes = (base + np.arange(layers)[None, :, None] * 5 + np.arange(k)[None, None, :]) % 9 - 1
    return routes.astype(ROUTE_DTYPE)


def routed_call(call_id: str, seq: int, prompt: list[int], completion: list[int], **extra) -> Call:
    """A call routed as `router` routes its sequence, unless `routes` is given."""
    extra.setdefault("routes", router(np.asarray(prompt + completion)))
    return Call.make(call_id, seq, prompt, completion, [-0.5] * len(completion), **extra)


def routed_episode(episode_id: str = "moe-1") -> Episode:
    """A leader whose calls resend each other's sequences, one whose forward routed the
    shared prefix otherwise, and a subagent with a call without routes: after
    `compact_prompts`, some calls hold their routes from a `routes_from` past 0."""
    leader = Agent("L", "leader")
    first = [1, 2, 3, 4]
    leader.add(routed_call("C1", 1, first, [5, 6]))
    second = [*first, 5, 6, 7, 8]
    leader.add(routed_call("C2", 2, second, [9, 10, 11]))
    third = [*second, 9, 10, 11, 12]
    leader.add(routed_call("C4", 4, third, [13]))
    # resends C2's sequence, but its forward routed one shared position otherwise
    changed = router(np.asarray([*third, 14, 15]))
    changed[2, 0, 0] = (changed[2, 0, 0] + 1) % 8
    leader.add(routed_call("C5", 5, third, [14, 15], routes=changed))
    solver = Agent("S", "solver", parent="L", start="fresh")
    solver.add(routed_call("C3", 3, [20, 21], [22, 23]))
    solver.add(routed_call("C6", 6, [20, 21, 22, 23, 24], [25], routes=None))
    episode = Episode(episode_id, [leader, solver], rewards={"r": 1.0})
    compact_prompts(episode)
    return episode


def plain_episode(episode_id: str = "dense-1") -> Episode:
    episode = healthy(episode_id)
    assert all(c.routes is None for c in episode.calls())
    return episode


def round_trip(folder: Path, form: str, written: list[Episode]) -> list[Episode]:
    if form == "atif":
        save(folder / "atif", written, format="atif")
        return sorted(load(folder / "atif"), key=lambda e: [w.id for w in written].index(e.id))
    path = folder / f"episodes{form}"
    save(path, written)
    return list(load(path))


def assert_same_routes(written: Episode, read: Episode, native: bool) -> None:
    back = {c.id: c for c in read.calls()}
    assert set(back) == {c.id for c in written.calls()}
    for call in written.calls():
        got, want = read.routes(back[call.id]), written.routes(call)
        assert np.array_equal(read.full_ids(back[call.id]), written.full_ids(call))
        if want is None:
            assert got is None, call.id
            continue
        assert got is not None, call.id
        assert got.dtype == ROUTE_DTYPE and got.shape == want.shape, call.id
        assert np.array_equal(got, want), call.id
        assert len(got) == call.full_len - 1
        if native:
            assert back[call.id].routes_from == call.routes_from, call.id


def test_the_example_holds_routes_from_past_zero_and_a_route_break():
    episode = routed_episode()
    calls = {c.id: c for c in episode.calls()}
    assert calls["C2"].prompt_from == "C1" and calls["C2"].routes_from == calls["C1"].full_len - 1
    assert calls["C4"].routes_from > 0
    assert calls["C5"].routes_from == 0  # its own forward routed the prefix otherwise
    assert calls["C6"].routes is None


@pytest.mark.parametrize("form", FORMS)
def test_routes_come_back_exactly_in_every_form(tmp_path, form):
    written = [routed_episode("a"), plain_episode("b"), routed_episode("c")]
    read = round_trip(tmp_path, form, written)
    assert [e.id for e in read] == ["a", "b", "c"]
    for before, after in zip(written, read, strict=True):
        assert_same_routes(before, after, native=form in NATIVE)
    assert all(c.routes is None and c.routes_from == 0 for c in read[1].calls())


@pytest.mark.parametrize("form", FORMS)
def test_an_episode_without_routes_reads_with_none(tmp_path, form):
    (read,) = round_trip(tmp_path, form, [plain_episode()])
    assert all(c.routes is None and c.routes_from == 0 for c in read.calls())
    assert all(read.routes(c) is None for c in read.calls())


def test_atif_carries_each_steps_whole_routes_and_reads_them_shared_again(tmp_path):
    episode = routed_episode()
    save(tmp_path / "atif", [episode], format="atif")
    (path,) = (tmp_path / "atif").iterdir()
    document = json.loads(path.read_text())
    leader = {s["extra"]["callgrove"]["id"]: s for s in document["steps"] if "extra" in s}
    whole = episode.routes(next(c for c in episode.calls() if c.id == "C4"))
    assert leader["C4"]["extra"]["callgrove"]["routes"] == whole.tolist()
    assert "routes_from" not in leader["C4"]["extra"]["callgrove"]
    (read,) = load(tmp_path / "atif")
    calls = {c.id: c for c in read.calls()}
    # held as the prompt base's where they agree, as a compacted episode holds them
    assert calls["C4"].routes_from > 0 and len(calls["C4"].routes) < len(whole)
    assert calls["C5"].routes_from == 0


def test_atif_with_routes_is_still_a_trajectory_harbor_validates(tmp_path):
    trajectories = pytest.importorskip("harbor.models.trajectories")
    save(tmp_path / "atif", [routed_episode()], format="atif")
    (path,) = (tmp_path / "atif").iterdir()
    trajectories.Trajectory.model_validate(json.loads(path.read_text()))


def test_parquet_writes_the_routes_with_a_dictionary(tmp_path):
    """Expert indices are few: a dictionary makes them several times smaller (Parquet stores
    int16 as int32 otherwise); the column path the writer names must be the routes'."""
    save(tmp_path / "e.parquet", [routed_episode()])
    group = pq.ParquetFile(tmp_path / "e.parquet").metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    assert "RLE_DICTIONARY" in columns[PARQUET_ROUTES_COLUMN].encodings
    tokens = next(c for path, c in columns.items() if ".completion_ids." in path)
    assert "RLE_DICTIONARY" not in tokens.encodings


@pytest.mark.parametrize("form", [".jsonl", ".parquet", ".arrow", "atif"])
def test_routes_over_no_position_keep_the_episodes_layers(tmp_path, form):
    """A one-token call (no prompt) forwards nothing: its routes have no position, and the
    form gives back the layers and k of the episode's other routes."""
    episode = routed_episode()
    lone = Call.make("C7", 7, [], [3], [-0.1], routes=np.zeros((0, LAYERS, K), ROUTE_DTYPE))
    episode.agents[1].add(lone)
    episode.ledger()
    (read,) = round_trip(tmp_path, form, [episode])
    assert_same_routes(episode, read, native=form != "atif")


# --- files written before the columns existed ------------------------------------------------

DATA = Path(__file__).resolve().parents[1] / "data" / "before_sampling"


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_binary_files_of_before_the_sampling_column_read_without_routes(suffix):
    (old,) = load(DATA / f"login_bug{suffix}")
    assert all(c.routes is None and c.routes_from == 0 for c in old.calls())


def _without(names: set[str]) -> tuple[pa.Schema, pa.StructType]:
    """The layout as it was before the call columns `names` were added."""
    calls = pa.struct([f for f in CALL_TYPE if f.name not in names])
    call_list = pa.list_(pa.field("item", calls, nullable=False))
    agent = pa.struct(
        [
            pa.field("calls", call_list, nullable=False) if f.name == "calls" else f
            for f in AGENT_TYPE
        ]
    )
    agents = pa.list_(pa.field("item", agent, nullable=False))
    fields = [
        pa.field("agents", agents, nullable=False) if f.name == "agents" else f for f in SCHEMA
    ]
    return pa.schema(fields, metadata=SCHEMA.metadata), calls


def _rewritten(batch: pa.RecordBatch, schema: pa.Schema, change) -> pa.RecordBatch:
    """The batch in `schema`, each call's row changed by `change` on the way."""
    rows = batch.to_pylist()
    for row in rows:
        for agent in row["agents"]:
            for call in agent["calls"]:
                change(call)
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _write(path: Path, batch: pa.RecordBatch) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_batches([batch]), path)
    else:
        with ipc.new_file(str(path), batch.schema) as writer:
            writer.write_batch(batch)


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_binary_file_written_before_the_routes_columns_reads_with_none(tmp_path, suffix):
    written = [routed_episode("a"), plain_episode("b")]
    schema, _calls = _without({"routes", "routes_from"})

    def drop(call: dict) -> None:
        del call["routes"], call["routes_from"]

    path = tmp_path / f"old{suffix}"
    _write(path, _rewritten(episodes_to_batch(written), schema, drop))
    read = list(load(path))
    assert [e.id for e in read] == ["a", "b"]
    for before, after in zip(written, read, strict=True):
        assert all(c.routes is None and c.routes_from == 0 for c in after.calls())
        for was, now in zip(before.calls(), after.calls(), strict=True):
            assert np.array_equal(before.full_ids(was), after.full_ids(now))


@pytest.mark.parametrize(
    ("routes", "says"),
    [
        ([[[1, 2], [3, 4]], [[1, 2]]], "unequal lengths"),  # a position with one layer fewer
        ([[[1, 2], [3]], [[1, 2], [3, 4]]], "unequal lengths"),  # a layer with one expert fewer
        ([[[1, None], [3, 4]], [[1, 2], [3, 4]]], "hold a null"),
        ([[[1, 2], None], [[1, 2], [3, 4]]], "hold a null"),
        ([[[1, 2], [3, 4]]], "routes have shape"),  # one position where two are forwarded
        ([[[1, 2], [3, 4]], [[1, 2], [3, -2]]], "below -1"),
    ],
)
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_routes_no_array_holds_are_refused_naming_the_call(tmp_path, suffix, routes, says):
    leader = Agent("L", "leader")
    leader.add(Call.make("C1", 1, [1, 2], [3], [-0.1]))
    schema, _calls = _without(set())

    def damage(call: dict) -> None:
        call["routes"] = routes

    path = tmp_path / f"bad{suffix}"
    _write(path, _rewritten(episodes_to_batch([Episode("e", [leader])]), schema, damage))
    with pytest.raises(InputError, match=says) as raised:
        list(load(path))
    assert raised.value.problem.call == "C1" and raised.value.problem.episode == "e"


def test_atif_routes_that_are_no_expert_indices_are_refused(tmp_path):
    save(tmp_path / "atif", [routed_episode()], format="atif")
    (path,) = (tmp_path / "atif").iterdir()
    document = json.loads(path.read_text())
    document["steps"][0]["extra"]["callgrove"]["routes"] = [[["x"]]]
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"extra\.callgrove\.routes"):
        list(load(tmp_path / "atif"))


def test_the_routes_column_reads_from_a_slice_of_a_batch():
    """A batch's calls are a slice of a longer column where offsets do not start at 0."""
    calls = [c for e in (routed_episode("a"), plain_episode("b")) for c in e.calls()]
    column = _routes_array(calls)
    for start in range(len(calls)):
        routes, problems = _routes_column(column.slice(start))
        assert not problems
        for call, got in zip(calls[start:], routes, strict=True):
            assert (got is None) == (call.routes is None)
            assert got is None or (
                np.array_equal(got, call.routes) and got.shape == call.routes.shape
            )


def _batches(path: Path) -> int:
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).num_row_groups
    return ipc.open_file(pa.memory_map(str(path))).num_record_batches


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_routes_count_toward_a_batch_and_every_batch_reads_back(tmp_path, suffix):
    """A batch is closed by its memory: routes count (two int16 values a token id's bytes)."""
    written = [routed_episode(f"e{i}") for i in range(4)]
    tokens = sum(len(c.prompt_suffix) + len(c.completion_ids) for c in written[0].calls())
    for episode, batches in ((plain_episode, 2), (None, 4)):
        path = tmp_path / f"{batches}{suffix}"
        episodes = written if episode is None else [_dense(e) for e in written]
        with BinaryEpisodeWriter(path, batch_tokens=tokens + 1) as writer:
            for one in episodes:
                writer.write(one)
        assert _batches(path) == batches
        for before, after in zip(episodes, load(path), strict=True):
            assert_same_routes(before, after, native=True)


def _dense(episode: Episode) -> Episode:
    copy = episode.filter(lambda call: True)
    for call in copy.calls():
        call.routes, call.routes_from = None, 0
    return copy


def test_unchecked_writes_refuse_routes_int16_cannot_hold(tmp_path):
    episode = routed_episode()
    first = next(c for c in episode.calls() if c.routes is not None)
    first.routes = first.routes.astype(np.int64) + 40_000
    with pytest.raises(InputError, match="int16"), BinaryEpisodeWriter(tmp_path / "e.arrow") as w:
        w.write(episode)


# --- properties ------------------------------------------------------------------------------


@st.composite
def routed_episodes(draw: st.DrawFn) -> Episode:
    """One or two agents whose calls resend their previous call's sequence or start afresh,
    routes recorded for every call, some or none (any layers and k), a call's forward now and
    then routing a shared position otherwise; compacted or held whole."""
    layers, k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    recorded = draw(st.sampled_from(["all", "some", "none"]))
    tokens = st.lists(st.integers(0, 60), min_size=1, max_size=5)
    agents, seq = [], 0
    for number in range(draw(st.integers(1, 2))):
        agent = Agent(f"A{number}", "leader" if number == 0 else "solver")
        if number:
            agent.parent, agent.start = "A0", "fresh"
        previous: list[int] | None = None
        for _ in range(draw(st.integers(1, 4))):
            seq += 1
            resend = previous is not None and draw(st.booleans())
            prompt = (previous if resend else []) + draw(tokens)
            completion = draw(tokens)
            routes = router(np.asarray(prompt + completion), layers, k)
            if draw(st.integers(0, 3)) == 0:  # this forward routed a position otherwise
                position = draw(st.integers(0, len(routes) - 1))
                routes[position] = draw(st.integers(NO_ROUTE, 7))
            keep = recorded == "all" or (recorded == "some" and draw(st.booleans()))
            agent.add(
                Call.make(
                    f"C{seq}",
                    seq,
                    prompt,
                    completion,
                    [-0.25] * len(completion),
                    routes=routes if keep else None,
                )
            )
            previous = prompt + completion
        agents.append(agent)
    episode = Episode(f"ep-{seq}", agents)
    if draw(st.booleans()):
        compact_prompts(episode)
    return episode


PROPERTIES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("form", FORMS)
@PROPERTIES
@given(written=st.lists(routed_episodes(), min_size=1, max_size=3))
def test_any_routed_episodes_round_trip(tmp_path_factory, form, written):
    for index, episode in enumerate(written):
        episode.id = f"ep-{index}"
    read = round_trip(tmp_path_factory.mktemp("routes"), form, written)
    for before, after in zip(written, read, strict=True):
        assert_same_routes(before, after, native=form in NATIVE)


@st.composite
def any_episodes_with_routes(draw: st.DrawFn) -> Episode:
    """The round-trip tests' episodes (every field, prompts over any earlier call), routes
    given to some of their calls with more than one token, held as their base's where the
    drawn routes agree."""
    episode = draw(episodes(index=draw(st.integers(0, 9))))
    layers, k = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    for call in episode.ledger():
        if call.full_len < 2 or draw(st.integers(0, 3)) == 0:
            continue
        routes = router(episode.full_ids(call), layers, k)
        base = episode.find(call.prompt_from) if call.prompt_from is not None else None
        below = None if base is None else episode.routes(base)
        cut = call.prompt_from_len - 1
        # (a base held from past the cut is left out: `test_routes_over_a_shorter_prefix...`)
        fits = base is not None and base.routes_from <= cut
        if below is not None and cut > 0 and fits and draw(st.integers(0, 3)) > 0:
            # resends its base's routes over the prompt it resends: held from routes_from
            call.routes, call.routes_from = routes[cut:].copy(), cut
        else:
            call.routes = routes
    return episode


@pytest.mark.parametrize("suffix", NATIVE)
@PROPERTIES
@given(written=any_episodes_with_routes())
def test_every_field_and_routes_survive_the_native_forms(tmp_path_factory, suffix, written):
    (read,) = round_trip(tmp_path_factory.mktemp("any"), suffix, [written])
    float32 = suffix != ".jsonl"
    assert as_plain(read, float32=float32) == as_plain(written, float32=float32)
    assert_same_routes(written, read, native=True)


def test_routes_over_a_shorter_prefix_of_a_base_held_from_further():
    """A prompt may resend any prefix of its base (the JSON and binary forms allow it); when
    that prefix ends before the base's own `routes_from`, every route it takes lies further
    down."""
    leader = Agent("L", "leader")
    first = leader.add(routed_call("C1", 1, [1, 2, 3], [4, 5]))
    second = leader.add(routed_call("C2", 2, [1, 2, 3, 4, 5, 6], [7]))
    third = leader.add(routed_call("C3", 3, [1, 2, 3], [8]))
    whole = third.routes
    second.prompt_from, second.prompt_from_len = "C1", 5
    second.prompt_suffix = second.prompt_suffix[5:].copy()
    second.routes, second.routes_from = second.routes[4:].copy(), 4
    third.prompt_from, third.prompt_from_len = "C2", 3
    third.prompt_suffix = third.prompt_suffix[3:].copy()
    third.routes, third.routes_from = whole[2:].copy(), 2
    episode = Episode("e", [leader])
    assert np.array_equal(episode.routes(first)[:2], whole[:2])
    assert np.array_equal(episode.routes(third), whole)
