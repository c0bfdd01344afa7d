"""The README's Python code runs as written, from a fresh directory holding the examples."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_the_readme_has_python_examples():
    assert BLOCKS


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_readme_python_block_runs(number, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[number], f"README.md python block {number + 1}", "exec"), {})
    assert capsys.readouterr().out.strip()
    assert (tmp_path / "scored.parquet").exists() or "save(" not in BLOCKS[number]
