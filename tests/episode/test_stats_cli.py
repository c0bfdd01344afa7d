"""`callgrove stats` as a user runs it: tables, problems on stderr, exit statuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import save

from .helpers import cancelled, env_raised, healthy

runner = CliRunner()
TITLE_IN_FLIGHT = "of which in flight (weights changed while it ran)"
TITLE_IN_QUEUE = "of which in queue (waited after it finished)"


def run(*args: str | Path):
    return runner.invoke(app, ["stats", *map(str, args)])


def row(output: str, first: str) -> list[str]:
    """The cells after `first` in a table line (cells are set apart by two spaces or more)."""
    for line in output.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) > 1 and parts[0] == first:
            return parts[1:]
    raise AssertionError(f"no row {first!r} in:\n{output}")


def cell(output: str, label: str) -> str:
    """The value beside `label` in a two-column table."""
    [value] = row(output, label)
    return value


def histogram(output: str, title: str) -> dict[str, str]:
    """Steps to episodes in the histogram under `title`."""
    lines = output.splitlines()
    start = lines.index(title)
    counts = {}
    for line in lines[start + 1 :]:
        parts = line.split()
        if parts and parts[0].isdigit():
            counts[parts[0]] = parts[-1]
        elif counts:
            break
    return counts


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    save(path, [healthy("ok-1"), healthy("ok-2"), cancelled(), env_raised()])
    return path


def test_tables_count_episodes_agents_errors_and_staleness(traces: Path) -> None:
    result = run(traces)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert cell(out, "episodes") == "4"
    assert cell(out, "ok") == "2 (50.0%)"
    assert cell(out, "without agents") == "2"
    assert cell(out, "calls (kept)") == "6 (6)"
    assert cell(out, "completion tokens") == str(2 * (2 + 1 + 2))
    # agents by name: agents, trainable, calls, kept, prompt tok, completion tok, errors
    assert row(out, "leader") == ["2", "2", "4", "4", str(2 * (3 + 5)), "6", "0"]
    assert row(out, "solver") == ["2", "2", "2", "2", "4", "4", "0"]
    with pytest.raises(AssertionError):  # no phantom seat for the episodes nobody ran
        row(out, "agent")
    assert row(out, "Cancelled") == ["1"]
    assert row(out, "EnvSetupError") == ["1"]
    # the two healthy train episodes: v2..v4 read at their step 6 -> 3 steps, 2 in flight,
    # 1 in queue; the eval one on v4 at step 6 -> 1 step, in queue; the cancelled is frozen.
    # One histogram per quantity, every step between the lowest and the highest listed.
    assert histogram(out, "off-policy steps (total)") == {"1": "1", "2": "0", "3": "2"}
    assert histogram(out, TITLE_IN_FLIGHT) == {"0": "1", "1": "0", "2": "2"}
    assert histogram(out, TITLE_IN_QUEUE) == {"1": "3"}
    assert "frozen policy (never stale): 1" in out


def test_step_option_measures_staleness_at_that_step(traces: Path) -> None:
    result = run(traces, "--step", "10")
    assert result.exit_code == 0, result.output
    total = histogram(result.stdout, "off-policy steps (total)")
    assert total["7"] == "2"  # (10 - 1) - 2
    assert total["5"] == "1"  # eval: (10 - 1) - 4, all in queue
    assert histogram(result.stdout, TITLE_IN_QUEUE)["5"] == "3"


def test_both_forms_and_several_files_add_up(traces: Path, tmp_path: Path) -> None:
    binary = tmp_path / "more.parquet"
    save(binary, [healthy("ok-3"), cancelled("cancelled-2")])
    result = run(traces, binary)
    assert result.exit_code == 0, result.output
    assert cell(result.stdout, "episodes") == "6"
    assert row(result.stdout, "Cancelled") == ["2"]


def test_bad_middle_line_stops_without_skip_bad(traces: Path) -> None:
    lines = traces.read_bytes().splitlines(keepends=True)
    traces.write_bytes(lines[0] + b"{oops\n" + b"".join(lines[1:]))
    result = run(traces)
    assert result.exit_code == 1
    assert f"{traces}:2" in result.stderr and "not valid JSON" in result.stderr
    assert "--skip-bad" in result.stderr
    assert "agents by name" not in result.stdout


def test_skip_bad_skips_counts_and_still_fails_the_exit_status(traces: Path) -> None:
    lines = traces.read_bytes().splitlines(keepends=True)
    traces.write_bytes(lines[0] + b"{oops\n" + b"".join(lines[1:]))
    result = run(traces, "--skip-bad")
    assert result.exit_code == 1
    assert cell(result.stdout, "episodes") == "4"
    assert "skipped 1 unusable" in result.stderr


def test_truncated_final_line_is_an_error_and_exits_one(traces: Path) -> None:
    data = traces.read_bytes()
    traces.write_bytes(data[:-30])
    result = run(traces, "--skip-bad")
    assert result.exit_code == 1, result.output
    assert f"error: {traces}:4: episode" in result.stderr and "its episode is lost" in result.stderr
    assert cell(result.stdout, "episodes") == "3"


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    assert run(tmp_path / "nope.jsonl").exit_code == 2
