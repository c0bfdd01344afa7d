"""Files written by the commands hold prompts compactly, each referencing its forest parent."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load
from callgrove.forest import build_forest

SESSION = (
    Path(__file__).parents[1]
    / "data/real/iansherr__claude-code-log/test/test_data/real_projects/-src-experiments-claude_p"
)


def test_imported_episodes_reference_forest_parents(tmp_path):
    out = tmp_path / "session.jsonl"
    result = CliRunner().invoke(app, ["import", "claude-code", str(SESSION), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (episode,) = list(load(out))
    forest = build_forest(episode)
    written = {
        call["id"]: call
        for line in out.read_bytes().splitlines()
        for agent in orjson.loads(line)["agents"]
        for call in agent["calls"]
    }
    with_parent = 0
    for call in forest.calls:
        parent = forest.parent_of(call)
        if parent is None:
            continue
        with_parent += 1
        assert written[call.id]["prompt_from"] == parent.id
        assert written[call.id]["prompt_from_len"] == parent.full_len
        assert "prompt_ids" not in written[call.id]
    assert with_parent >= 10
