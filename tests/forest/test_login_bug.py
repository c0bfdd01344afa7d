"""The login_bug example: 4 trees, 5 leaves, the table of rows in docs/episode-format.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from callgrove.episode import load
from callgrove.rows import build_rows, check_rows

from .builder import ids

EXAMPLE = Path(__file__).parents[2] / "examples" / "login_bug.jsonl"

SPEC_TABLE = [
    ("C4", "C2 C4", "C2 C4", ""),
    ("C6", "C5 C6", "C5 C6", ""),
    ("C9", "C1 C3 C7 C8 C9", "C8 C9", "C1 C3 C7"),
    ("C10", "C1 C3 C7 C10", "C1 C3 C7 C10", ""),
    ("C12", "C11 C12", "C11 C12", ""),
]


@pytest.fixture(scope="module")
def result():
    (episode,) = list(load(EXAMPLE))
    return build_rows(episode)


def test_trees_and_leaves(result):
    forest = result.forest
    assert ids(forest.calls[i] for i in forest.roots) == ["C1", "C2", "C5", "C11"]
    assert ids(forest.calls[i] for i in forest.leaves) == ["C4", "C6", "C9", "C10", "C12"]
    parent = {c.id: (p.id if (p := forest.parent_of(c)) else None) for c in forest.calls}
    assert parent == {
        "C1": None, "C2": None, "C3": "C1", "C4": "C2", "C5": None, "C6": "C5",
        "C7": "C3", "C8": "C7", "C9": "C8", "C10": "C7", "C11": None, "C12": "C11",
    }  # fmt: skip


def test_rows_match_the_spec_table(result):
    table = [
        (r.leaf.id, " ".join(ids(r.path)), " ".join(ids(r.trains)), " ".join(ids(r.context)))
        for r in result.rows
    ]
    assert table == SPEC_TABLE
    assert [r.index for r in result.rows] == [0, 1, 2, 3, 4]
    assert all(r.reward == 1.0 and r.duplicate_of is None for r in result.rows)


def test_masks_cover_exactly_the_trained_completions(result):
    row3 = result.rows[2]  # C9's row: C1 C3 C7 are context only
    c8, c9 = row3.path[3], row3.path[4]
    expected = np.zeros(row3.num_tokens, dtype=np.uint8)
    expected[c8.prompt_len : c8.full_len] = 1
    expected[c9.prompt_len : c9.full_len] = 1
    assert np.array_equal(result.loss_mask(row3), expected)
    assert result.num_loss_tokens(row3) == len(c8.completion_ids) + len(c9.completion_ids)
    lp = result.logprobs(row3)
    assert np.array_equal(lp[expected == 1], np.concatenate([c8.logprobs, c9.logprobs]))
    assert not lp[expected == 0].any()


def test_check_line(result):
    summary = check_rows(result)
    assert summary.ok, summary.violations
    assert summary.line() == "12 kept calls, each trained exactly once"
