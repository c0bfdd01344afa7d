"""The exit status through the real command line: 0 when all went through, 2 for what a
command was given and cannot use, 1 for work that failed; each error one line on stderr."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from callgrove.cli import app

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_success_exits_0(tmp_path: Path):
    result = run("synth", "-o", tmp_path / "episodes.jsonl")
    assert result.exit_code == 0, result.output
    assert not error_lines(result.stderr)


def test_a_config_that_cannot_be_used_exits_2_naming_it(tmp_path: Path):
    config = tmp_path / "run.toml"
    config.write_text("[nosuch]\nkey = 1\n")
    result = run("train", config)
    assert result.exit_code == 2, result.output
    assert error_lines(result.stderr) == [f"error: {config}: nosuch: unknown key"]
    assert not (tmp_path / "runs").exists()


def test_an_option_that_cannot_be_used_exits_2(tmp_path: Path):
    episodes = tmp_path / "episodes.jsonl"
    assert run("synth", "-o", episodes).exit_code == 0
    result = run("samples", episodes, "-o", tmp_path / "samples.parquet", "--scope", "episode")
    assert result.exit_code == 2, result.output
    [line] = error_lines(result.stderr)
    assert "--scope goes with --algorithm" in line
    assert not (tmp_path / "samples.parquet").exists()


def test_work_that_fails_exits_1_saying_why():
    with socket.socket() as unused:  # a port where nothing answers
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = run("close", "ep-1", "--gateway", f"http://127.0.0.1:{port}")
    assert result.exit_code == 1, result.output
    [line] = error_lines(result.stderr)
    assert "could not close episode 'ep-1'" in line and "did not answer" in line


def test_train_model_is_the_model_name_setting(tmp_path: Path):
    """`train --model NAME` is `--set model.name=NAME`: the same model, the same one-line error."""
    missing = "hf:/no/such/model"
    by_flag = run("train", "--model", missing, "-o", tmp_path / "a")
    by_setting = run("train", "--set", f"model.name={missing}", "-o", tmp_path / "b")
    assert by_flag.exit_code == by_setting.exit_code == 2, by_flag.output
    [line] = error_lines(by_flag.stderr)
    assert line == error_lines(by_setting.stderr)[0] and "neither a checkpoint folder" in line
