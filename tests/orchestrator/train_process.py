"""`callgrove train` as a real process for the kill-and-resume tests: a config file, the command,
its metrics lines, and what a run folder trained and dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from callgrove.episode import load

ROOT = Path(__file__).resolve().parents[2]
# `tests/` too, where the environments the tests name live (`orchestrator.misbehaving_envs`).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}


def write_config(
    path: Path, out: Path, steps: int, *extra: str, env: str = "relay", dispatch: str = ""
) -> Path:
    """A tiny run of `steps` steps of `env` into `out` (`dispatch`: more `[dispatch]` lines;
    `extra`: more TOML lines)."""
    path.write_text(
        "\n".join(
            [
                f'[run]\nsteps = {steps}\nout = "{out}"',
                "[model]\nd_model = 16\nn_heads = 2\nd_ff = 32",
                f'[env]\nname = "{env}"',
                "[sampling]\nmax_tokens = 4",
                f"[dispatch]\ngroup_size = 2\ngroups_per_step = 2\n{dispatch}",
                "[monitor]\nlive = false\nplot = false",
                *extra,
            ]
        )
        + "\n"
    )
    return path


def command(config: Path, *args: str) -> list[str]:
    run = "from callgrove.cli import main; main()"
    return [sys.executable, "-c", run, "train", str(config), "--quiet", *args]


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        json.loads(line)
        for line in path.read_text().splitlines(keepends=True)
        if line.endswith("\n")
    ]


def steps_done(out: Path) -> int:
    return max((m["step"] for m in metrics(out) if not m.get("final")), default=0)


def start(config: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(command(config, *args), env=ENV, stdout=subprocess.PIPE, **popen)


def kill_after(process: subprocess.Popen, out: Path, step: int, how=signal.SIGKILL) -> None:
    """Send `how` once `step` steps are written (within a bounded time)."""
    deadline = time.monotonic() + 240
    while steps_done(out) < step and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be stopped"
    process.send_signal(how)


def finish(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command run to its end within `timeout` seconds, which must succeed."""
    done = subprocess.run(command(config, *args), env=ENV, capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done


def episodes(out: Path) -> list:
    """Every episode the folder holds: its steps' (trained or dropped) and the unused ones."""
    paths = [*sorted(out.glob("step_*/train/traces.jsonl")), out / "unused/train/traces.jsonl"]
    return [episode for path in paths if path.exists() for episode in load(path)]


def account(out: Path, steps: int) -> dict:
    """What the folder's steps hold: episodes dropped as stale, and how many times each
    episode, group and call was trained."""
    stale = 0
    episodes: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    calls: Counter[tuple[str, str]] = Counter()
    for step in range(1, steps + 1):
        for episode in load(out / f"step_{step}" / "train" / "traces.jsonl"):
            assert episode.run.step == step
            if (episode.meta or {}).get("dropped") == "stale":
                stale += 1
                continue
            episodes[episode.id] += 1
            groups[f"{episode.group}@step{step}"] += 1
            calls.update((episode.id, call.id) for call in episode.calls())
    trained_groups = Counter(name.split("@")[0] for name in groups)
    return {
        "stale": stale,
        "episodes": episodes,
        "groups": trained_groups,
        "calls": calls,
        "final": [m for m in metrics(out) if m.get("final")],
    }
