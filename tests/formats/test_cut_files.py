"""Files cut off mid-write: what is kept, what is reported, and appending after a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from callgrove.episode import EpisodeWriter, load, save
from callgrove.formats.problems import Diagnostics, InputError

EXAMPLES = Path(__file__).parents[2] / "examples"


def group():
    return list(load(EXAMPLES / "login_group.jsonl"))


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_file_cut_short_keeps_complete_episodes_and_is_an_error(tmp_path, suffix):
    # Enough episodes for several compressed blocks: a cut block loses what it holds.
    episodes = [e for copy in range(60) for e in group() if not setattr(e, "id", f"{e.id}-{copy}")]
    path = tmp_path / f"episodes{suffix}"
    save(path, episodes)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    diagnostics = Diagnostics()
    kept = [e.id for e in load(path, diagnostics)]
    assert 0 < len(kept) < len(episodes)
    assert kept == [e.id for e in episodes[: len(kept)]]  # a prefix, each episode whole
    (problem,) = diagnostics.problems  # what follows the cut is lost: an error
    assert problem.severity == "error" and problem.kind == "truncated"
    assert problem.file == str(path)


def test_zstd_file_appended_in_several_frames_reads_whole(tmp_path):
    path = tmp_path / "episodes.jsonl.zst"
    episodes = group()
    with EpisodeWriter(path) as writer:
        writer.write(episodes[0])
    with EpisodeWriter(path, append=True) as writer:
        for episode in episodes[1:]:
            writer.write(episode)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == [e.id for e in episodes]
    assert not diagnostics.problems


def test_truncated_final_line_without_diagnostics_raises_after_the_whole_lines(tmp_path):
    path = tmp_path / "episodes.jsonl"
    save(path, group())
    data = path.read_bytes()
    path.write_bytes(data[:-50])
    read = []
    with pytest.raises(InputError, match="truncated final line") as raised:
        read.extend(episode.id for episode in load(path))
    assert len(read) == 3
    assert (raised.value.problem.line, raised.value.problem.episode) == (4, "login-bug-g3")


def test_appending_after_a_crash_does_not_lose_the_next_episode(tmp_path):
    path = tmp_path / "traces.jsonl"
    episodes = group()
    save(path, episodes[:2])
    data = path.read_bytes()
    path.write_bytes(data[:-30])  # the second episode's line was cut off by a crash
    with EpisodeWriter(path, append=True) as writer:
        writer.write(episodes[2])
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["login-bug-g0", "login-bug-g2"]
    (problem,) = diagnostics.problems  # the cut line's episode stays lost, and is an error
    assert (problem.line, problem.kind, problem.severity) == (2, "truncated", "error")
