"""The terminal views as a user meets them: escaped input, widths, totals, hints and help."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.cli.rows import rows_table_view
from callgrove.cli.show import forest_view
from callgrove.episode import Agent, Call, Episode, load, save
from callgrove.rows import build_rows

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
CODEX = (
    ROOT
    / "tests/data/real/jazzyalex__agent-sessions/Resources/Fixtures/stage0/agents/codex/small.jsonl"
)
CLAUDE = (
    ROOT / "tests/data/real/d-kimuson__claude-code-viewer/mock-global-claude-dir/projects/"
    "sample-project/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
)
runner = CliRunner()
MARKUP_ID = "[trimmed for fixture]"


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def chain_episode(episode_id: str, calls: int, call_prefix: str = "C", **extra) -> Episode:
    """One agent whose every call resends the previous call's tokens: a linear chain."""
    agent = Agent(id=f"{call_prefix}agent", name="leader")
    prompt: list[int] = [1, 2]
    for seq in range(1, calls + 1):
        agent.add(Call.make(f"{call_prefix}{seq}", seq, list(prompt), [seq + 100]))
        prompt += [seq + 100, seq + 200]
    return Episode(episode_id, agents=[agent], **extra)


def rendered(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, highlight=False)
    console.print(renderable)
    return console.export_text().splitlines()


def test_markup_in_ids_and_paths_prints_as_written(tmp_path):
    path = tmp_path / "odd.jsonl"
    save(path, [chain_episode(MARKUP_ID, 2, call_prefix="[bold]c", rewards={"r": 1.0})])
    for command in ("rows", "show", "check"):
        result = run(command, path)
        assert result.exit_code == 0, result.output
        assert MARKUP_ID in result.stdout, command
    assert "[bold]c1" in run("show", path).stdout
    out = tmp_path / "out[bold].parquet"
    written = run("rows", path, "-o", out)
    assert written.exit_code == 0 and out.is_file()
    assert f"to {out}" in written.stderr


def test_show_folds_an_80_call_chain_and_keeps_branches():
    result = build_rows(chain_episode("long", 80))
    lines = rendered(forest_view(result), 100)
    assert max(len(line) for line in lines) <= 100
    assert len(lines) == 2 and "C1 → … → C80" in lines[1] and "80 calls" in lines[1]
    example = rendered(forest_view(_example()), 100)
    assert any("C1 → C3 → C7" in line for line in example)  # short runs name every call
    assert sum("C8 " in line or "C10 " in line for line in example) == 2  # the branch stays


def test_rows_keep_one_line_per_row_at_100_columns_with_long_ids():
    long = chain_episode("real", 85, call_prefix="main/msg_01Bm4U8urWjXsKBx8t4Jy1Dg_")
    lines = rendered(rows_table_view(build_rows(long), 100), 100)
    assert max(len(line) for line in lines) <= 100
    [row] = [line for line in lines if line.lstrip().startswith("0 ")]
    assert "#1 … #85 (85 calls)" in row
    assert "no reward" in row  # never scored: not a made-up 0


@pytest.mark.parametrize("width", [80, 100])
def test_rows_read_at_80_columns_numbers_and_names_whole(width):
    """Long ids are clipped, never the numbers, the reward or the field names."""
    long = chain_episode("real", 85, call_prefix="main/msg_01Bm4U8urWjXsKBx8t4Jy1Dg_")
    helper = Agent(id="agent-a2271d1-general-purpose", name="general-purpose")
    for seq in range(1, 6):
        helper.add(Call.make(f"toolu_01JJTqp8T9YB5aypTWAUV5ZK_{seq}", seq, [5] * seq * 9000, [7]))
    long.agents.append(helper)
    result = build_rows(long)
    lines = rendered(rows_table_view(result, width), width)
    assert max(len(line) for line in lines) <= width
    header = " ".join(" ".join(lines[1 : lines.index(next(x for x in lines if "──" in x))]).split())
    for name in ("row", "leaf", "agent", "path", "reward"):
        assert re.search(rf"\b{name}\b", header), header
    assert header.replace("_ ", "_").count("tokens") == 2, header
    for row in result.rows:
        [line] = [line for line in lines if re.match(rf"\s*{row.index}\s", line)]
        numbers = rf"\s{row.num_tokens:,}\s+{result.num_loss_tokens(row):,}\s+no reward$"
        assert re.search(numbers, line.rstrip()), line
        # the path, whole or named by seq numbers (agents' names take room first)
        assert "#" in line or " ".join(c.id for c in row.path) in line
    assert "…" not in header


def test_rows_of_many_episodes_print_a_summary_and_say_how_to_see_one(tmp_path):
    path = tmp_path / "many.jsonl"
    save(path, [chain_episode(f"ep{n}", 3, rewards={"r": 1.0}) for n in range(12)])
    result = run("rows", path)
    assert result.exit_code == 0
    assert "episode ep0\n" not in result.stdout  # no table per episode
    lines = {
        parts[0]: parts[-1]
        for line in result.stdout.splitlines()
        if len(parts := re.split(r"\s{2,}", line.strip())) == 2
    }
    assert lines["episodes"] == "12" and lines["rows"] == "12"
    assert "check: 36 kept calls in 12 episodes, each trained exactly once" in result.stdout
    assert f"callgrove rows {path} --episode ep0" in result.stdout
    one = run("rows", path, "--episode", "ep3")
    assert "episode ep3" in one.stdout and "ep4" not in one.stdout


def test_thousands_separators_in_totals(tmp_path):
    path = tmp_path / "big.jsonl"
    save(path, [chain_episode(f"ep{n}", 30, rewards={"r": 1.0}) for n in range(8)])
    result = run("rows", path)
    tokens = next(line for line in result.stdout.splitlines() if "num_tokens" in line)
    assert tokens.split()[-1] == f"{8 * (2 + 30 * 2 - 1):,}"


def test_check_ends_with_a_total_and_speaks_json():
    result = run("check", EXAMPLES / "login_group.jsonl")
    assert result.stdout.rstrip().splitlines()[-1] == (
        "total: 48 kept calls in 4 episodes, each trained exactly once"
    )
    data = json.loads(run("check", "--json", EXAMPLES / "login_group.jsonl").stdout)
    assert data["total"] == {
        "episodes": 4, "failed_to_read": 0, "lost_calls": 0, "read_twice": 0, "kept_calls": 48,
        "rows": 20, "violations": 0, "exactly_once": True, "ok": True,
    }  # fmt: skip
    assert [e["episode"] for e in data["episodes"]] == [f"login-bug-g{n}" for n in range(4)]


@pytest.mark.parametrize("command", ["rows", "check", "show", "stats", "convert"])
def test_harness_files_get_a_hint_not_an_error_per_line(command):
    out = ["out.jsonl"] if command == "convert" else []
    result = run(command, CODEX, *out)
    assert result.exit_code == 2
    assert "callgrove import codex" in result.stderr
    assert result.stderr.count("\n") == 1
    claude = run(command, CLAUDE, *out)
    assert claude.exit_code == 2 and "callgrove import claude-code" in claude.stderr


def test_tokens_without_jsonl_is_refused_not_ignored():
    result = run("rows", EXAMPLES / "login_bug.jsonl", "--tokens")
    assert result.exit_code == 2 and "--json" in result.stderr


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("callgrove ")


@pytest.mark.parametrize("command", ["rows", "check", "show", "stats"])
def test_help_lists_the_formats_and_has_plain_usage(command):
    result = run(command, "--help")
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert usage.split()[-1] == "FILE..."
    text = " ".join(result.stdout.split())
    for form in (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow"):
        assert form in text


def _commands(group, path=()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):  # a group: its own commands too
            yield from _commands(command, (*path, name))


def test_every_output_option_has_the_short_o():
    import typer

    outs = [
        (path, param.opts)
        for path, command in _commands(typer.main.get_command(app))
        for param in command.params
        if "--out" in param.opts
    ]
    assert len(outs) >= 6  # rows, show, import claude-code / codex / join, train, ...
    assert all("-o" in opts for _, opts in outs), outs


@pytest.mark.parametrize("command", ["synth", "convert"])
def test_an_output_argument_may_also_be_given_as_o(command, tmp_path):
    given = [EXAMPLES / "login_group.jsonl"] if command == "convert" else ["-n", "2"]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert run(command, *given, first).exit_code == 0
    assert run(command, *given, "-o", second).exit_code == 0
    assert [e.id for e in load(first)] == [e.id for e in load(second)]
    both = run(command, *given, first, "-o", second)
    neither = run(command, *given)
    for refused in (both, neither):
        assert refused.exit_code == 2 and "as the OUT argument or as -o OUT" in refused.stderr


def test_every_help_has_plain_names_and_unwrapped_paragraphs():
    """No annotation tags (`<list[Path]>`, `<bool>`), no `{FILE}` braces, and each paragraph of
    a command's help on one line at a wide terminal (the terminal wraps, not the source)."""
    import typer

    root = typer.main.get_command(app)
    checked = 0
    for path, command in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"}, terminal_width=400)
        assert result.exit_code == 0, (path, result.output)
        text = result.stdout
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert not re.search(r"[<{]", usage), (path, usage)
        assert "<list[" not in text and "<bool>" not in text, (path, text)
        lines = [line.strip(" │") for line in text.splitlines()]
        for paragraph in (command.help or "").split("\n\n"):
            if paragraph and not paragraph.startswith("\b"):
                whole = " ".join(paragraph.split())[:380]
                assert any(whole in line for line in lines), (path, whole, text)
        checked += 1
    assert checked >= 15  # every command, the import group's too


def _example():
    [episode] = load(EXAMPLES / "login_bug.jsonl")
    return build_rows(episode)


def test_stats_reads_like_an_rl_engineer_looks(tmp_path):
    """Rewards overall, per seat and per group; advantages; rows; no empty tables."""
    import callgrove as cg

    episodes = list(cg.load(EXAMPLES / "login_group.jsonl"))
    cg.finalize_group(cg.GRPO(), episodes)
    path = tmp_path / "scored.jsonl"
    save(path, episodes)
    result = run("stats", path)
    assert result.exit_code == 0, result.output
    text = result.stdout
    rewards = [e.reward for e in episodes]
    mean = sum(rewards) / len(rewards)
    line = next(line.split() for line in text.splitlines() if line.strip().startswith("all "))
    assert line[:3] == ["all", "4", f"{mean:,.4g}"]
    assert line[4:] == [f"{min(rewards):g}", f"{max(rewards):g}"]
    assert "seat leader" in text and "group grp-login" in text
    assert "advantages (per call)" in text
    assert "num_loss_tokens" in text and "duplicate rows (no loss)" in text
    assert "errors by type" not in text  # nothing to show, nothing printed
    data = json.loads(run("stats", "--json", path).stdout)
    assert data["rewards"]["all"]["count"] == 4
    assert data["rewards"]["all"]["mean"] == pytest.approx(mean)
    assert data["rows"]["rows"] == 20 and data["ok_rate"] == 1.0
    assert data["advantages"]["all"]["count"] == 48


@pytest.mark.parametrize("command", ["stats", "show", "rows"])
def test_terminal_views_fit_80_columns_without_cutting_words(command, tmp_path, monkeypatch):
    import callgrove as cg
    from callgrove.cli.app import out

    episodes = list(cg.load(EXAMPLES / "login_group.jsonl"))
    cg.finalize_group(cg.GRPO(), episodes)
    long = chain_episode("real-session", 85, call_prefix="main/msg_01Bm4U8urWjXsKBx8t4Jy1Dg_")
    path = tmp_path / "mixed.jsonl"
    save(path, [*episodes[:2], long])
    monkeypatch.setattr(out, "width", 80)
    result = run(command, path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    headers = [line for line in lines if "tokens" in line and not re.search(r"\d", line)]
    assert headers and not any("…" in line for line in headers), headers


def test_never_scored_episodes_say_no_reward(tmp_path):
    path = tmp_path / "imported.jsonl"
    save(path, [chain_episode("imported", 3, objective="supervised")])
    stats = run("stats", path).stdout
    assert "rewards: no reward (1 episodes never scored)" in stats
    assert "no reward" in run("show", path).stdout
    assert "no reward" in run("rows", path).stdout
    [record] = [json.loads(line) for line in run("rows", "--json", path).stdout.splitlines()]
    assert record["objective"] == "supervised"
    assert json.loads(run("stats", "--json", path).stdout)["rewards"]["all"]["mean"] is None
    svg, html = tmp_path / "imported.svg", tmp_path / "imported.html"
    assert (
        run("show", path, "-o", svg).exit_code == 0 and run("show", path, "-o", html).exit_code == 0
    )
    for picture in (svg.read_text(), html.read_text()):
        assert "no reward" in picture and "reward 0" not in picture


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_an_importer_given_an_episode_file_says_what_it_is(tmp_path, harness):
    out = tmp_path / "out.jsonl"
    result = run("import", harness, EXAMPLES / "login_bug.jsonl", "-o", out)
    assert result.exit_code == 1 and not out.exists()
    assert "this is a callgrove episode file" in result.stderr
    assert "`callgrove rows`" in result.stderr
    assert "imported episodes" not in result.stderr  # no empty table
    assert "supervised training" not in result.stderr  # nothing was imported to say it of


def test_the_readme_shows_what_the_commands_print_and_draw():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [table] = re.findall(r"```text\n(.*?)```", readme, re.DOTALL)
    printed = run("rows", EXAMPLES / "login_bug.jsonl").stdout
    assert [line.rstrip() for line in printed.splitlines()] == table.rstrip("\n").splitlines()
    from callgrove.pictures import layout, render_svg

    picture = (ROOT / "docs" / "login_bug.svg").read_text(encoding="utf-8")
    assert picture == render_svg(layout(_example()))  # docs/login_bug.svg is current
    assert "](docs/login_bug.svg)" in readme


def test_convert_reads_what_the_input_holds_and_writes_what_the_output_is_named(tmp_path):
    episodes = tmp_path / "episodes.jsonl"
    result = run("convert", EXAMPLES / "login_group.jsonl", episodes)
    assert result.exit_code == 0, result.output
    assert "as callgrove" in result.stderr
    traces = tmp_path / "traces.jsonl"
    assert run("convert", episodes, traces).exit_code == 0  # named like verifiers' file
    back = tmp_path / "back.parquet"
    result = run("convert", traces, back)
    assert result.exit_code == 0 and "as verifiers" in result.stderr
    assert [e.id for e in load(back)] == [f"login-bug-g{n}" for n in range(4)]


def test_help_paragraphs_are_not_hard_wrapped():
    """Help text reaches the terminal one line per paragraph; the terminal wraps it."""

    def commands(typer_app):
        yield from typer_app.registered_commands
        for group in typer_app.registered_groups:
            yield from commands(group.typer_instance)

    helps = [command.help for command in commands(app)]
    assert len(helps) > 8 and all(helps)
    for text in helps:
        for paragraph in text.split("\n\n"):
            assert "\n" not in paragraph, paragraph


def test_show_tells_fresh_fork_and_background_subagents_apart(tmp_path):
    from callgrove.synth import Shape, synth_episode

    episode = synth_episode(Shape(leader_calls=6, forks=1, subagent_calls=2, context=96), 0)
    for agent in episode.agents:
        if agent.parent is not None:
            agent.name = "subagent"  # as the gateway names every subagent
    path = tmp_path / "e.jsonl"
    save(path, [episode])
    result = run("show", path)
    assert result.exit_code == 0, result.output
    for start in ("fresh", "fork", "background"):
        assert f"·subagent ({start})" in result.stdout, start
    assert "L·leader (" not in result.stdout  # the leader has no start kind to tell
