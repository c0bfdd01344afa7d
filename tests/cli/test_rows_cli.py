"""`callgrove rows / check / show` as a user runs them: outputs, errors, exit statuses."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from callgrove.cli import app

EXAMPLES = Path(__file__).parents[2] / "examples"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def jsonl_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_rows_jsonl_is_the_spec_table():
    result = run("rows", str(EXAMPLES / "login_bug.jsonl"), "--json")
    assert result.exit_code == 0, result.output
    rows = jsonl_rows(result.stdout)
    assert [(r["row"], r["leaf"], r["path"], r["trains"], r["context"]) for r in rows] == [
        (0, "C4", ["C2", "C4"], ["C2", "C4"], []),
        (1, "C6", ["C5", "C6"], ["C5", "C6"], []),
        (2, "C9", ["C1", "C3", "C7", "C8", "C9"], ["C8", "C9"], ["C1", "C3", "C7"]),
        (3, "C10", ["C1", "C3", "C7", "C10"], ["C1", "C3", "C7", "C10"], []),
        (4, "C12", ["C11", "C12"], ["C11", "C12"], []),
    ]
    first = rows[0]
    assert set(first) == {
        "episode", "group", "row", "leaf", "agent", "path", "trains", "context",
        "num_tokens", "num_loss_tokens", "reward", "duplicate_of", "objective",
    }  # fmt: skip
    assert first["episode"] == "login-bug-0001" and first["agent"] == "B" and first["reward"] == 1.0
    assert first["group"] == "grp-login"


def test_rows_with_tokens_carries_tokens_mask_and_logprobs():
    result = run("rows", str(EXAMPLES / "login_bug.jsonl"), "--json", "--tokens")
    assert result.exit_code == 0
    for row in jsonl_rows(result.stdout):
        assert (
            len(row["token_ids"])
            == len(row["loss_mask"])
            == len(row["logprobs"])
            == row["num_tokens"]
        )
        assert sum(row["loss_mask"]) == row["num_loss_tokens"]
        assert all(
            lp == 0.0 for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if not m
        )
        assert all(lp < 0.0 for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m)


def test_rows_table_and_check_line():
    result = run("rows", str(EXAMPLES / "login_bug.jsonl"))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    header = next(line for line in lines if " path " in line)
    assert header.split() == [
        "row", "leaf", "agent", "path", "num_tokens", "num_loss_tokens", "reward",
    ]  # fmt: skip
    assert any(line.split() == ["2", "C9", "F", "(C1", "C3", "C7)", "C8", "C9", "62", "5", "1"]
               for line in lines)  # fmt: skip
    assert "check: 12 kept calls, each trained exactly once" in result.stdout


def test_rows_to_parquet_and_jsonl_files(tmp_path):
    parquet = tmp_path / "rows.parquet"
    assert run("rows", str(EXAMPLES / "login_group.jsonl"), "--out", str(parquet)).exit_code == 0
    table = pq.read_table(parquet)
    assert table.num_rows == 20
    assert table.column("token_ids").type.value_type.bit_width == 32
    assert [len(t) for t in table.column("token_ids").to_pylist()] == table.column(
        "num_tokens"
    ).to_pylist()
    out = tmp_path / "rows.jsonl"
    assert run("rows", str(EXAMPLES / "login_group.jsonl"), "--out", str(out)).exit_code == 0
    assert len(jsonl_rows(out.read_text())) == 20


def test_show_draws_the_trees_and_the_rows():
    result = run("show", str(EXAMPLES / "login_bug.jsonl"))
    assert result.exit_code == 0
    for expected in (
        "4 trees, 5 leaves",
        "C10",
        "compaction",
        "leaf of row 4",
        "each trained exactly once",
    ):
        assert expected in result.stdout
    missing = run("show", str(EXAMPLES / "login_bug.jsonl"), "--episode", "nope")
    assert missing.exit_code == 1


def _bad_file(tmp_path: Path, *, truncated_tail: bool) -> Path:
    good = (EXAMPLES / "login_group.jsonl").read_bytes().splitlines()
    broken = orjson.loads(good[1])
    broken["agents"][0]["calls"][1]["logprobs"] = [-0.1]  # wrong length
    lines = [good[0], orjson.dumps(broken), b"{not json", good[2]]
    body = b"\n".join(lines) + b"\n"
    if truncated_tail:
        body += good[3][:40]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(body)
    return path


def test_good_episodes_still_produce_rows_when_others_are_bad(tmp_path):
    path = _bad_file(tmp_path, truncated_tail=True)
    result = run("rows", str(path), "--json")
    assert result.exit_code == 1
    episodes = {r["episode"] for r in jsonl_rows(result.stdout)}
    assert episodes == {"login-bug-g0", "login-bug-g2"}
    errors = result.stderr
    assert f"{path}:2: episode login-bug-g1, call C3: logprobs has 1 values" in errors
    assert f"{path}:3: not valid JSON" in errors
    assert f"error: {path}:5: truncated final line" in errors  # cut inside the id
    assert "read: 2 episode(s) used" in errors
    assert "lost: 3 error(s) in the input (episodes not used)" in errors


def test_truncated_final_line_alone_fails_and_keeps_the_rest(tmp_path):
    good = (EXAMPLES / "login_group.jsonl").read_bytes()
    path = tmp_path / "crashed.jsonl"
    path.write_bytes(good[: len(good) - 100])
    result = run("rows", str(path), "--json")
    assert result.exit_code == 1  # an episode was lost
    assert len({r["episode"] for r in jsonl_rows(result.stdout)}) == 3
    assert f"error: {path}:4: episode login-bug-g3: truncated final line" in result.stderr


def test_check_command_summarises_and_fails_on_bad_input(tmp_path):
    ok = run("check", str(EXAMPLES / "login_group.jsonl"))
    assert (
        ok.exit_code == 0 and ok.stdout.count("each trained exactly once") == 4 + 1
    )  # and the total
    bad = run("check", str(_bad_file(tmp_path, truncated_tail=False)))
    assert bad.exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ("rows",),
        ("rows", "missing.jsonl"),
        ("rows", "--out", "rows.csv", "examples/login_bug.jsonl"),
        ("rows", "--nope", "x"),
        ("rows", "--tokens", "examples/login_bug.jsonl"),
    ],
)
def test_usage_errors_exit_2(args):
    assert run(*args).exit_code == 2
