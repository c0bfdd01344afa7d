"""A few-step training run end to end, and a run killed with SIGKILL mid-step, resumed."""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from callgrove.episode import load
from callgrove.orchestrator.config import config_from_dict
from callgrove.orchestrator.loop import steady_heap, train
from callgrove.rows import build_rows, check_rows

TINY = {
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 32},
    "env": {"name": "relay", "options": {"eval_size": 2}},
    "sampling": {"max_tokens": 4},
    "dispatch": {"group_size": 2, "groups_per_step": 2},
    "monitor": {"live": False},
}


def tiny_config(out: Path, **run) -> dict:
    return {**TINY, "run": {"out": str(out), **run}}


class _Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self):
        self.me = self


def test_steady_heap_still_frees_cycles_and_restores_the_collector():
    before = gc.get_threshold()
    with steady_heap(young_threshold=1_000):
        assert gc.get_threshold() == (1_000, *before[1:])
        assert gc.get_freeze_count() > 0  # what existed before is out of the passes
        node = _Node()
        freed = weakref.ref(node)
        del node
        for _ in range(2_000):  # enough new objects for a young pass on its own
            _Node()
        assert freed() is None
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


# A one-step run in a fresh process, then the page faults of allocating 64 MiB again after
# freeing it: none when the run left malloc keeping freed memory.
FAULTS_AFTER_TRAINING = """
import json, resource, sys
from callgrove.orchestrator.config import config_from_dict
from callgrove.orchestrator.loop import train
train(config_from_dict(json.loads(sys.argv[1])))
block = bytearray(64 << 20)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = bytearray(64 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc is not glibc's")
def test_training_keeps_freed_memory_unless_told_not_to(tmp_path):
    pages = (64 << 20) // resource.getpagesize()
    faults = {}
    for keep in (True, False):
        config = tiny_config(tmp_path / str(keep), steps=1, keep_freed_memory=keep)
        run = subprocess.run(
            [sys.executable, "-c", FAULTS_AFTER_TRAINING, json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        faults[keep] = int(run.stdout.split()[-1])
    assert faults[True] < pages // 100 and faults[False] > pages // 2


def test_a_few_steps_end_to_end(tmp_path):
    config = config_from_dict(tiny_config(tmp_path, steps=3, eval_every=2))
    summary = train(config)
    assert (summary.first_step, summary.last_step) == (0, 3)
    steps = [m for m in summary.metrics if not m.get("final")]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        for seat in ("leader", "helper", "fork", "checker"):
            assert f"train/all/{seat}/reward/mean" in m
        assert m["train/forwarded_token_ratio"] > 1.0  # shared histories forwarded once
        assert m["policy/version"] == m["step"]
    assert "eval/all/leader/reward/mean" in steps[1]
    for step in (1, 2, 3):
        episodes = list(load(tmp_path / f"step_{step}" / "train" / "traces.jsonl"))
        assert len(episodes) >= 4
        for episode in episodes:
            assert episode.run.step == step and episode.run.type == "train"
            assert episode.run.policy.start <= episode.run.policy.end <= step - 1
            assert not check_rows(build_rows(episode)).violations
        table = (tmp_path / f"step_{step}" / "train" / "samples.jsonl").read_text().splitlines()
        assert {"agent", "branch_idx", "text", "reward", "advantage"} <= set(json.loads(table[0]))
    evaluated = list(load(tmp_path / "step_2" / "eval" / "traces.jsonl"))
    assert len(evaluated) == 2 and {(e.run.policy.start, e.run.policy.end) for e in evaluated} == {
        (2, 2)
    }
    assert summary.plot is not None and summary.plot.stat().st_size > 1000
    assert (tmp_path / "config.toml").exists() and (tmp_path / "checkpoint.pt").exists()
    # Everything dispatched and not trained at the end is written once, with why.
    for episode in load(tmp_path / "unused" / "train" / "traces.jsonl"):
        assert episode.ok or [e.type for e in episode.errors] == ["Cancelled"]


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        json.loads(line)
        for line in path.read_text().splitlines(keepends=True)
        if line.endswith("\n")
    ]


def _command(config: Path) -> list[str]:
    run = "from callgrove.cli import main; main()"
    return [sys.executable, "-c", run, "train", str(config), "--quiet"]


def test_sigkill_mid_step_then_resume_loses_and_repeats_nothing(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "c.toml"
    config.write_text(
        "\n".join(
            [
                f'[run]\nsteps = 6\nout = "{out}"',
                "[model]\nd_model = 16\nn_heads = 2\nd_ff = 32",
                '[env]\nname = "relay"',
                "[dispatch]\ngroup_size = 2\ngroups_per_step = 2",
                "[monitor]\nlive = false\nplot = false",
            ]
        )
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    process = subprocess.Popen(
        _command(config), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 240
    while len(_metrics(out)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = [m["step"] for m in _metrics(out)]
    assert finished and finished == list(range(1, len(finished) + 1))
    before = {
        step: (out / f"step_{step}" / "train" / "traces.jsonl").read_bytes() for step in finished
    }

    resumed = subprocess.run(_command(config), env=env, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()
    lines = _metrics(out)
    assert [m["step"] for m in lines if not m.get("final")] == [1, 2, 3, 4, 5, 6]
    assert lines[-1].get("final")
    seen: set[str] = set()
    for step in range(1, 7):
        path = out / f"step_{step}" / "train" / "traces.jsonl"
        raw = path.read_bytes()
        assert raw.endswith(b"\n")
        episodes = list(load(path))
        assert len(episodes) == len(raw.splitlines())
        for episode in episodes:
            assert episode.id not in seen, f"episode {episode.id} written twice"
            seen.add(episode.id)
            assert episode.run.step == step
    # Steps checkpointed before the kill are kept byte for byte (the last step whose metrics
    # line was written may have died before its checkpoint; then it was redone whole).
    for step in finished[:-1]:
        assert (out / f"step_{step}" / "train" / "traces.jsonl").read_bytes() == before[step]
    assert not list(out.rglob("*.partial"))  # temporaries of writes the kill cut short are gone


def test_every_step_writes_where_its_seconds_went(tmp_path):
    """Each metrics line splits the step's seconds by phase; the phases are parts of the step,
    so they add up to no more than it, and the learner's own phases took time."""
    from callgrove.orchestrator.monitors import STEP_PHASES

    summary = train(config_from_dict(tiny_config(tmp_path, steps=2, eval_every=2)))
    steps = [m for m in summary.metrics if not m.get("final")]
    assert len(steps) == 2
    for m in steps:
        phases = {phase: m[f"time/{phase}_s"] for phase in STEP_PHASES}
        assert all(seconds >= 0 for seconds in phases.values()), phases
        assert sum(phases.values()) <= m["time/step_s"]
        assert phases["forward_backward"] > 0 and phases["optimizer"] > 0
        assert phases["batching"] > 0 and phases["write"] > 0
        # The learner's phases are within its thread's time, the wait splits in two.
        learner = phases["forward_backward"] + phases["optimizer"]
        assert learner <= m["time/train_s"]
        assert phases["sampling"] + phases["scoring"] == pytest.approx(m["time/wait_s"])
    assert steps[1]["time/eval_s"] > 0  # step 2 evaluated
