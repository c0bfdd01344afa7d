"""`callgrove race`'s wiring, without running either trainer: its options reach the race's
settings, its figures print as lines or one JSON object, and without TRL it says how to
install it (the race itself: `benchmarks/trl_race.py`, minutes of CPU)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
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
        settings_json = dataclasses.asdict(settings)
        return {"settings": settings_json, "figures": figures, "speedup": 1.5}

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
    assert "(hf sampler) is 1.50x TRL's speed (meets the 1.5x target)" in result.stdout


def test_the_vllm_sampler_is_held_to_its_own_target(monkeypatch, tmp_path):
    seen = recording_race(monkeypatch, tmp_path)
    args = ["race", "--sampler", "vllm", "--vllm-python", "/opt/v/bin/python"]
    result = runner.invoke(app, [*args, "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [(settings, _)] = seen
    assert (settings.sampler, settings.vllm_python) == ("vllm", "/opt/v/bin/python")
    assert "(vllm sampler) is 1.50x TRL's speed (BELOW the 3.0x target)" in result.stdout


def test_an_unknown_sampler_is_refused():
    result = runner.invoke(app, ["race", "--sampler", "sglang"])
    assert result.exit_code == 2 and "sglang" in result.output
    with pytest.raises(ValueError, match="sampler 'sglang': one of hf, vllm"):
        race.RaceSettings(sampler="sglang")


def test_a_vllm_run_leaves_its_cpu_figures_out():
    settings = race.RaceSettings(steps=2)
    runs = [{**run, "cpu_seconds": None} for run in fake_runs(settings, 2.0)]
    figures = race.summary(runs)
    assert figures["episodes_per_cpu_s"] is None and figures["tokens_per_cpu_s"] is None
    assert figures["episodes_per_s"] == 4.0


def test_json_is_the_race_on_stdout(monkeypatch, tmp_path):
    recording_race(monkeypatch, tmp_path)
    result = runner.invoke(app, ["race", "--steps", "4", "--json", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["steps"] == 4 and report["settings"]["sampler"] == "hf"
    assert report["figures"]["TRL"]["median_s"] == 3.0


def test_without_trl_the_race_says_how_to_install_it(monkeypatch):
    seen = []
    monkeypatch.setattr(race, "run_race", lambda *a, **k: seen.append(a))
    monkeypatch.setitem(sys.modules, "trl", None)  # as if it were not installed
    result = runner.invoke(app, ["race"])
    assert result.exit_code == 2
    assert "callgrove[hf,trl]" in result.stderr and not result.stdout
    assert not seen
