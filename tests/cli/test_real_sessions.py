"""Real sessions read well: agents with hashed ids are named, row paths have a legend, rewards
that sit on the agents (verifiers traces) are shown as the rows have them, and a credit report
prints short."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.cli.rows import rows_table_view
from callgrove.cli.show import forest_view

EXAMPLES = Path(__file__).parents[2] / "examples"
runner = CliRunner()
EXPLORE = "a42c4e8f03d1b5912a7"
HELPERS = ("5c0375b4-57a5-4f26-b12d-d022ee4e51b7", "agent-9f2a11bb33cc0d")


def session(rewards_on_agents: bool = False) -> cg.Episode:
    """A leader with three subagents whose ids are hashes, as imported sessions have them."""
    leader = cg.Agent(id="main", name="leader")
    leader.add(cg.Call.make("C1", 1, [1, 2, 3], [4, 5], [-0.1, -0.2]))
    agents = [leader]
    for number, (agent_id, name) in enumerate(
        [(EXPLORE, "explore"), (HELPERS[0], "general-purpose"), (HELPERS[1], "general-purpose")]
    ):
        agent = cg.Agent(id=agent_id, name=name, parent="main", start="fresh")
        agent.add(cg.Call.make(f"S{number}", 2 + number, [9, 10 + number], [11], [-0.3]))
        agents.append(agent)
    if rewards_on_agents:
        for number, agent in enumerate(agents):
            agent.rewards = {"score": 1.0 if number % 2 == 0 else 0.5}
        return cg.Episode(id="s1", agents=agents)
    return cg.Episode(id="s1", agents=agents, rewards={"tests": 1.0})


def text_of(renderable, width: int = 160) -> str:
    console = Console(record=True, width=width, force_terminal=False)
    console.print(renderable)
    return console.export_text()


def test_hashed_agent_ids_are_shown_by_name_with_a_legend():
    table = text_of(rows_table_view(cg.build_rows(session())))
    rows = [line.split() for line in table.splitlines() if re.match(r"\s*\d+\s+\S+\s+\S+", line)]
    assert sorted(row[2] for row in rows if len(row) >= 6) == [
        "explore",
        "general-purpose#1",
        "general-purpose#2",
        "main",
    ]
    legend = " ".join(table.split())
    assert f"agents: explore = {EXPLORE}, general-purpose#1 = {HELPERS[0]}" in legend
    tree = text_of(forest_view(cg.build_rows(session())))
    assert "explore" in tree and EXPLORE not in tree and "general-purpose#2·general" in tree


def test_plain_ids_need_no_legend():
    table = text_of(rows_table_view(cg.build_rows(next(cg.load(EXAMPLES / "login_bug.jsonl")))))
    assert "agents:" not in table and "#N" not in table


def test_seq_paths_have_a_legend():
    episode = session()
    for number, call in enumerate(episode.calls()):
        call.id = f"toolu_{number}_01HV8S2ZQ4M6XWJ3K9PZBR7T5N"  # a harness's long call ids
    table = text_of(rows_table_view(cg.build_rows(episode), width=72), width=72)
    assert "#1" in table
    assert "#N: the call with seq N" in table


def test_rewards_on_agents_are_shown_as_the_rows_have_them(tmp_path):
    path = tmp_path / "s.jsonl"
    cg.save(path, [session(rewards_on_agents=True)])
    rows = [
        json.loads(line)
        for line in runner.invoke(app, ["rows", str(path), "--json"]).stdout.split("\n")
        if line
    ]
    assert sorted(r["reward"] for r in rows) == [0.5, 0.5, 1.0, 1.0]
    shown = runner.invoke(app, ["show", str(path)]).stdout
    assert (
        "rewards by agent: main 1, explore 0.5, general-purpose#1 1, general-purpose#2 0.5" in shown
    )
    assert "reward 0" not in shown
    [record] = [
        json.loads(line)
        for line in runner.invoke(app, ["show", str(path), "--json"]).stdout.splitlines()
    ]
    assert record["reward"] == 0.75
    stats = json.loads(runner.invoke(app, ["stats", str(path), "--json"]).stdout)
    assert stats["rewards"]["all"]["mean"] == 0.75


def test_a_credit_report_prints_short():
    episodes = list(cg.load(EXAMPLES / "login_group.jsonl"))
    report = cg.finalize_group(cg.GRPO(), episodes)
    assert (
        repr(report) == "GroupCredit(16 credits over 4 episodes, 48 calls assigned, 0 unassigned)"
    )
    assert str(report) == repr(report)
