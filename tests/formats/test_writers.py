"""Every writer: a new file appears whole or not at all, appends have one writer at a time,
and appending after a crash keeps every episode written before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from callgrove.episode import EpisodeWriter, load, open_writer, save
from callgrove.formats import Diagnostics, InputError, output
from episode.helpers import healthy

SUFFIXES = [".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow"]
LINE_SUFFIXES = [".jsonl", ".jsonl.gz", ".jsonl.zst"]


def _ids(path: Path) -> list[str]:
    diagnostics = Diagnostics()
    ids = [e.id for e in load(path, diagnostics)]
    assert not diagnostics.errors, diagnostics.errors
    return ids


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_saving_a_file_onto_itself_keeps_its_episodes(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy(f"e{i}") for i in range(3)])
    assert save(path, load(path)) == 3
    assert _ids(path) == ["e0", "e1", "e2"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_failed_write_leaves_the_earlier_file_and_no_temporary(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("before")])
    before = path.read_bytes()

    def failing():
        yield healthy("new")
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError):
        save(path, failing())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_two_writers_of_one_target_never_mix(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    first, second = open_writer(path), open_writer(path)
    for index in range(3):
        first.write(healthy(f"a{index}"))
        second.write(healthy(f"b{index}"))
    first.close()
    assert _ids(path) == ["a0", "a1", "a2"]
    second.close()
    assert _ids(path) == ["b0", "b1", "b2"]  # the last finished wins, whole


@pytest.mark.parametrize("suffix", LINE_SUFFIXES)
def test_a_second_appender_is_refused_while_the_first_holds_the_file(tmp_path, suffix, monkeypatch):
    monkeypatch.setattr(output, "LOCK_WAIT_S", 0.2)
    path = tmp_path / f"traces{suffix}"
    with EpisodeWriter(path, append=True) as writer:
        writer.write(healthy("a0"))
        with pytest.raises(InputError, match="another writer has held it"):
            EpisodeWriter(path, append=True)
        writer.write(healthy("a1"))
    with EpisodeWriter(path, append=True) as writer:  # free again once closed
        writer.write(healthy("a2"))
    assert _ids(path) == ["a0", "a1", "a2"]


@pytest.mark.parametrize("bad", ["missing/traces", "folder"])
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_unwritable_output_is_an_input_error(tmp_path, bad, suffix):
    (tmp_path / "folder").mkdir()
    target = tmp_path / bad if bad == "folder" else tmp_path / f"{bad}{suffix}"
    with pytest.raises(InputError, match="cannot write"):
        save(target, [healthy()])


def test_integer_the_binary_form_cannot_hold_names_its_episode(tmp_path):
    path = tmp_path / "traces.parquet"
    save(path, [healthy("earlier")])
    big = healthy("big")
    big.agents[0].calls[0].seq = 2**64
    with pytest.raises(InputError) as raised:
        save(path, [healthy("fine"), big])
    assert raised.value.problem.episode == "big"
    assert _ids(path) == ["earlier"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_appending_to_a_compressed_file_cut_by_a_crash_keeps_every_whole_line(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    with EpisodeWriter(path, append=True) as writer:
        for index in range(5):
            writer.write(healthy(f"a{index}"))
    data = path.read_bytes()
    path.write_bytes(data[:-6])  # the crash: the stream's end never written
    diagnostics = Diagnostics()
    survivors = [e.id for e in load(path, diagnostics)]
    assert survivors == [f"a{i}" for i in range(len(survivors))]
    with EpisodeWriter(path, append=True) as writer:
        writer.write(healthy("after"))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == [*survivors, "after"]
    assert not diagnostics.errors


# A writer run in its own process, killed with SIGKILL while it writes.
_WRITER = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from episode.helpers import healthy
from callgrove.episode import EpisodeWriter, open_writer
path, append = sys.argv[1], sys.argv[2] == "append"
writer = EpisodeWriter(path, append=True) if append else open_writer(path)
index = 0
while True:
    episode = healthy(f"w{index}")
    call = episode.agents[0].calls[0]
    call.completion_ids = np.arange(1, 4000, dtype=np.int32)  # lines worth cutting mid-write
    call.logprobs = None
    writer.write(episode)
    if append:
        writer.sync()  # durable: from here on this episode must survive
    print(episode.id, flush=True)  # written (a new file's temporary exists)
    index += 1
"""


def _run_and_kill(path: Path, append: bool, after: int) -> list[str]:
    """Start a writer, let it write `after` episodes (synced, so durable, when appending),
    SIGKILL it and return their ids."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WRITER,
            str(path),
            "append" if append else "new",
            str(Path(__file__).parents[1]),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None
    # However loaded the machine, it is killed after its `after`-th episode, in mid-write of more.
    written = [process.stdout.readline().strip() for _ in range(after)]
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert all(written), f"the writer ended by itself (exit {process.returncode})"
    return written


@pytest.mark.parametrize("suffix", LINE_SUFFIXES)
def test_sigkilled_appender_then_appended_to_keeps_every_durable_episode_once(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("before")])
    durable = _run_and_kill(path, append=True, after=25)
    with EpisodeWriter(path, append=True) as writer:
        writer.write(healthy("after"))
    diagnostics = Diagnostics()
    ids = [e.id for e in load(path, diagnostics)]
    assert not diagnostics.errors, diagnostics.errors
    assert len(ids) == len(set(ids))  # each once
    assert ids[0] == "before" and ids[-1] == "after"
    assert ids[1 : 1 + len(durable)] == durable  # every synced episode, in order
    assert all(p.kind == "truncated" for p in diagnostics.problems)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_sigkilled_new_file_write_leaves_the_earlier_file_whole(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("before-0"), healthy("before-1")])
    _run_and_kill(path, append=False, after=5)
    assert _ids(path) == ["before-0", "before-1"]
    if suffix in LINE_SUFFIXES:  # then appended to: the earlier episodes, once, then the new
        with EpisodeWriter(path, append=True) as writer:
            writer.write(healthy("after"))
        assert _ids(path) == ["before-0", "before-1", "after"]
    else:  # a binary file is written anew: the leftover temporary is no obstacle
        save(path, [*load(path), healthy("after")])
        assert _ids(path) == ["before-0", "before-1", "after"]


def _temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.partial"))


def _age(paths: list[Path]) -> None:
    """Make files look as old as a crashed run's leftovers (older than any write starting)."""
    old = time.time() - 3600
    for path in paths:
        os.utime(path, (old, old))


@pytest.mark.parametrize(
    ("suffix", "then"),
    [*((s, "save") for s in SUFFIXES), *((s, "append") for s in LINE_SUFFIXES)],
)
def test_temporaries_of_a_killed_writer_are_removed_by_the_next_write(tmp_path, suffix, then):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("before")])
    _run_and_kill(path, append=False, after=5)
    _run_and_kill(path, append=False, after=5)
    leftovers = _temporaries(tmp_path)
    # what a SIGKILL leaves; the second writer may already have removed the first one's, once
    # it was old enough (a binary writer touches its file only when a batch is full)
    assert 1 <= len(leftovers) <= 2
    _age(leftovers)
    with pytest.warns(output.LeftoverWarning, match=f"removed {len(leftovers)} temporary file"):
        if then == "save":
            save(path, [*load(path), healthy("after")])
        else:
            with EpisodeWriter(path, append=True) as writer:
                writer.write(healthy("after"))
    assert _temporaries(tmp_path) == []
    assert _ids(path) == ["before", "after"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_live_writers_temporary_is_left_alone(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    first = open_writer(path)
    first.write(healthy("first"))
    (live,) = _temporaries(tmp_path)
    _age([live])  # however long it has been writing
    save(path, [healthy("second")])
    assert live.exists()
    first.close()
    assert _ids(path) == ["first"] and _temporaries(tmp_path) == []


def test_a_temporary_just_created_is_left_alone(tmp_path):
    path = tmp_path / "traces.jsonl"
    young = tmp_path / ".traces.jsonl.abc123.partial"
    young.write_bytes(b"")  # unlocked, but its writer may be about to lock it
    save(path, [healthy()])
    assert young.exists()
    _age([young])
    with pytest.warns(output.LeftoverWarning, match=young.name):
        save(path, [healthy()])
    assert not young.exists()


def test_short_appends_from_many_threads_take_turns(tmp_path):
    path = tmp_path / "traces.jsonl"

    def append(index: int) -> None:
        with EpisodeWriter(path, append=True) as writer:
            writer.write(healthy(f"t{index}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(append, range(40)))
    assert sorted(_ids(path)) == sorted(f"t{i}" for i in range(40))
