"""`callgrove convert` as a user runs it: the files it writes, its summary, its exit statuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

from nemo_gym.token_id_capture import TokenCaptureStore
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load, save
from callgrove.interop.verifiers import read_verifiers
from callgrove.rows import build_rows

from .gym_records import seed_capture, seed_rollout_row, write_rows
from .helpers import multi_agent_episode, read_with_verifiers, row_tokens, write_with_verifiers

runner = CliRunner()


def convert(*args: str | Path):
    return runner.invoke(app, ["convert", *map(str, args)])


def cell(output: str, label: str) -> str:
    """The value beside `label` in a rich table row."""
    match = re.search(rf"{re.escape(label)}\s*[│|]\s*([^│|]+?)\s*[│|]", output)
    assert match, f"no {label!r} row in:\n{output}"
    return match.group(1)


def _rows(path: Path) -> list[list[int]]:
    return [tokens for episode in load(path) for tokens in row_tokens(episode)]


def test_verifiers_to_callgrove_both_forms_and_back(tmp_path: Path) -> None:
    write_with_verifiers(tmp_path, [multi_agent_episode(i) for i in range(3)])
    jsonl, parquet, back = tmp_path / "e.jsonl", tmp_path / "e.parquet", tmp_path / "back"
    result = convert(tmp_path, "--from", "verifiers", "--to", "callgrove", jsonl)
    assert result.exit_code == 0, result.output
    assert cell(result.output, "episodes written") == "3"
    assert cell(result.output, "calls (kept)") == "39 (36)"  # each episode's discarded attempt
    assert convert(jsonl, "--from", "callgrove", "--to", "callgrove", parquet).exit_code == 0
    assert _rows(parquet) == _rows(jsonl)
    back.mkdir()
    result = convert(parquet, "--from", "callgrove", "--to", "verifiers", back)
    assert result.exit_code == 0, result.output
    assert [e.id for e in read_with_verifiers(back)] == ["ep-0", "ep-1", "ep-2"]


def test_gym_with_invocations_reports_what_was_not_converted(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path / "tokens")
    seed_capture(store)
    rows = write_rows(tmp_path / "rollouts.jsonl", [seed_rollout_row()])
    out = tmp_path / "gym.jsonl"
    result = convert(store.root, "--from", "gym", "--invocations", rows, "--to", "callgrove", out)
    assert result.exit_code == 0, result.output
    assert cell(result.output, "agents") == "4"
    assert cell(result.output, "compaction calls") == "1"
    for kind in (
        "empty_generation",
        "model_call_ownership_unavailable",
        "subagent_parent_unavailable",
    ):
        assert cell(result.output, kind) == "1"
    [episode] = load(out)
    assert len(build_rows(episode).rows) == 5


def test_credit_onto_the_original_verifiers_file(tmp_path: Path) -> None:
    source = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    [episode] = read_verifiers(source)
    for call in episode.calls():
        call.advantages = 0.25 if episode.agent_of(call).name == "solver" else None
    credited = tmp_path / "credited.jsonl"
    save(credited, [episode])
    out = tmp_path / "out.jsonl"
    result = convert(credited, "--from", "callgrove", "--to", "verifiers", "--onto", source, out)
    assert result.exit_code == 0, result.output
    traces = json.loads(out.read_text())["traces"]
    assert [n.get("advantages") for n in traces[1]["nodes"]] == [None, [0.25] * 3, None, [0.25]]
    assert all(n.get("advantages") is None for n in traces[0]["nodes"])


def test_bad_lines_stop_or_are_skipped_and_counted(tmp_path: Path) -> None:
    path = write_with_verifiers(tmp_path, [multi_agent_episode(0), multi_agent_episode(1)])
    good = path.read_text().splitlines()
    path.write_text(f"{good[0]}\n{{broken\n{good[1]}\n")
    out = tmp_path / "out.jsonl"
    result = convert(path, "--from", "verifiers", "--to", "callgrove", out)
    assert result.exit_code == 1
    assert f"{path}:2" in result.output and "stopped at the first error" in result.output
    assert not out.exists()  # a conversion stopped by an error writes nothing
    result = convert(path, "--from", "verifiers", "--to", "callgrove", out, "--skip-bad")
    assert result.exit_code == 1
    assert cell(result.output, "episodes written") == "2"
    assert "1 error(s)" in result.output


def test_usage_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    assert convert(missing, "--from", "verifiers", "--to", "callgrove", "o.jsonl").exit_code == 2
    here = write_with_verifiers(tmp_path, [multi_agent_episode(0)])
    result = convert(here, "--from", "verifiers", "--to", "callgrove", "--invocations", here, "o")
    assert result.exit_code == 2 and "--invocations goes with --from gym" in result.output
    assert convert(here, "--from", "nowhere", "--to", "callgrove", "o").exit_code == 2


def test_credit_onto_traces_of_episodes_never_scored_is_refused_or_scored(tmp_path: Path) -> None:
    source = write_with_verifiers(tmp_path, [multi_agent_episode(0), multi_agent_episode(1)])
    uncredited = tmp_path / "uncredited.jsonl"
    save(uncredited, read_verifiers(source))  # read, never scored: no advantages anywhere
    out = tmp_path / "out.jsonl"
    result = convert(uncredited, "--from", "callgrove", "--onto", source, out)
    assert result.exit_code == 1
    assert f"{uncredited}:1: episode ep-0: " in result.output and "--algorithm" in result.output
    assert not out.exists()  # no traces with null advantages were written
    result = convert(
        uncredited, "--from", "callgrove", "--onto", source, out, "--algorithm", "grpo"
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    solver_nodes = [node for row in rows for node in row["traces"][1]["nodes"]]
    assert any(node.get("advantages") is not None for node in solver_nodes)
    result = convert(uncredited, "--from", "callgrove", out, "--algorithm", "grpo")
    assert result.exit_code == 2 and "--algorithm goes with --onto" in result.output
