"""The progress bar moves with the bytes read inside one file, and shows its units."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from callgrove.cli.app import ReadPosition, progress_bar, reading
from callgrove.episode import Agent, Call, Episode, load, save


@pytest.fixture(scope="module")
def long_file(tmp_path_factory) -> Path:
    """400 episodes of random tokens: long, and not squeezed into one buffer by compression."""
    random = np.random.default_rng(0)
    episodes = []
    for number in range(400):
        agent = Agent(id="a", name="leader")
        prompt = random.integers(0, 50_000, 300).tolist()
        for seq in range(1, 4):
            completion = random.integers(0, 50_000, 40).tolist()
            agent.add(Call.make(f"c{seq}", seq, list(prompt), completion))
            prompt += completion
        episodes.append(Episode(f"e{number}", agents=[agent], rewards={"r": 1.0}))
    path = tmp_path_factory.mktemp("progress") / "long.jsonl"
    save(path, episodes)
    return path


def shown(progress) -> str:
    console = Console(width=160, record=True, highlight=False)
    console.print(progress.get_renderable())
    return console.export_text()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow"])
def test_bar_follows_the_bytes_read_within_one_file(long_file, tmp_path, monkeypatch, suffix):
    path = tmp_path / f"long{suffix}"
    save(path, load(long_file))
    monkeypatch.setattr(importlib.import_module("callgrove.cli.app"), "_LOOK_EVERY_S", 0.0)
    progress = progress_bar("bytes")
    completed, texts = [], []
    for number, _episode in enumerate(reading(progress, path, load(path)), start=1):
        if number % 50 == 0:
            [task] = progress.tasks
            completed.append(task.completed)
            texts.append(shown(progress))
    [task] = progress.tasks
    size = path.stat().st_size
    inside = [c for c in completed if 0 < c < size]
    assert len(inside) >= 4, (completed, size)  # the bar moved before the file was done
    assert completed == sorted(completed) and len(set(completed)) >= 4
    assert task.completed == size and task.description == f"long{suffix} · 400 episodes"
    assert "· 100 episodes" in texts[1]


def test_bar_shows_bytes_with_units_and_counts_with_theirs():
    progress = progress_bar("bytes")
    progress.add_task("big.jsonl · 12 episodes", total=3_400_000, completed=1_200_000)
    assert "1.2/3.4 MB" in shown(progress)
    counted = progress_bar("episodes")
    counted.add_task("captures", total=40, completed=3)
    assert "3/40 episodes" in shown(counted)


def test_position_is_found_whoever_opened_the_file(long_file):
    position = ReadPosition(long_file)
    assert position.bytes() == 0  # not open yet
    with long_file.open("rb", buffering=0) as stream:
        stream.read(5000)
        assert position.bytes() == 5000
        stream.read(300)
        assert position.bytes() == 5300
    assert position.bytes() == 5300  # closed: the last position read stays
