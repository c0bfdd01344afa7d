"""The Python code of the README and of every docs page runs as written, from a fresh directory
holding the examples. A block fenced `python` runs; one fenced `python fragment` needs what no
test holds (a model and a tokenizer of the reader's own) and is shown only."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (page.relative_to(ROOT).as_posix(), number, code)
    for page in PAGES
    for number, code in enumerate(
        re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S), 1
    )
]


def test_the_readme_and_the_moved_pages_have_python_examples():
    pages = {page for page, _, _ in BLOCKS}
    assert {"README.md", "docs/trainers.md", "docs/training.md", "docs/models.md"} <= pages


@pytest.mark.parametrize(("page", "number", "code"), BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_python_block_runs(page, number, code, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} python block {number}", "exec"), {})
    assert capsys.readouterr().out.strip()
    assert (tmp_path / "scored.parquet").exists() or "save(" not in code
