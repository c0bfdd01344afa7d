"""The bundled examples of each way in: callgrove's own files, a verifiers results folder and
NeMo Gym token captures, all written by the project's own writers and read by every command."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app

EXAMPLES = Path(__file__).parents[2] / "examples"
runner = CliRunner()


def build(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("build_examples", EXAMPLES / "build_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(folder)


def test_the_foreign_examples_are_what_the_builder_writes(tmp_path):
    build(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    for name in made:
        if name.parts[0] in ("verifiers", "gym"):
            assert (EXAMPLES / name).read_bytes() == (tmp_path / name).read_bytes(), name
    assert {p.parts[0] for p in made} >= {"verifiers", "gym"}


@pytest.mark.parametrize("example", ["verifiers", "gym"])
def test_every_command_reads_the_foreign_examples(example):
    group = list(cg.load(EXAMPLES / "login_group.jsonl"))
    read = list(cg.load(EXAMPLES / example / ("traces.jsonl" if example == "verifiers" else "")))
    assert sorted(e.id for e in read) == sorted(e.id for e in group)
    calls = sorted(sum(len(a.calls) for a in e.agents) for e in read)
    assert calls == sorted(sum(len(a.calls) for a in e.agents) for e in group)
    for command in ("rows", "check", "show", "stats"):
        result = runner.invoke(app, [command, str(EXAMPLES / example)])
        assert result.exit_code == 0, (command, result.output)


def test_the_training_example_has_hierarchical_grpo_seats():
    config = tomllib.loads((EXAMPLES / "train.toml").read_text())
    assert config["algorithm"]["name"] == "hierarchical_grpo"
    assert config["algorithm"]["local_seats"] == ["helper"]
