"""`callgrove race --json` run for real (one short step of each trainer): stdout is the JSON
object alone, whatever TRL, transformers and the loop write meanwhile, which goes to stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.hf]

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]


def test_race_json_is_alone_on_stdout(tmp_path):
    command = [sys.executable, "-c", "from callgrove.cli import main; main()", "race", "--json"]
    settings = ["--steps", "1", "--seed", "0", "--group-size", "2", "--groups-per-step", "1"]
    done = subprocess.run(
        [*command, *settings, "--max-tokens", "4", "--threads", "2", "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    race = json.loads(done.stdout)  # the whole of stdout: one JSON object, nothing else
    assert race["settings"]["steps"] == 1 and set(race["figures"]) == {"callgrove", "TRL"}
    assert "TRL step 1" in done.stderr  # the trainers' own lines are on stderr
