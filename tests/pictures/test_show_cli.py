"""`callgrove show --svg / --html` as a user runs it: which files appear, and what they hold."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.cli.show import svg_file_names

from .episodes import LOGIN_BUG, LOGIN_GROUP
from .test_svg import GOLDEN

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def test_svg_of_one_episode_is_the_golden_picture(tmp_path):
    out = tmp_path / "login.svg"
    result = run("show", LOGIN_BUG, "--svg", out)
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == GOLDEN.read_text(encoding="utf-8")
    assert "4 trees, 5 leaves" not in result.stdout  # the file is the output
    assert f"wrote {out}" in result.stderr


def test_svg_of_several_episodes_writes_one_file_each(tmp_path):
    out = tmp_path / "group.svg"
    result = run("show", LOGIN_GROUP, "--svg", out)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"group.login-bug-g{n}.svg" for n in range(4)]
    for path in tmp_path.iterdir():
        episode_id = path.name.split(".")[1]
        assert f'data-episode="{episode_id}"' in path.read_text(encoding="utf-8")


def test_episode_option_draws_just_that_one(tmp_path):
    out = tmp_path / "one.svg"
    result = run("show", LOGIN_GROUP, "--episode", "login-bug-g2", "--svg", out)
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["one.svg"]
    assert 'data-episode="login-bug-g2"' in out.read_text(encoding="utf-8")
    missing = run("show", LOGIN_GROUP, "--episode", "nope", "--svg", out)
    assert missing.exit_code == 1 and "no episode 'nope'" in missing.stderr


def test_html_page_has_a_section_per_episode(tmp_path):
    page = tmp_path / "all.html"
    result = run("show", LOGIN_BUG, LOGIN_GROUP, "--html", page)
    # the group's g0 and g2 hold login_bug's very calls: read twice, drawn once, said, exit 1
    assert result.exit_code == 1 and result.stderr.count("the same calls as episode") == 2
    text = page.read_text(encoding="utf-8")
    assert text.count('<section class="episode"') == 3
    assert text.count("<svg ") == 3
    for episode_id in ("login-bug-0001", "login-bug-g1", "login-bug-g3"):
        assert f'data-episode="{episode_id}"' in text
    assert 'data-episode="login-bug-g0"' not in text


def test_terminal_view_is_unchanged_without_files():
    result = run("show", LOGIN_BUG)
    assert result.exit_code == 0
    assert "4 trees, 5 leaves" in result.stdout and "leaf of row 4" in result.stdout


def test_unwritable_output_is_a_usage_error(tmp_path):
    result = run("show", LOGIN_BUG, "--svg", tmp_path / "missing" / "x.svg")
    assert result.exit_code == 2
    assert "cannot write" in result.stderr and "missing" in result.stderr


def test_file_names_keep_ids_readable_and_refuse_clashes(tmp_path):
    base = tmp_path / "pic.svg"
    assert svg_file_names(base, ["only/one"]) == [base]
    assert svg_file_names(base, ["run 1/a", "b"]) == [
        tmp_path / "pic.run_1_a.svg",
        tmp_path / "pic.b.svg",
    ]
    with pytest.raises(typer.Exit) as clash:
        svg_file_names(base, ["a/b", "a_b"])
    assert clash.value.exit_code == 2


def test_html_puts_a_group_side_by_side_with_rewards_and_advantages_per_seat(tmp_path):
    import callgrove as cg

    episodes = list(cg.load(LOGIN_GROUP))
    cg.finalize_group(cg.GRPO(), episodes)
    scored = tmp_path / "scored.jsonl"
    cg.save(scored, episodes)
    page = tmp_path / "group.html"
    assert run("show", scored, "-o", page).exit_code == 0
    text = page.read_text(encoding="utf-8")
    assert text.count('<section class="group" data-group="grp-login">') == 1
    assert text.count('<div class="side-by-side">') == 1
    assert "<th>seat leader</th>" in text and "advantage +" in text and "advantage -" in text
    assert "<h2>login-bug-g0</h2>" not in text  # the picture's own title is the only one
    assert '<output id="callgrove-status" data-state="loading" hidden>' in text
