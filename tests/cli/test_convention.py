"""One CLI convention (docs/cli.md): machine-readable output on stdout with --json, files with -o,
the same --executor choices and capitalised help everywhere, -V."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
GROUP = EXAMPLES / "login_group.jsonl"
CLAUDE_SESSION = ROOT / "tests/data/claude_code/fresh_subagent"
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def commands():
    def walk(group, path=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, (*path, name))
            else:
                yield (*path, name), command

    return list(walk(typer.main.get_command(app)))


def json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing on stdout"
    return [json.loads(line) for line in lines]


def test_json_output_on_stdout_in_every_command(tmp_path):
    """Each command's --json is JSON on stdout and nothing else there, its figures the same
    the files and tables say."""
    group = list(load(GROUP))
    rows = json_lines(run("rows", GROUP, "--json").stdout)
    assert {row["episode"] for row in rows} == {e.id for e in group}
    [check] = json_lines(run("check", GROUP, "--json").stdout)
    assert check["total"]["rows"] == len(rows)
    shown = json_lines(run("show", GROUP, "--json").stdout)
    assert [s["episode"] for s in shown] == [e.id for e in group]
    assert sum(len(s["rows"]) for s in shown) == len(rows)
    assert all(
        len(s["calls"]) == sum(len(a.calls) for a in e.agents)
        for s, e in zip(shown, group, strict=True)
    )
    [stats] = json_lines(run("stats", GROUP, "--json").stdout)
    assert stats
    [samples] = json_lines(
        run("samples", GROUP, "--algorithm", "grpo", "-o", tmp_path / "s.jsonl", "--json").stdout
    )
    assert samples["samples"] == len(rows)
    converted = run("convert", GROUP, tmp_path / "c.parquet", "--json")
    [summary] = json_lines(converted.stdout)
    assert summary["episodes"] == len(group) == len(list(load(tmp_path / "c.parquet")))
    imported = run("import", "claude-code", CLAUDE_SESSION, "-o", tmp_path / "i.jsonl", "--json")
    [report] = json_lines(imported.stdout)
    assert [e["episode"] for e in report["episodes"]] == [e.id for e in load(tmp_path / "i.jsonl")]


def test_import_json_needs_a_file_for_the_episodes():
    result = run("import", "claude-code", CLAUDE_SESSION, "--json")
    assert result.exit_code == 2 and "-o FILE" in result.stderr and not result.stdout


def test_show_json_and_picture_together(tmp_path):
    result = run("show", EXAMPLES / "login_bug.jsonl", "--json", "-o", tmp_path / "p.svg")
    assert result.exit_code == 0
    [record] = json_lines(result.stdout)
    assert record["check"]["ok"] and (tmp_path / "p.svg").read_text().startswith("<svg")
    trained = [c["trained_in_row"] for c in record["calls"]]
    assert None not in trained and sorted(set(trained)) == [r["row"] for r in record["rows"]]


def test_no_command_has_a_jsonl_flag_or_a_json_file_option():
    """--json is a flag everywhere (stdout); files are -o."""
    for path, command in commands():
        for param in command.params:
            assert "--jsonl" not in param.opts, path
            if "--json" in param.opts:
                assert param.is_flag, (path, "--json takes a value")


def test_every_file_output_is_o():
    for path, command in commands():
        for param in command.params:
            if "--out" in param.opts:
                assert "-o" in param.opts, path


def test_every_executor_lists_its_choices():
    found = []
    for path, command in commands():
        for param in command.params:
            if "--executor" in param.opts:
                result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "300"})
                line = next(x for x in result.stdout.splitlines() if "--executor" in x)
                assert re.search(r"<\w+(\|\w+)+>", line), (path, line)
                found.append(path)
    assert {("rows",), ("stats",), ("convert",), ("train",)} <= set(found)


def test_every_help_text_starts_with_a_capital():
    """Help of every option and argument of every command reads as a sentence."""
    checked = 0
    for path, command in commands():
        for param in command.params:
            text = getattr(param, "help", None)
            if text:
                assert not re.match(r"[a-z]", text), (path, param.opts, text)
                checked += 1
    assert checked > 100


def test_short_version():
    assert run("-V").stdout == run("--version").stdout
    assert run("-V").stdout.startswith("callgrove ")


def test_show_summary_names_the_options_the_readme_uses():
    summary = typer.main.get_command(app).commands["show"].help
    first = summary.split("\n\n")[0]
    assert "-o FILE.svg" in first and "--json" in first
    readme = (ROOT / "README.md").read_text()
    assert "callgrove show FILE... [--episode ID] [-o out.svg\\|out.html]" in readme


@pytest.mark.parametrize("flag", ["--json", "-o"])
def test_bench_follows_the_convention(tmp_path, flag):
    args = ["bench", "--episodes-4k", "2", "--episodes-16k", "0", "--rounds", "1"]
    args += ["--no-memory", "--no-gym", "--no-verifiers", "--malloc-defaults"]
    args += ["--dir", tmp_path]
    if flag == "--json":
        result = run(*args, "--json")
        [figures] = json_lines(result.stdout)
    else:
        result = run(*args, "-o", tmp_path / "b.json", "-o", tmp_path / "b.md")
        figures = json.loads((tmp_path / "b.json").read_text())
        assert (tmp_path / "b.md").read_text().startswith("# callgrove bench")
    assert result.exit_code in (0, 1), result.output  # 1: a target missed at this tiny size
    assert {m["context"] for m in figures["measurements"]} == {"4k"}


def test_bench_refuses_an_output_of_another_form(tmp_path):
    result = run("bench", "-o", tmp_path / "b.txt")
    assert result.exit_code == 2 and ".json or .md" in result.stderr


def test_every_command_is_in_the_readme_table_and_docs_cli():
    readme = (ROOT / "README.md").read_text()
    table = (ROOT / "docs/cli.md").read_text()
    for path, _command in commands():
        name = path[0]
        assert f"`callgrove {name}" in readme, name
        assert f"`{name}" in table, name
