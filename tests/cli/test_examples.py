"""The bundled examples of each way in: callgrove's own files, a verifiers results folder and
NeMo Gym token captures, all written by the project's own writers and read by every command."""

from __future__ import annotations

import importlib.util
import itertools
import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.orchestrator.config import ConfigError, load_config, parse_override

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


def documented_train_commands() -> list[tuple[str, list[str]]]:
    """Every `callgrove train FILE ...` in the README's and the docs' fenced blocks: (where,
    arguments after `train`), continuation lines joined and comments dropped."""
    found = []
    root = EXAMPLES.parent
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        fenced = page.read_text().split("```")[1::2]  # the insides of the fences
        for line in "\n".join(fenced).replace("\\\n", " ").splitlines():
            if line.startswith("callgrove train "):
                words = shlex.split(line, comments=True)
                if (root / words[2]).is_file():
                    found.append((f"{page.name}: {line.strip()[:60]}", words[2:]))
    return found


def test_every_example_config_loads():
    configs = sorted(EXAMPLES.glob("*.toml"))
    assert len(configs) >= 3
    for config in configs:
        load_config(config)


def test_every_documented_train_command_loads_its_settings():
    """A setting that does not apply is an error, so a recipe written before a setting became
    strict would fail at once: load each documented command as the CLI would."""
    commands = documented_train_commands()
    assert any("smollm2_arithmetic" in words[0] for _, words in commands)
    for where, (config, *options) in commands:
        overrides = dict(
            parse_override(value) for flag, value in itertools.pairwise(options) if flag == "--set"
        )
        try:
            load_config(EXAMPLES.parent / config, overrides)
        except ConfigError as error:
            pytest.fail(f"{where}: {error}")
