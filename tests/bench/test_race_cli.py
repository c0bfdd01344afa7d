"""`callgrove race`'s wiring, without running either trainer: its options reach the race's
settings, its figures print as lines or one JSON object, and without TRL it says how to
install it (the race itself: `benchmarks/trl_race.py`, minutes of CPU)."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from callgrove.bench import race
from callgrove.cli import app

runner = CliRunner()


def fake_runs(settings: race.RaceSettings, seconds: float) -> list[dict]:
    phases = dict.fromkeys(race.PHASES, seconds / len(race.PHASES))
    return [
        {
            "step_seconds": [seconds] * settings.steps,
            "phases": [phases] * settings.steps,
            "episodes": [float(settings.group_size * settings.groups_per_step)] * settings.steps,
            "trained_tokens": [40.0] * settings.steps,
            "rewards": [0.25] * settings.steps,
            "cpu_seconds": seconds * settings.steps,
        }
        for _ in settings.seeds
    ]


def recording_race(monkeypatch, tmp_path):
    """Replace the race by one that records its settings and reports made-up runs."""
    seen = []

    def run_race(settings, out, say):
        seen.append((settings, out))
        figures = {
            "callgrove": race.summary(fake_runs(settings, 2.0)),
            "TRL": race.summary(fake_runs(settings, 3.0)),
        }
        return {"settings": {"steps": settings.steps}, "figures": figures, "speedup": 1.5}

    monkeypatch.setattr(race, "trl_version", lambda: "0")
    monkeypatch.setattr(race, "run_race", run_race)
    return seen


def test_the_options_reach_the_race_and_its_figures_print(monkeypatch, tmp_path):
    seen = recording_race(monkeypatch, tmp_path)
    args = ["race", "--steps", "2", "--seed", "5", "--seed", "6", "--group-size", "3"]
    result = runner.invoke(app, [*args, "--temperature", "1.1", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [(settings, out)] = seen
    assert settings == race.RaceSettings(seeds=(5, 6), steps=2, group_size=3, temperature=1.1)
    assert out == tmp_path
    assert "callgrove step median 2.00 s" in result.stdout
    assert "TRL       step median 3.00 s" in result.stdout
    assert "1.50x TRL's speed (meets the 1.5x target)" in result.stdout


def test_json_is_the_race_on_stdout(monkeypatch, tmp_path):
    recording_race(monkeypatch, tmp_path)
    result = runner.invoke(app, ["race", "--steps", "4", "--json", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"] == {"steps": 4}
    assert report["figures"]["TRL"]["median_s"] == 3.0


def test_without_trl_the_race_says_how_to_install_it(monkeypatch):
    seen = []
    monkeypatch.setattr(race, "run_race", lambda *a, **k: seen.append(a))
    monkeypatch.setitem(sys.modules, "trl", None)  # as if it were not installed
    result = runner.invoke(app, ["race"])
    assert result.exit_code == 2
    assert "callgrove[hf,trl]" in result.stderr and not result.stdout
    assert not seen
