"""`callgrove rows --scheme`: the rows a baseline scheme makes, and a clear refusal of others."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from callgrove.cli import app

LOGIN_BUG = Path(__file__).parents[2] / "examples" / "login_bug.jsonl"
runner = CliRunner()


def trains(*options: str) -> list[tuple[str, list[str]]]:
    result = runner.invoke(app, ["rows", str(LOGIN_BUG), "--json", *options])
    assert result.exit_code == 0, result.output
    return [(r["leaf"], r["trains"]) for r in map(json.loads, result.stdout.splitlines())]


def test_rows_scheme_selects_the_baseline():
    assert trains() == trains("--scheme", "exactly_once")
    assert trains("--scheme", "leader_only") == [
        ("C10", ["C1", "C3", "C7", "C10"]),
        ("C12", ["C11", "C12"]),
    ]
    per_agent = dict(trains("--scheme", "per_agent"))
    assert per_agent["C9"] == ["C1", "C3", "C7", "C8", "C9"]  # the fork trains L's history too


def test_rows_scheme_refuses_an_unknown_one_and_labels_the_check():
    result = runner.invoke(app, ["rows", str(LOGIN_BUG), "--scheme", "twice"])
    assert result.exit_code == 2
    assert "--scheme must be one of exactly_once" in result.output
    shown = runner.invoke(app, ["rows", str(LOGIN_BUG), "--scheme", "per_agent"])
    assert "check of the exactly-once rules (--scheme per_agent trains otherwise)" in shown.output
